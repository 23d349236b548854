import pytest
"""The organisers' interface as our stand-in prepare.py implements it (nbs/39_kit_prepare): the scorer's number against
`neuronfrontier eval --official`, the kit's token_bytes table, the kit lineage's forward."""
import json, os, subprocess, sys
from pathlib import Path

import torch

from neuronfrontier.run.checkpoint import save_model
from neuronfrontier.engine.config import CONFIGS
from neuronfrontier.data.shards import load_tokenizer, token_bytes_of
from neuronfrontier.engine.model import GPT
from neuronfrontier.submission import kit_prepare
from conftest import cli
from test_train import _trained_micro

STANDIN = Path(kit_prepare.__file__)


def _model(tmp_path) -> Path:
    "A cpu-micro checkpoint whose every weight is non-zero (at init some projections are zero)."
    return save_model(tmp_path / "final.pt", _trained_micro())


def test_official_eval_is_the_standin_scorers_number(pydocs, tmp_path):
    """The stand-in's evaluate_bpb, run beside a copy of itself as the organisers' prepare.py (in its own process, with
    only its environment), and `neuronfrontier eval --official` score the same checkpoint within 1e-4."""
    ck = _model(tmp_path)
    (tmp_path / "prepare.py").write_text(STANDIN.read_text())
    code = ("import json, torch; from prepare import evaluate_bpb, ensure_tokenizer; "
            "from neuronfrontier.run.checkpoint import load_for_eval; "
            f"m = load_for_eval({str(ck)!r}, torch.device('cpu')); "
            "print(json.dumps(evaluate_bpb(m, ensure_tokenizer(), 8, 256, torch.device('cpu'), split='public_val', "
            "max_tokens=16384, timeout_seconds=1200)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, NEURON_COMPETITION_R1_CACHE_DIR=str(pydocs)))
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    e = cli("eval", ck, "--data", pydocs, "--official", "--eval-tokens", "16384", "--eval-seq-len", "256")
    assert e.returncode == 0, e.stderr[-2000:]
    ours = float(e.stdout.split("val_bpb=")[1].split()[0])
    assert "the scorer's rows: 16,384 tokens" in e.stdout
    assert theirs["num_tokens"] == 16384 and abs(theirs["val_bpb"] - ours) < 1e-4, (theirs, ours)
    fast = cli("eval", ck, "--data", pydocs, "--eval-tokens", "16384", "--eval-seq-len", "256")
    assert "fast fixed evaluation" in fast.stdout   # the development number says what it is


def test_official_eval_refuses_more_tokens_than_the_shard_holds(pydocs, tmp_path):
    e = cli("eval", _model(tmp_path), "--data", pydocs, "--official")   # 20,971,520 tokens: far more than pydocs has
    assert e.returncode == 2 and e.stderr.count("\n") == 1 and "pass a smaller --eval-tokens" in e.stderr, e.stderr


def test_the_kits_token_bytes_rule(pydocs):
    """A token that holds part of a UTF-8 character decodes to U+FFFD: 3 bytes in the kit's table (a lone byte >= 0x80
    among them); our prepared tokenizer writes that table."""
    enc, tb = load_tokenizer(pydocs / "tokenizer")
    raw = token_bytes_of(enc, "raw")
    lone = enc.encode_single_token(bytes([0x80]))
    assert raw[lone] == 1 and tb[lone] == 3
    assert torch.equal(tb, token_bytes_of(enc, "kit"))
    assert ((tb != raw) <= (tb == 3)).all()


def test_the_kit_lineage_forward():
    "`model(idx, targets=None, reduction='mean')`: logits without targets, the loss with them, per token with 'none'."
    torch.manual_seed(0)
    m = GPT(CONFIGS["cpu-micro"]).eval()
    x = torch.randint(0, 8192, (2, 32), dtype=torch.int32)   # the kit's loader yields int32 inputs
    y = torch.randint(0, 8192, (2, 32))
    assert m(x).shape == (2, 32, CONFIGS["cpu-micro"].padded_vocab)
    per_token = m(x, targets=y, reduction="none")
    assert per_token.shape == (64,) and torch.allclose(per_token.mean(), m(x, y), atol=1e-6)


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_an_export_runs_as_the_organisers_run_it(pydocs, tmp_path):
    """The done-when of issue 35: a cpu-micro export with the stand-in prepare.py beside it, launched by its launch line
    (2 processes, no flags) after a 20 s start-up delay: out/final.pt written, every step boundary reported by every
    rank, the stand-in's budget trained counted from step 5 (the delay free, no overrun), and the printed val_bpb the
    stand-in's evaluate_bpb on load_for_eval(out/final.pt)."""
    d = tmp_path / "sub"
    r = cli("export", "--config", "cpu-micro", "--data", pydocs, "--out", d, "--set", "eval_tokens=16384")
    assert r.returncode == 0, r.stderr
    (d / "prepare.py").write_text(STANDIN.read_text())
    launch = (d / "launch.txt").read_text().split()
    assert launch[:3] == ["NEURON_LOGICAL_NC_CONFIG=1", "torchrun", "--standalone"] and launch[-1] == "train.py"
    log, budget = tmp_path / "steps.log", 20.0
    env = dict(os.environ, NEURON_COMPETITION_R1_CACHE_DIR=str(pydocs), NEURON_COMPETITION_R1_STEP_LOG=str(log),
               STANDIN_TRAIN_TIME_BUDGET_SECONDS=str(budget), NF_FAULT="startup-delay:20", PYTHONUNBUFFERED="1")
    env.pop("NF_DATA", None)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"],
                       cwd=d, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "the kit's prepare.py" in p.stdout.splitlines()[0]
    res = json.loads((d / "out" / "result.json").read_text())
    assert (d / "out" / "final.pt").is_file() and res["status"] == "completed" and res["budget_mode"] == "competition"
    assert res["data"] == "given rows (the kit's make_dataloader)" and res["tokenizer_sha256"] is None
    rows = [line.split() for line in log.read_text().splitlines()]
    for rank in ("0", "1"):
        assert [int(s) for r_, s, _ in rows if r_ == rank] == list(range(res["steps"])), rank
    stamps = [float(t) for r_, _, t in rows if r_ == "0"]
    after_step5 = stamps[-1] - stamps[4]   # the runner's charged clock: from the completion of step 5 (index 4)
    print(f"{res['steps']} steps; {after_step5:.1f} s after step 5 of a {budget:g} s budget; startup "
          f"{res.get('startup_s')} s; val_bpb {res['scorer']}")
    assert after_step5 <= budget and after_step5 >= budget - 5.0 - 3 * res["max_step_s"] - 2.0
    assert res["startup_s"] >= 20 and res["train_s"] <= budget - 5.0   # the 20 s delay: free, within the 900 s cap
    assert res["overrun_s"] == 0
    # the printed number is the stand-in scorer's on the checkpoint, recomputed here in a process of its own
    code = ("import json, torch; from prepare import evaluate_bpb, ensure_tokenizer; "
            "from train import load_for_eval; "
            "m = load_for_eval('out/final.pt', torch.device('cpu')); "
            "print(json.dumps(evaluate_bpb(m, ensure_tokenizer(), 8, 512, torch.device('cpu'), max_tokens=16384)))")
    q = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True, env=env)
    assert q.returncode == 0, q.stderr[-2000:]
    theirs = json.loads(q.stdout.strip().splitlines()[-1])["val_bpb"]
    printed = float(p.stdout.split("val_bpb=")[1].split()[0])
    assert abs(printed - theirs) < 1e-3, (printed, theirs)


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_a_kit_whose_loader_fails_falls_back_to_the_baked_shards(pydocs, tmp_path):
    "A prepare.py whose make_dataloader raises: train.py says so in a line, trains on the baked shards, and is scored."
    d = tmp_path / "sub"
    r = cli("export", "--config", "cpu-micro", "--data", pydocs, "--out", d, "--set", "eval_tokens=8192")
    assert r.returncode == 0, r.stderr
    broken = "\n\ndef make_dataloader(*args, **kwargs):\n    raise OSError('no shards on this host')\n"
    (d / "prepare.py").write_text(STANDIN.read_text() + broken)
    env = dict(os.environ, NEURON_COMPETITION_R1_CACHE_DIR=str(pydocs), PYTHONUNBUFFERED="1")
    env.pop("NF_DATA", None)
    p = subprocess.run([sys.executable, "train.py", "--steps", "3", "--device", "cpu"], cwd=d, capture_output=True,
                       text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "the kit's make_dataloader failed (OSError: no shards on this host)" in p.stdout
    res = json.loads((d / "out" / "result.json").read_text())
    assert res["data"] == str(pydocs) and res["scorer"]["val_bpb"] > 0
