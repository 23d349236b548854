"""Every printed prediction names its source, and a val_bpb is printed only for the recipe K82s4 ran (issue 49):
`info`, `plan`, the export README's note and every notebook's saved outputs."""
import json
from functools import cache

import pytest
from conftest import ROOT, cli

BANNED = "predicted from public chip measurements"
NO_BPB = "val_bpb: no public measurement of this recipe"
MOVED = "K82s4's measured 0.9614 moved by the predicted step count"


@cache
def _run(*args) -> str:
    r = cli(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _prediction_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "steps (" in line and "charged 30 min" in line]


def test_info_default_backs_its_val_bpb_and_names_every_source():
    out = _run("info", "--config", "trn2-124m")
    assert BANNED not in out
    torch_, ours = _prediction_lines(out)
    assert "val_bpb 0.9" in torch_ and MOVED in torch_
    parity = json.loads((ROOT / "nbs/results/k82_parity.json").read_text())   # the committed parity result
    assert parity["summary"] in torch_ and parity["passed"]
    assert "fit of public PyTorch runs (4 step times: FrontierForge K59 ×3, PD ×1)" in torch_
    assert "roofline estimate through the fit of public PyTorch runs" in ours
    assert "no kernel of ours has run on a chip" in ours and MOVED in ours   # kernels keep K82s4's maths
    residual = next(line for line in out.splitlines() if "fit residual" in line)
    assert "K82s4 ran 2,388" in residual and "in-sample, not a validation" in residual


@pytest.mark.parametrize("args", [("--recipe", "frontier"), ("--set", "ema_every=0", "--set", "mlp_leak=0")])
def test_info_other_recipes_get_steps_only(args):
    out = _run("info", "--config", "trn2-124m", *args)
    assert BANNED not in out
    lines = _prediction_lines(out)
    assert len(lines) == 2 and all(NO_BPB in line and "val_bpb 0." not in line for line in lines), lines


def test_plan_names_its_step_source():
    out = _run("plan", "--budget", "4h")
    assert BANNED not in out
    lines = out.splitlines()
    assert lines[1].startswith("what the plan can back — step times from a fit of public trn2 PyTorch runs")
    assert "fit of public PyTorch runs (4 step times" in next(line for line in lines if "step time  " in line)


def test_export_readme_note_names_its_sources():
    from neuronfrontier.submission.shipping import prediction_note
    note = prediction_note("trn2-124m", None, [], 8, 1)
    assert BANNED not in note and MOVED in note and "fit residual" in note
    assert "no kernel of ours has run on a chip" in note
    other = prediction_note("trn2-124m", "frontier", [], 8, 1)
    assert BANNED not in other and other.count(NO_BPB) == 2


def test_no_notebook_output_calls_a_prediction_a_public_measurement():
    found = []
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            for out in cell.get("outputs", []):
                text = "".join(out.get("text", "")) + json.dumps(out.get("data", {}), ensure_ascii=False)
                if BANNED in text: found.append(f"{nb.name} cell {cell.get('id')}")
    assert not found, found
