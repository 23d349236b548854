"End-to-end tests of the `neuronfrontier` command line."
import json, math, shutil
import numpy as np
import pyarrow as pa, pyarrow.parquet as pq
import pytest
import torch
from conftest import cli
from neuronfrontier.data.shards import find_shards, load_tokenizer, val_batches, tokenizer_sha256, read_manifest

FAST = ["--set", "eval_tokens=8192", "--quiet"]


def _uniform_bpb(pydocs, eval_tokens=8192, seq_len=512):
    "bpb of the uniform prediction (ln V nats per counted target) on the run's evaluation tokens."
    enc, tb = load_tokenizer(pydocs / "tokenizer")
    ys = torch.cat([y.flatten() for _, y in val_batches(find_shards(pydocs)[1], enc, seq_len, eval_tokens, 8)])
    nbytes = tb[ys].double()
    return math.log2(enc.n_vocab) * (nbytes > 0).sum().item() / nbytes.sum().item()


def test_speedrun_prints_val_bpb_and_writes_run_dir(pydocs, tmp_path):
    out = tmp_path / "run"
    r = cli("speedrun", "--config", "cpu-micro", "--steps", "10", "--data", pydocs, "--out", out, *FAST)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    res = json.loads((out / "result.json").read_text())
    assert last == f"val_bpb={res['val_bpb']:.4f}"
    assert f"val_bpb  {res['val_bpb']:.4f}  (unigram baseline {res['unigram_bpb']:.4f}" in r.stdout   # the table
    # 10 steps of the default recipe learn something: clearly better than predicting uniformly (measured: 8% better)
    assert res["val_bpb"] < 0.97 * _uniform_bpb(pydocs), (res["val_bpb"], _uniform_bpb(pydocs))
    for k in ("val_bpb", "steps", "tokens", "train_s", "warmup_s", "eval_s", "overrun_s", "status", "config", "tokenizer_sha256"):
        assert k in res
    assert res["steps"] == 10 and res["status"] == "completed"
    assert res["tokens"] == 10 * 2 * 512
    assert res["config"]["train"]["optim"] == "muon" and res["config"]["model"]["qk_norm"]  # the default is the frontier recipe
    assert res["tokenizer_sha256"] == tokenizer_sha256(pydocs / "tokenizer") == read_manifest(pydocs / "tokenizer")["sha256"]
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, 11))
    assert {"step", "time_s", "loss", "lr_mult", "tokens", "tok_s", "mfu"} <= set(recs[0])
    # the checkpoint scores the same through `eval` (the competition's load_for_eval path)
    e = cli("eval", out / "final.pt", "--data", pydocs)
    assert e.returncode == 0, e.stderr
    assert abs(float(e.stdout.strip().split("val_bpb=")[1]) - res["val_bpb"]) < 5e-5


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
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
    (["train", "--set", "n_heads=3", "--set", "d_head=64"], "n_heads*d_head=192 is not a multiple of 128"),
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


def _mirror(tmp_path):
    srv = tmp_path / "mirror"; srv.mkdir()
    words = "the quick brown fox jumps over the lazy dog while numbers 12345 and 678 pass by".split()
    for i in (0, 6542):
        docs = [" ".join(words[(j + k) % len(words)] for k in range(40)) + f" doc {i} {j}" for j in range(400)]
        pq.write_table(pa.table({"text": docs}), srv / f"shard_{i:05d}.parquet")
    return srv


def _kit(pydocs, tmp_path):
    "A stand-in for the kit's tokenizer files: a valid 8,192-token BPE (ours) in its own directory, without sha256.json."
    kit = tmp_path / "kit"; kit.mkdir()
    for n in ("tokenizer.pkl", "token_bytes.pt"): shutil.copy(pydocs / "tokenizer" / n, kit / n)
    return kit


def test_prepare_climbmix_from_local_mirror_with_the_kit_tokenizer(pydocs, tmp_path):
    srv, kit, cm = _mirror(tmp_path), _kit(pydocs, tmp_path), tmp_path / "cm"
    r = cli("prepare", "--source", "climbmix", "--shards", "1", "--base-url", srv, "--data", cm, "--tokenizer-dir", kit)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in cm.iterdir())
    assert names == ["shard_00000.parquet", "shard_06542.parquet", "tokenizer"]
    for n in ("tokenizer.pkl", "token_bytes.pt"): assert (cm / "tokenizer" / n).read_bytes() == (kit / n).read_bytes()
    assert read_manifest(cm / "tokenizer") == {"source": "kit", "sha256": tokenizer_sha256(kit)}
    # a second prepare downloads nothing, needs no flag (the kit's tokenizer is recorded) and succeeds
    r2 = cli("prepare", "--source", "climbmix", "--shards", "1", "--base-url", srv, "--data", cm)
    assert r2.returncode == 0 and "downloading" not in r2.stdout, r2.stderr
    # a run records the tokenizer's hashes
    r3 = cli("train", "--config", "cpu-micro", "--steps", "1", "--data", cm, "--out", tmp_path / "run", "--set", "eval_tokens=4096", "--quiet")
    assert r3.returncode == 0, r3.stderr
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["tokenizer_sha256"] == tokenizer_sha256(kit) and res["tokenizer_source"] == "kit"


def test_prepare_climbmix_needs_the_kit_tokenizer(pydocs, tmp_path):
    srv, cm = _mirror(tmp_path), tmp_path / "cm"
    r = cli("prepare", "--source", "climbmix", "--shards", "1", "--base-url", srv, "--data", cm)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "needs the kit's tokenizer: pass --tokenizer-dir DIR" in r.stderr
    assert not cm.exists()  # refused before downloading anything
    # our own BPE only when asked, with a warning
    r = cli("prepare", "--source", "climbmix", "--shards", "1", "--base-url", srv, "--data", cm, "--train-tokenizer")
    assert r.returncode == 0, r.stderr
    assert "warning: ClimbMix with a tokenizer other than the kit's" in r.stderr
    assert read_manifest(cm / "tokenizer")["source"] == "trained"
    # ... and that tokenizer is not mistaken for the kit's afterwards
    r = cli("prepare", "--source", "climbmix", "--shards", "1", "--base-url", srv, "--data", cm)
    assert r.returncode == 2 and "not the kit's" in r.stderr, r.stderr


def test_prepare_climbmix_refuses_a_bad_kit_dir(pydocs, tmp_path):
    srv, kit = _mirror(tmp_path), _kit(pydocs, tmp_path)
    tb = torch.load(kit / "token_bytes.pt"); tb[8190] = 2; torch.save(tb, kit / "token_bytes.pt")
    r = cli("prepare", "--source", "climbmix", "--shards", "1", "--base-url", srv, "--data", tmp_path / "cm", "--tokenizer-dir", kit)
    assert r.returncode == 2 and "special token <|reserved_2|> (id 8190) has 2 bytes" in r.stderr, r.stderr
    r = cli("prepare", "--source", "climbmix", "--data", tmp_path / "cm", "--tokenizer-dir", tmp_path / "nowhere")
    assert r.returncode == 2 and "missing tokenizer.pkl, token_bytes.pt" in r.stderr, r.stderr


def test_info_lists_presets():
    r = cli("info")
    assert r.returncode == 0
    for name in ("dense-124m", "cpu-tiny", "cpu-micro"): assert name in r.stdout


def _console(*args):
    from pathlib import Path
    import sys
    exe = Path(sys.executable).parent / "neuronfrontier"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "neuronfrontier.cli"], [str(a) for a in args]


def test_a_closed_stdout_ends_quietly():
    "`neuronfrontier info | head -1`: no traceback, exit code 141 (128 + SIGPIPE), whenever the reader goes."
    import os, subprocess
    from conftest import ROOT
    cmd, args = _console("info")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r_fd, w_fd = os.pipe()
    os.close(r_fd)                                   # the reader is gone before the first line
    with os.fdopen(w_fd, "w") as closed:
        p = subprocess.run(cmd + args, stdout=closed, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 141 and p.stderr == "", (p.returncode, p.stderr)
    cmd, args = _console("info", "--config", "trn2-124m")   # its last lines come seconds after the first (a prediction)
    p = subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert p.stdout.readline().startswith("config")
    p.stdout.close()                                 # `head -1`: the reader goes after the first line
    err = p.stderr.read()
    assert p.wait(300) == 141 and "Traceback" not in err and err == "", (p.returncode, err)


def test_info_refuses_an_unknown_preset_before_printing(capsys):
    from neuronfrontier.cli import main
    assert main(["info", "--config", "dense-125m"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert "'dense-125m'" in err and "dense-124m, cpu-tiny" in err, err


@pytest.mark.parametrize("args,expect", [
    (["plan", "--budget", "-1h"], "--budget -1h: must be positive, like 4h, 30m"),
    (["plan", "--budget=-1h"], "--budget -1h: must be positive, like 4h, 30m"),
    (["plan", "--budget", "0"], "--budget 0: must be positive"),
    (["plan", "--budget", "-30m", "--chips", "16"], "--budget -30m: must be positive"),
    (["plan", "--budget", "4h", "--startup", "-5m"], "--startup -5m: must be positive"),
    (["train", "--budget", "-1h"], "argument --budget: invalid float value: '-1h'"),
])
def test_a_negative_value_is_read_as_the_value(args, expect, capsys):
    "argparse alone takes `-1h` for a flag ('expected one argument'); the check that explains the mistake sees it."
    from neuronfrontier.cli import main
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and expect in err and "expected one argument" not in err, err


@pytest.mark.slow   # 38 s on the CI's 2-core AVX2 machine (pytest --durations, 2026-12-07)
def test_ctrl_c_saves_checkpoint_and_reports_interrupted(pydocs, tmp_path):
    import signal, subprocess, sys, time
    from pathlib import Path
    exe = Path(sys.executable).parent / "neuronfrontier"
    out, total = tmp_path / "int", 40
    p = subprocess.Popen([str(exe), "train", "--config", "cpu-micro", "--steps", str(total), "--data", str(pydocs),
                          "--out", str(out), *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130, (p.returncode, stderr)
    res = json.loads((out / "result.json").read_text())
    assert res["status"] == "interrupted" and 2 <= res["steps"] < total and (out / "final.pt").exists()
    # it resumes from there, and lands on exactly the weights of an uninterrupted run of the same steps
    r = cli("train", "--config", "cpu-micro", "--steps", str(total), "--data", pydocs, "--out", out, "--resume", *FAST)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "result.json").read_text())["steps"] == total
    r = cli("train", "--config", "cpu-micro", "--steps", str(total), "--data", pydocs, "--out", tmp_path / "straight", *FAST)
    assert r.returncode == 0, r.stderr
    a, b = (torch.load(d / "final.pt", weights_only=True)["model"] for d in (out, tmp_path / "straight"))
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def _result(**kw):
    "A result.json dict as `train` returns it, cut down to what the end-of-run table reads."
    r = {"status": "completed", "steps": 20, "tokens": 20480, "tok_s": 648.8, "mfu": None, "hw": "cpu",
         "train_s": 31.57, "warmup_s": 9.69, "compile_s": None, "eval_s": 73.82, "overrun_s": 0.0, "budget_s": None,
         "budget_mode": "charged", "val_bpb": 2.9116, "unigram_bpb": 2.6744, "kernel_fallbacks": {},
         "backends": {"rms_norm": "torch", "attention": "torch"}, "checkpoint": "runs/x/final.pt"}
    return r | kw


def test_a_run_ends_with_a_table_that_compares_with_the_unigram_model(capsys):
    from neuronfrontier.cli import _print_result, UNIGRAM_ADVICE
    _print_result(_result(unigram_bpb=np.float64(2.6744)))   # as data.unigram_bpb returns it
    worse = capsys.readouterr().out
    lines = worse.splitlines()
    assert "{" not in worse and "None" not in worse
    assert all(l[10:12] == "  " and l[12] != " " for l in lines)   # labels right-aligned to "evaluation", one column
    assert "2.9116  (unigram baseline 2.6744: 8.9% higher)" in worse and UNIGRAM_ADVICE in worse
    assert any(l.split() == ["MFU", "n/a", "on", "CPU"] for l in lines)
    assert "kernels  rms_norm=torch, attention=torch" in worse and lines[-1].split() == ["run", "dir", "runs/x"]
    _print_result(_result(val_bpb=2.2, mfu=0.3123, hw="trn2-core"))
    better = capsys.readouterr().out
    assert UNIGRAM_ADVICE not in better and "17.7% lower" in better and "31.2%" in better
