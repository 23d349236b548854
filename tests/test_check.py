"""`neuronfrontier check` of a submission this package did not write (issue 41), and the kit run: the launch line with
no flags beside our stand-in prepare.py, as the organisers run it (nbs/97_contract)."""
import os, shutil, subprocess, sys
from pathlib import Path

import pytest

from neuronfrontier.submission import contract as C
from neuronfrontier.submission import kit_prepare
from conftest import cli

LAUNCH = "NEURON_LOGICAL_NC_CONFIG=1 torchrun --standalone --nproc_per_node=8 train.py\n"

# A minimal valid submission, written by hand: an embedding, a causal running mean, a linear head; it trains on the
# kit's loader, reports each step boundary, stops inside the kit's budget counted from step 5 and writes out/final.pt
KIT_IMPORT = """from prepare import (TRAIN_TIME_BUDGET_SECONDS, TRAIN_STARTUP_STEPS_EXCLUDED, TOKENIZER_VOCAB_SIZE,
                     ensure_tokenizer, evaluate_bpb, get_dist_info, make_dataloader, print0, record_step_boundary)"""
HAND = '''"""A hand-written submission."""
import os, time
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
''' + KIT_IMPORT + '''


class Tiny(nn.Module):
    def __init__(self, vocab=TOKENIZER_VOCAB_SIZE, d=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, targets=None, reduction="mean"):
        h = self.emb(idx)
        h = h.cumsum(1) / torch.arange(1, idx.shape[1] + 1, device=idx.device)[:, None]  # MIX
        logits = self.head(h)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)


def load_for_eval(checkpoint_path, device):
    model = Tiny()
    model.load_state_dict(torch.load(checkpoint_path, map_location="cpu"))
    return model.to(device).eval()  # LOADED


if __name__ == "__main__":
    ddp, rank, _, world = get_dist_info()
    if ddp:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model, tok = Tiny(), ensure_tokenizer()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = make_dataloader(tok, 4, 128, "train")
    step, start = 0, None
    while True:
        x, y, _ = next(loader)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            if ddp:
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        record_step_boundary(step)  # BOUNDARY
        step += 1
        if step == TRAIN_STARTUP_STEPS_EXCLUDED:
            start = time.time()
        done = torch.tensor(float(start is not None and time.time() - start > TRAIN_TIME_BUDGET_SECONDS - 5))
        if ddp:
            dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done:
            break
    if rank == 0:
        os.makedirs("out", exist_ok=True)
        torch.save(model.state_dict(), "out/final.pt")
    if ddp:
        dist.barrier()
    res = evaluate_bpb(load_for_eval("out/final.pt", torch.device("cpu")), tok, 8, 128, torch.device("cpu"))
    print0(f"val_bpb {res['val_bpb']:.4f}")
    if ddp:
        dist.barrier()  # no rank leaves while another still runs a collective
        dist.destroy_process_group()
        # A gloo worker thread can still be releasing a collective's tensor when the interpreter finalizes: it then
        # needs the GIL and aborts the rank (std::terminate; 2 of 36 kit runs under load). Leave without finalizing.
        import sys
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
'''


def _write(d: Path, src: str = HAND, launch: str = LAUNCH) -> Path:
    d.mkdir(parents=True)
    (d / "train.py").write_text(src)
    (d / "launch.txt").write_text(launch)
    return d


@pytest.fixture(scope="module")
def untrained(pydocs, tmp_path_factory) -> Path:
    "A checkpoint of the hand-written model at its initialisation (its running mean already sees the context)."
    d = tmp_path_factory.mktemp("hand_ck")
    _write(d / "sub")
    shutil.copyfile(kit_prepare.__file__, d / "sub" / "prepare.py")
    code = "import torch; from train import Tiny; torch.manual_seed(0); torch.save(Tiny().state_dict(), 'ck.pt')"
    r = subprocess.run([sys.executable, "-c", code], cwd=d / "sub", capture_output=True, text=True,
                       env=dict(os.environ, NEURON_COMPETITION_R1_CACHE_DIR=str(pydocs)))
    assert r.returncode == 0, r.stderr
    return d / "sub" / "ck.pt"


def test_a_hand_written_submission_passes_check(pydocs, tmp_path):
    """Exit 0: the kit run trains it beside the stand-in and its checkpoint passes every model row; the rehearsal,
    which drives an export's internals, says n/a with the reason; the submission's directory gains nothing."""
    d = _write(tmp_path / "hand")
    r = cli("check", d, "--data", pydocs, "--tokenizer", pydocs / "tokenizer")
    print(r.stdout)
    assert r.returncode == 0 and "11/11 passed (1 n/a)" in r.stdout, r.stdout + r.stderr
    assert "rehearsal          n/a     n/a: not an export of this package" in r.stdout
    assert "kit run            pass    " in r.stdout and "it printed val_bpb" in r.stdout
    assert sorted(p.name for p in d.iterdir()) == ["launch.txt", "train.py"]


BROKEN = {   # each kind of breakage, as an edit of the hand-written train.py or its launch line, and the row it fails
    "non-causal mix": ("h = h.cumsum(1)", "h = h.mean(1, keepdim=True).expand_as(h) + 0 * h.cumsum(1)", "causal"),
    "batch-dependent mix": ("  # MIX", "  # MIX\n        h = h - h.mean(0, keepdim=True)", "batch independent"),
    "forward hook": ("    return model.to(device).eval()  # LOADED",
                     "    model.head.register_forward_hook(lambda m, a, o: None)\n    return model.to(device).eval()",
                     "no hooks"),
    "forbidden import": ("import os, time", "import os, time\nimport fastcore", "imports"),
    "bad launch line": ("", "NEURON_LOGICAL_NC_CONFIG=1 torchrun --standalone --nproc_per_node=8 train.py --lr 3e-3",
                        "launch"),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_each_broken_kind_fails_its_own_row(pydocs, untrained, tmp_path, kind):
    old, new, row = BROKEN[kind]
    assert old in HAND
    d = _write(tmp_path / "sub", launch=new) if row == "launch" else _write(tmp_path / "sub", HAND.replace(old, new))
    rows = C.check(d, checkpoint=untrained, data=pydocs, tokenizer=pydocs / "tokenizer", kit=False)
    print(C.check_table(rows))
    failed = [n for n, ok, _ in rows if not (ok is True or ok == C.NA)]
    assert failed == [row], failed
    assert dict((n, ok) for n, ok, _ in rows)["rehearsal"] == C.NA


def test_without_prepare_the_kit_run_is_na_and_a_checkpoint_is_needed(pydocs, untrained, tmp_path):
    "A train.py that does not import prepare cannot run as the organisers run it here: n/a, and --checkpoint probes it."
    src = HAND.split('\n\nif __name__ == "__main__":')[0].replace(KIT_IMPORT, "TOKENIZER_VOCAB_SIZE = 8192")
    d = _write(tmp_path / "sub", src)
    assert not C._imports_kit(src)
    rows = {n: (ok, why) for n, ok, why in C.check(d, data=pydocs, tokenizer=pydocs / "tokenizer")}
    assert rows["kit run"][0] == C.NA and "does not import the kit's prepare.py" in rows["kit run"][1]
    assert rows["load_for_eval"][0] is False and "pass --checkpoint" in rows["load_for_eval"][1]
    rows = C.check(d, checkpoint=untrained, data=pydocs, tokenizer=pydocs / "tokenizer")
    assert C.check_passed(rows) and "10/10 passed (2 n/a)" in C.check_table(rows), C.check_table(rows)


RUNNER = {   # a run that breaks the runner's rules, and what the kit run says
    "no step boundaries": ("record_step_boundary(step)  # BOUNDARY", "pass", "no step boundary reported"),
    "another checkpoint name": ('"out/final.pt")\n    if ddp', '"out/model.pt")\n    if ddp', "without out/final.pt"),
    "past the budget": ("TRAIN_TIME_BUDGET_SECONDS - 5", "TRAIN_TIME_BUDGET_SECONDS + 3", "past the budget"),
}


@pytest.mark.parametrize("kind", list(RUNNER))
def test_the_kit_run_fails_a_run_that_breaks_the_runners_rules(pydocs, tmp_path, monkeypatch, kind):
    old, new, why = RUNNER[kind]
    assert old in HAND
    src = HAND.replace(old, new)
    if kind == "another checkpoint name": src = src.replace('load_for_eval("out/final.pt"', 'load_for_eval("out/model.pt"')
    d = _write(tmp_path / "sub", src)
    monkeypatch.setattr(C, "KIT_RUN_BUDGET_S", 8.0)
    ok, reason, ck = C.kit_run(d, pydocs, pydocs / "tokenizer", tmp_path / "work")
    print(kind, "->", reason)
    assert ok is False and why in reason
