import pytest
"Many machines (`--nnodes`, `--node-rank`, `--rdzv-endpoint`): two 'machines' of one process each on localhost."
import json, socket, subprocess, sys
from pathlib import Path

import torch
from conftest import cli
from neuronfrontier.run.checkpoint import load_for_eval
from neuronfrontier.cli import build_parser, torchrun_argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_gets_the_rendezvous_instead_of_standalone(tmp_path):
    a = build_parser().parse_args(["train", "--nproc", "8", "--nnodes", "2", "--node-rank", "1",
                                   "--rdzv-endpoint", "10.0.0.1:29500", "--fsdp"])
    argv = torchrun_argv(a, tmp_path)
    assert "--standalone" not in argv
    for flag in ("--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500",
                 "--nproc_per_node=8"):
        assert flag in argv, (flag, argv)
    one = torchrun_argv(build_parser().parse_args(["train", "--nproc", "2"]), tmp_path)
    assert "--standalone" in one and not any(x.startswith("--nnodes") for x in one)


def test_bad_machine_flags_fail_in_one_line(tmp_path, pydocs):
    for extra, why in ((["--nnodes", "2"], "--rdzv-endpoint HOST:PORT"),
                       (["--nnodes", "2", "--rdzv-endpoint", "localhost"], "--rdzv-endpoint HOST:PORT"),
                       (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "localhost:1234"], "--node-rank 2"),
                       (["--nnodes", "0"], "--nnodes 0"),
                       (["--fsdp"], "--fsdp shards over processes")):
        r = cli("train", "--config", "cpu-micro", "--steps", "1", "--data", pydocs, "--out", tmp_path / "x", *extra)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and why in r.stderr, (extra, r.stderr)
    assert not (tmp_path / "x").exists()
    r = cli("sweep", "--config", "cpu-micro", "--steps", "1", "--grid", "seed=0", "--fsdp", "--out", tmp_path / "s")
    assert r.returncode == 2 and "do not apply to sweep" in r.stderr, r.stderr


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_two_machines_on_localhost_train_and_checkpoint(pydocs, tmp_path):
    "The same command on two 'machines' (two launchers of one process each, one c10d rendezvous): one 2-rank job."
    out, port = tmp_path / "run", _free_port()
    exe = Path(sys.executable).parent / "neuronfrontier"
    procs = [subprocess.Popen([str(exe), "train", "--config", "cpu-micro", "--steps", "4", "--nproc", "1",
                               "--nnodes", "2", "--node-rank", str(r), "--rdzv-endpoint", f"127.0.0.1:{port}",
                               "--data", str(pydocs), "--out", str(out), "--set", "batch_size=1",
                               "--set", "eval_tokens=8192", "--quiet"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (so, se) in zip(procs, outs): assert p.returncode == 0, se[-3000:]
    assert sum(so.count("val_bpb=") for so, _ in outs) == 1   # the machine with global rank 0 prints the result
    res = json.loads((out / "result.json").read_text())
    assert (res["status"], res["steps"], res["world_size"], res["global_batch"]) == ("completed", 4, 2, 2)
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["world_size"] == 2
    model = load_for_eval(str(out / "final.pt"), torch.device("cpu"))   # one consolidated checkpoint
    assert model(torch.zeros(1, 8, dtype=torch.long)).shape[:2] == (1, 8)
    assert (out / "resume.pt").exists()
