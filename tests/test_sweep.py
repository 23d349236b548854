"End-to-end tests of `neuronfrontier sweep`: the table and plots of a small sweep, resume after Ctrl-C, bad grids."
import csv, json, signal, statistics, subprocess, sys, time
import pytest
from conftest import cli, ROOT

FAST = ["--set", "eval_tokens=4096", "--config", "cpu-micro", "--device", "cpu"]


def _results(out):
    return [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]


def test_sweep_two_points_two_seeds_table_and_plots(pydocs, tmp_path):
    out = tmp_path / "sw"
    r = cli("sweep", *FAST, "--steps", "3", "--grid", "muon_lr=0.01,0.04", "--recipe", "frontier", "--seeds", "0", "1",
            "--jobs", "2", "--threads", "1", "--data", pydocs, "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _results(out)
    assert sorted((x["setting"], x["seed"]) for x in rows) == [("muon_lr=0.01", 0), ("muon_lr=0.01", 1), ("muon_lr=0.04", 0), ("muon_lr=0.04", 1)]
    table = {t["setting"]: t for t in csv.DictReader(open(out / "table.csv"))}
    assert set(table) == {"muon_lr=0.01", "muon_lr=0.04"}
    for name, t in table.items():  # the table's statistics are those of the runs' own result.json files
        res = [json.loads((out / name / f"s{s}" / "result.json").read_text()) for s in (0, 1)]
        assert [x["config"]["train"]["muon_lr"] for x in res] == [float(name.split("=")[1])] * 2
        assert all(x["steps"] == 3 and x["status"] == "completed" for x in res)
        assert float(t["val_bpb_mean"]) == pytest.approx(statistics.mean(x["val_bpb"] for x in res))
        assert float(t["val_bpb_sd"]) == pytest.approx(statistics.stdev(x["val_bpb"] for x in res))
        assert int(t["runs"]) == 2 and float(t["tok_s"]) > 0
    for png in ("val_bpb.png", "pareto.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| muon_lr=0.0" in (out / "table.md").read_text() and "| muon_lr=0.0" in r.stdout


def test_sweep_resumes_after_ctrl_c(pydocs, tmp_path):
    out = tmp_path / "sw"
    args = ["sweep", *FAST, "--budget", "4", "--grid", "muon_lr=0.01,0.04", "--recipe", "frontier", "--jobs", "1",
            "--threads", "1", "--data", str(pydocs), "--out", str(out)]
    exe = [sys.executable, "-c", "import sys; from neuronfrontier.cli import main; sys.exit(main())"]
    p = subprocess.Popen(exe + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # Ctrl-C works even if pytest runs in a background job (SIGINT ignored)
    first = out / "muon_lr=0.01" / "s0" / "result.json"
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:  # wait until the first run has finished ...
        try:
            if json.loads(first.read_text()).get("val_bpb") is not None: break  # trained and evaluated
        except (OSError, ValueError): pass
        time.sleep(0.2)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)                        # ... then Ctrl-C while the second one runs
    so, se = p.communicate(timeout=300)
    assert p.returncode == 130, so + se
    assert "interrupted: 1 of 2 runs finished" in so and se.strip() == "error: interrupted", so + se
    second = out / "muon_lr=0.04" / "s0" / "result.json"
    assert not second.exists() or json.loads(second.read_text())["status"] == "interrupted"
    mtime = first.stat().st_mtime
    r = cli(*args)                                      # the same command again resumes
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 already finished" in r.stdout and first.stat().st_mtime == mtime  # the finished run was not redone
    assert json.loads(second.read_text())["status"] == "completed"
    assert len(_results(out)) == 2


@pytest.mark.parametrize("grid,expect", [
    (["--grid", "muon_lr"], "--grid 'muon_lr': expected key=v1,v2"),
    (["--grid", "muon_lrr=0.02"], "unknown field; did you mean muon_lr"),
    (["--grid", "lr=0.1,,0.2"], "empty value"),
    (["--grid", "lr=0.1,0.1"], "listed twice"),
    (["--grid", "lr=0.1", "--grid", "lr=0.2"], "--grid lr is given twice"),
    (["--grid", "d_model=256,300"], "sweep setting 'd_model=300': d_model=300 is not a multiple of 128"),
    (["--grid", "lr=fast"], "expected a value of type float"),
    (["--grid", "lr=0.1,0.2", "--random", "3"], "--random 3: the grid has only 2 points"),
    (["--jobs", "0"], "--jobs 0: must be at least 1"),
])
def test_bad_sweep_specs_are_one_line_exit_2(grid, expect, pydocs, tmp_path):
    r = cli("sweep", "--config", "cpu-micro", "--steps", "2", "--data", pydocs, "--out", tmp_path / "sw", *grid)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and expect in r.stderr, r.stderr
    assert not (tmp_path / "sw").exists()  # nothing was started


def test_ablation_script_is_a_sweep(pydocs, tmp_path):
    out = tmp_path / "abl"
    r = subprocess.run([sys.executable, "benchmarks/ablation.py", "--config", "cpu-micro", "--steps", "2", "--seeds", "0",
                        "--variants", "baseline", "frontier", "--jobs", "2", "--threads", "1", "--data", str(pydocs),
                        "--out", str(out), "--set", "eval_tokens=4096"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {x["setting"] for x in _results(out)} == {"baseline", "frontier"}
    assert "| frontier |" in r.stdout and "+0.0000" in r.stdout  # Δ against the reference (baseline) row
