"`train --nproc 2 --ep 2`: MoE experts shared out over two gloo processes, against one process on the same global batch."
import json, os, signal, subprocess, sys, time
from pathlib import Path

import pytest
import torch
from conftest import cli

# cpu-tiny-moe shrunk to run in seconds. capacity_factor=4 keeps both runs free of drops (one process: 256 tokens
# → 256 rows per expert; two: 128 tokens each → 128 rows), so they route every token alike; aux_loss_coef=0 because
# the load-balancing loss is a product of batch means (each rank's own batch under data parallelism, as in DDP), which
# differs from the whole batch's — the z-loss is a mean over tokens and stays on.
SMALL = ["--set", "d_model=128", "--set", "n_layers=2", "--set", "n_heads=2", "--set", "d_expert=128", "--set", "seq_len=128",
         "--set", "eval_seq_len=128", "--set", "capacity_factor=4", "--set", "aux_loss_coef=0", "--set", "eval_tokens=4096",
         "--set", "data_sharding=global", "--quiet"]   # data_sharding=global: the rows of one process, split over the ranks
STEPS = 10


def _losses(run_dir):
    return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


# three processes of training and evaluation: 15 s on a quiet 2-core CPU, ~5 min under load 8 (measured on CPU)
def test_expert_parallel_training_matches_one_process(pydocs, tmp_path):
    runs = {}
    for nproc, extra in ((1, []), (2, ["--ep", "2"])):
        out = tmp_path / f"n{nproc}"
        r = cli("train", "--config", "cpu-tiny-moe", "--steps", STEPS, "--nproc", nproc, *extra, "--data", pydocs, "--out", out,
                "--set", f"batch_size={2 // nproc}", *SMALL)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        runs[nproc] = out
    l1, l2 = _losses(runs[1]), _losses(runs[2])
    worst = max(abs(a - b) / a for a, b in zip(l1, l2))
    res1, res2 = (json.loads((runs[n] / "result.json").read_text()) for n in (1, 2))
    print(f"1 process vs 2 with --ep 2, {STEPS} steps: worst relative loss difference {worst:.2e}; "
          f"val_bpb {res1['val_bpb']:.6f} vs {res2['val_bpb']:.6f}")
    assert len(l1) == len(l2) == STEPS and worst < 2e-3, (l1, l2)
    assert (res2["config"]["train"]["ep"], res2["world_size"], res2["tokens"]) == (2, 2, res1["tokens"])
    assert abs(res1["val_bpb"] - res2["val_bpb"]) < 2e-3 * res1["val_bpb"]   # final.pt holds all the experts again


def _ep_args(pydocs, out, steps=STEPS):
    return ["train", "--config", "cpu-tiny-moe", "--steps", steps, "--nproc", 2, "--ep", 2, "--data", pydocs, "--out", out,
            "--set", "batch_size=1", *SMALL]


@pytest.mark.slow   # four 2-process runs of training and evaluation: 43 s on a quiet 2-core CPU (measured on CPU)
def test_expert_parallel_run_checkpoints_consolidated_and_resumes(pydocs, tmp_path):
    """SIGTERM an --ep 2 run that checkpoints after every step; --resume continues it bit for bit; its final.pt and
    resume.pt hold every expert (as one process would), so one process without --ep resumes from them too."""
    straight = tmp_path / "straight"
    r = cli(*_ep_args(pydocs, straight))
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "stopped"
    exe = Path(sys.executable).parent / "neuronfrontier"
    p = subprocess.Popen([str(exe), *map(str, _ep_args(pydocs, out)), "--ckpt-every", "0.01"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.time() + 600
    while p.poll() is None and time.time() < deadline and not (
            (out / "resume.pt").exists() and (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 3):
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 130, (p.returncode, err[-3000:])
    ck = torch.load(out / "resume.pt", weights_only=True)
    done = ck["state"]["step"]
    assert 1 <= done < STEPS, done
    w = ck["model"]["blocks.0.mlp.w_gate"]
    assert w.shape[0] == 8 and torch.load(out / "final.pt", weights_only=True)["model"]["blocks.0.mlp.w_gate"].shape == w.shape
    one = tmp_path / "one"   # the same checkpoint, resumed by one process on the same global batch
    one.mkdir(); [(one / f).write_bytes((out / f).read_bytes()) for f in ("resume.pt", "final.pt", "metrics.jsonl")]
    r = cli(*_ep_args(pydocs, out), "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    resumed, ref = _losses(out), _losses(straight)
    print(f"--ep 2 stopped with a checkpoint at step {done}; resumed losses {resumed[done:done + 3]} ... straight {ref[done:done + 3]} ...")
    assert resumed == ref   # bit for bit: gathering the experts and cutting them again loses nothing
    r = cli("train", "--config", "cpu-tiny-moe", "--steps", STEPS, "--data", pydocs, "--out", one, "--resume", "--set", "batch_size=2", *SMALL)
    assert r.returncode == 0, r.stderr[-3000:]
    l1 = _losses(one)
    worst = max(abs(a - b) / b for a, b in zip(l1[done:], ref[done:]))
    print(f"one process resumed from the --ep 2 checkpoint: worst relative loss difference {worst:.2e}")
    assert len(l1) == STEPS and worst < 2e-3


@pytest.mark.parametrize("args, msg", [
    (["--config", "cpu-tiny-moe", "--nproc", "2", "--ep", "3"], "--ep 3 does not divide --nproc 2"),
    (["--config", "cpu-tiny-moe", "--nproc", "3", "--ep", "3"], "n_experts=8 is not divisible by 3"),
    (["--config", "cpu-tiny", "--nproc", "2", "--ep", "2"], "cpu-tiny is dense (n_experts=0)"),
    (["--config", "cpu-tiny-moe", "--nproc", "2", "--ep", "0"], "--ep 0: must be >= 1"),
    (["--config", "cpu-tiny-moe", "--nproc", "2", "--ep", "2", "--set", "capacity_factor=none"], "dropless routing"),
])
def test_bad_ep_is_one_line_exit_2(pydocs, tmp_path, args, msg):
    r = cli("train", *args, "--steps", "1", "--data", pydocs, "--out", tmp_path / "x")
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "x").exists()
