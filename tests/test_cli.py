"End-to-end tests of the `neuronfrontier` command line."
import json
import pyarrow as pa, pyarrow.parquet as pq
import pytest
from conftest import cli

FAST = ["--set", "eval_tokens=8192", "--quiet"]


def test_speedrun_prints_val_bpb_and_writes_run_dir(pydocs, tmp_path):
    out = tmp_path / "run"
    r = cli("speedrun", "--config", "cpu-micro", "--steps", "5", "--data", pydocs, "--out", out, *FAST)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("val_bpb=") and 0 < float(last.split("=")[1]) < 20
    res = json.loads((out / "result.json").read_text())
    for k in ("val_bpb", "steps", "tokens", "train_s", "warmup_s", "eval_s", "overrun_s", "status", "config"):
        assert k in res
    assert res["steps"] == 5 and res["status"] == "completed"
    assert res["tokens"] == 5 * 8 * 128
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    assert {"step", "time_s", "loss", "lr_mult", "tokens", "tok_s", "mfu"} <= set(recs[0])
    # the checkpoint scores the same through `eval` (the competition's load_for_eval path)
    e = cli("eval", out / "model.pt", "--data", pydocs)
    assert e.returncode == 0, e.stderr
    assert abs(float(e.stdout.strip().split("=")[1]) - res["val_bpb"]) < 5e-5


def test_same_seed_same_losses(pydocs, tmp_path):
    losses = []
    for i in range(2):
        r = cli("train", "--config", "cpu-micro", "--steps", "20", "--seed", "3", "--data", pydocs, "--out", tmp_path / f"r{i}", *FAST)
        assert r.returncode == 0, r.stderr
        losses.append([json.loads(l)["loss"] for l in (tmp_path / f"r{i}" / "metrics.jsonl").read_text().splitlines()])
    assert len(losses[0]) == 20 and losses[0] == losses[1]


def test_budget_run_never_overruns_by_more_than_a_step(pydocs, tmp_path):
    r = cli("train", "--config", "cpu-micro", "--budget", "4", "--data", pydocs, "--out", tmp_path / "b", *FAST)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "b" / "result.json").read_text())
    assert res["train_s"] <= 4 + res["max_step_s"] and res["overrun_s"] <= res["max_step_s"]


def _corrupt(tmp_path, pydocs):
    import shutil
    d = tmp_path / "corrupt"; shutil.copytree(pydocs, d)
    (d / "shard_00003.parquet").write_bytes(b"PAR1 garbage")
    return d


@pytest.mark.parametrize("args,expect", [
    (["speedrun", "--config", "gpt-9000"], "unknown config 'gpt-9000'"),
    (["train", "--set", "d_model=700"], "d_model=700 is not a multiple of 128; nearest aligned values: 640 or 768"),
    (["train", "--set", "n_heads=3"], "n_heads*d_head=192 is not a multiple of 128"),
    (["train", "--data", "{tmp}/missing"], "does not exist; run `neuronfrontier prepare"),
    (["train", "--data", "{corrupt}"], "is not a readable parquet file"),
    (["speedrun", "--budget", "0"], "--budget 0: must be > 0"),
    (["train", "--budget", "-5"], "--budget -5: must be > 0"),
    (["train", "--steps", "0", "--data", "{pydocs}"], "--steps 0: must be > 0"),
    (["train", "--set", "lr"], "expected key=value"),
    (["train", "--device", "tpu", "--data", "{pydocs}"], "unknown device"),
    (["eval", "{tmp}/nope.pt"], "does not exist"),
])
def test_user_errors_are_one_line_exit_2(args, expect, pydocs, tmp_path):
    subst = {"tmp": tmp_path, "pydocs": pydocs}
    if any("{corrupt}" in a for a in args): subst["corrupt"] = _corrupt(tmp_path, pydocs)
    r = cli(*[a.format(**subst) for a in args])
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert expect in r.stderr, r.stderr


def test_prepare_climbmix_from_local_mirror(tmp_path):
    srv = tmp_path / "mirror"; srv.mkdir()
    words = "the quick brown fox jumps over the lazy dog while numbers 12345 and 678 pass by".split()
    for i in (0, 6542):
        docs = [" ".join(words[(j + k) % len(words)] for k in range(40)) + f" doc {i} {j}" for j in range(400)]
        pq.write_table(pa.table({"text": docs}), srv / f"shard_{i:05d}.parquet")
    r = cli("prepare", "--source", "climbmix", "--shards", "1", "--base-url", srv, "--data", tmp_path / "cm")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "cm").iterdir())
    assert names == ["shard_00000.parquet", "shard_06542.parquet", "tokenizer"]
    # a second prepare downloads nothing and succeeds
    r2 = cli("prepare", "--source", "climbmix", "--shards", "1", "--base-url", srv, "--data", tmp_path / "cm")
    assert r2.returncode == 0 and "downloading" not in r2.stdout


def test_info_lists_presets():
    r = cli("info")
    assert r.returncode == 0
    for name in ("dense-124m", "cpu-tiny", "cpu-micro"): assert name in r.stdout


def test_ctrl_c_saves_checkpoint_and_reports_interrupted(pydocs, tmp_path):
    import os, signal, subprocess, sys, time
    from pathlib import Path
    exe = Path(sys.executable).parent / "neuronfrontier"
    out = tmp_path / "int"
    p = subprocess.Popen([str(exe), "train", "--config", "cpu-micro", "--budget", "120", "--data", str(pydocs),
                          "--out", str(out), "--set", "log_every=1", *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130, (p.returncode, stderr)
    res = json.loads((out / "result.json").read_text())
    assert res["status"] == "interrupted" and res["steps"] >= 2 and (out / "model.pt").exists()
    assert res["train_s"] < 120
    # and it resumes from there
    r = cli("train", "--config", "cpu-micro", "--steps", str(res["steps"] + 2), "--data", pydocs, "--out", out, "--resume", *FAST)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "result.json").read_text())["steps"] == res["steps"] + 2
