"""The dashboard's API: the SSE feed of metrics.jsonl, the token rules, path validation, garbage lines, the kernels
report, the judge tour's results files (and `benchmarks/ablation.py --json`, which writes them), and `neuronfrontier
dashboard` off loopback. The page itself is tested in Chromium (test_dashboard_browser)."""
import json, os, shutil, signal, statistics, subprocess, sys, threading, time
from pathlib import Path
import httpx
import pytest
from fastapi.testclient import TestClient
from conftest import ROOT, cli, free_port
from neuronfrontier.dashboard import make_app, read_new, run_summary, Launcher, LOOPBACK, RESULTS, _check_ablation, tour

TOKEN = "t0ken-for-tests"
STATE_CHANGING = [("/api/launch", {"config": "cpu-micro"}), ("/api/runs/r1/stop", None), ("/api/checks/tile", None)]


def events(body: str) -> list[tuple[str, str]]:
    "(event, data) pairs of an SSE body."
    out = []
    for block in body.split("\n\n"):
        ev = dict(l.split(": ", 1) for l in block.splitlines() if ": " in l and not l.startswith(":"))
        if "event" in ev: out.append((ev["event"], ev.get("data", "")))
    return out


@pytest.fixture()
def runs(tmp_path):
    d = tmp_path / "runs"; (d / "r1").mkdir(parents=True)
    (d / "r1" / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0, "time_s": 0.1}\n\x00\xff garbage\n{"step": 10, "loss": NaN}\n'
                                            '{"step": 20, "loss": 7.0}\n{"step": 30, "lo')
    return d


def test_stream_sends_complete_new_lines_then_result(runs):
    with TestClient(make_app(runs, ".", TOKEN)) as c:
        (runs / "r1" / "result.json").write_text(json.dumps({"status": "completed", "val_bpb": 2.0}))
        ev = events(c.get("/api/runs/r1/stream").text)
        assert [e for e, _ in ev] == ["metrics", "result", "end"]
        recs = json.loads(ev[0][1])
        assert [r["step"] for r in recs] == [1, 10, 20] and recs[1]["loss"] is None   # garbage skipped, NaN -> null, half line held
        assert json.loads(ev[1][1])["val_bpb"] == 2.0
        off = c.get("/api/runs/r1/metrics").json()["offset"]
        assert off == (runs / "r1" / "metrics.jsonl").read_bytes().index(b'{"step": 30')
        ev = events(c.get("/api/runs/r1/stream", headers={"Last-Event-ID": str(off)}).text)   # a reconnect resumes
        assert [e for e, _ in ev] == ["result", "end"]


def test_stream_follows_a_file_being_written(runs, monkeypatch):
    """A writer appends records in pieces (lines split mid-way) while the stream is open: each record arrives once, whole.
    The writer goes on only once the stream has read what it wrote (counted reads), so the records come in several
    events however slowly the machine serves the request."""
    import neuronfrontier.dashboard.server as D   # the stream reads through the server module's read_new
    m = runs / "r1" / "metrics.jsonl"; m.write_text("")
    reads, real = threading.Semaphore(0), D.read_new
    def counted(*a, **k):
        out = real(*a, **k)
        reads.release()
        return out
    monkeypatch.setattr(D, "read_new", counted)
    def read_since():   # three more reads: at least one whole pass of the stream's loop after the write
        for _ in range(3): assert reads.acquire(timeout=60), "the stream stopped reading"
    def writer():
        read_since()   # the stream is open
        for i in range(1, 31):
            line = json.dumps({"step": i, "loss": 10.0 - i / 10}) + "\n"
            with open(m, "a") as f: f.write(line[:7]); f.flush(); time.sleep(0.003); f.write(line[7:])
            if i % 7 == 0: read_since()
        (runs / "r1" / "result.json").write_text('{"status": "interrupted", "val_bpb": null}')   # train stopped; evaluating
        read_since()
        (runs / "r1" / "result.json").write_text('{"status": "interrupted", "val_bpb": 2.5}')
    t = threading.Thread(target=writer, daemon=True)
    with TestClient(make_app(runs, ".", TOKEN, poll_s=0.01)) as c:
        t.start(); body = c.get("/api/runs/r1/stream").text; t.join()
    ev = events(body)
    got = [r["step"] for e, d in ev if e == "metrics" for r in json.loads(d)]
    assert got == list(range(1, 31)) and sum(e == "metrics" for e, _ in ev) > 1   # incrementally, never twice
    assert ev[-2][0] == "result" and json.loads(ev[-2][1]) == {"status": "interrupted", "val_bpb": 2.5}   # the stream waits for the score


def test_read_new_reads_only_past_the_offset(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_bytes(b"this prefix is never parsed again\n" * 3 + b'{"step": 1}\n')
    start = m.read_bytes().index(b'{"step"')
    assert read_new(m, start) == ([{"step": 1}], m.stat().st_size, False)
    assert read_new(tmp_path / "missing.jsonl", 5) == ([], 5, False)


@pytest.mark.parametrize("path,body", STATE_CHANGING)
def test_state_changing_requests_need_the_token(runs, path, body):
    with TestClient(make_app(runs, ".", TOKEN)) as c:
        assert c.post(path, json=body).status_code == 401
        assert c.post(path, json=body, headers={"X-NF-Token": "wrong-token"}).status_code == 403


def test_token_is_embedded_only_on_loopback(runs):
    with TestClient(make_app(runs, ".", TOKEN, embed_token=True)) as c:
        assert f'content="{TOKEN}"' in c.get("/").text
    with TestClient(make_app(runs, ".", TOKEN, embed_token=False)) as c:
        assert TOKEN not in c.get("/").text and "nf-token" not in c.get("/").text


def test_loopback_server_refuses_foreign_host_headers(runs):
    "DNS rebinding: a page on evil.example resolving to 127.0.0.1 must not reach the API."
    with TestClient(make_app(runs, ".", TOKEN, allowed_hosts=LOOPBACK), base_url="http://127.0.0.1") as c:
        assert c.get("/api/runs").status_code == 200
        assert c.get("/api/runs", headers={"Host": "evil.example"}).status_code == 400


@pytest.mark.parametrize("path,code", [
    ("/api/runs/..%2F..%2Fetc/metrics", 400), ("/api/runs/%2Fetc%2Fpasswd", 400), ("/api/runs/r1%2F..%2F..%2Fx", 400),
    ("/api/runs/.ssh/stream", 400), ("/api/runs/a%2Fb%2Fc%2Fd", 400), ("/api/runs/nope", 404), ("/api/runs/nope/metrics", 404),
    ("/api/sweeps/%2E%2E", 400), ("/api/sweeps/r1", 404), ("/api/kernels/..%2F..%2Fetc", 404), ("/static/..%2F..%2Fcli.py", 404),
])
def test_names_and_paths_are_validated(runs, path, code):
    with TestClient(make_app(runs, ".", TOKEN)) as c:
        assert c.get(path).status_code == code


def test_stop_needs_a_page_launched_run_and_launch_validates(runs):
    h = {"X-NF-Token": TOKEN}
    with TestClient(make_app(runs, ".", TOKEN)) as c:
        assert c.post("/api/runs/r1/stop", headers=h).status_code == 409          # not started here: never signalled
        r = c.post("/api/launch", json={"config": "cpu-micro", "budget": "60; rm -rf /"}, headers=h)
        assert r.status_code == 400 and "integers" in r.json()["detail"]
        r = c.post("/api/launch", json={"config": "../../x", "budget": 60}, headers=h)
        assert r.status_code == 400 and "not offered" in r.json()["detail"]
        r = c.post("/api/launch", json={"config": "cpu-micro", "budget": 60}, headers=h)       # data dir "." has no shards
        assert r.status_code == 400 and "neuronfrontier prepare" in r.json()["detail"]
    assert sorted(p.name for p in runs.iterdir()) == ["r1"]                                  # nothing was created


def test_runs_say_which_logged_a_curve_for_the_overlay(runs):
    "The overlay's default: the newest runs that logged metrics (`logged`); a run with only result.json has no curve."
    (runs / "r2").mkdir(); (runs / "r2" / "result.json").write_text('{"status": "completed", "val_bpb": 2.0}')
    with TestClient(make_app(runs, ".", TOKEN)) as c:
        got = {r["name"]: r["logged"] for r in c.get("/api/runs").json()}
    assert got == {"r1": True, "r2": False}


def test_static_assets_are_shipped_with_the_licence(runs):
    with TestClient(make_app(runs, ".", TOKEN)) as c:
        js = c.get("/static/vendor/chart.umd.min.js")
        assert js.status_code == 200 and "Chart.js v4" in js.text[:200]
        assert c.get("/static/app.js").status_code == 200
    vendor = ROOT / "neuronfrontier" / "static" / "vendor"
    assert "MIT License" in (vendor / "chart.js-LICENSE.md").read_text()
    assert "| chart.js | 4." in (vendor / "README.md").read_text()


def test_kernels_report_cli_feeds_the_kernels_view(runs):
    out = runs / "kernels_report.json"
    r = cli("kernels-report", "--config", "cpu-micro", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "(measured in the simulator)" in r.stdout and "(roofline estimate)" in r.stdout
    with TestClient(make_app(runs, ".", TOKEN)) as c:
        k = c.get("/api/kernels").json()
        assert k["available"] and k["config"] == "cpu-micro" and len(k["kernels"]) == 8
        assert all("timeline" not in e for e in k["kernels"])                               # the list stays small
        a = c.get("/api/kernels/attention_fwd").json()
        assert a["timeline"]["label"] == "measured in the simulator" and a["roofline"]["label"] == "roofline estimate"
        assert max(a["timeline"]["sbuf"]) == a["measured"]["peak_sbuf_bytes_pp"] <= a["hw"]["sbuf_budget_pp"] == 192 * 1024
        assert a["hw"]["sbuf_budget_bytes"] == 24 * 2**20 and a["hw"]["psum_bytes"] == 2 * 2**20


def test_committed_kernels_report_is_current_schema():
    rep = json.loads((ROOT / "nbs" / "results" / "kernels_report.json").read_text())
    assert rep["schema"] == 1 and rep["config"] == "dense-124m" and len(rep["kernels"]) == 8
    for k in rep["kernels"]:
        assert k["measured"]["label"] == "measured in the simulator" and k["roofline"]["label"] == "roofline estimate"
        assert len(k["timeline"]["sbuf"]) <= 1200


def _texts(step: dict, name: str) -> list[str]:
    "The text blocks of a tour step formatted from the results file `name`."
    return [b["text"] for b in step["measured"] if b.get("file") == f"nbs/results/{name}" and b["kind"] == "text"]


def _pm(xs): return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs):.4f}"


def test_tour_api_serves_steps_with_labelled_blocks(runs):
    "/api/tour: the TOUR entries, each with `measured` blocks the page renders (kind, source, label; text or a table)."
    with TestClient(make_app(runs, ".", TOKEN)) as c:
        steps = c.get("/api/tour").json()
    assert [s["id"] for s in steps] == ["tiles", "kernels", "muon", "ablation", "speedrun", "submission"]
    assert all("claim" in s and s["claim_by"] and s["measured"] for s in steps)
    for b in (b for s in steps for b in s["measured"]):
        assert b["kind"] in ("text", "table") and b["source"] and b["label"] not in ("missing", "unreadable"), b
        assert isinstance(b["text"], str) if b["kind"] == "text" else len(b["header"]) == len(b["rows"][0])
    assert "measured in the simulator" in steps[1]["measured"][0]["label"]     # the kernels report's own labels


def test_tour_numbers_come_from_the_results_files_not_the_readme(runs, tmp_path):
    "A README without its Numbers section leaves the tour as it was; a changed results file changes it."
    repo = tmp_path / "repo"
    (repo / "nbs").mkdir(parents=True)
    shutil.copytree(ROOT / "nbs" / "results", repo / "nbs" / "results")
    (repo / "README.md").write_text("# NeuronFrontier-LM\n\nReworded: no Numbers section, no tables, no paragraphs.\n")
    steps = {s["id"]: s for s in tour(runs, None, repo=repo)}
    assert steps == {s["id"]: s for s in tour(runs, None, repo=ROOT)}
    res = repo / "nbs" / "results"
    fa = json.loads((res / "frontier_ablation.json").read_text())
    abl = steps["ablation"]["measured"][1]
    assert abl["kind"] == "table" and abl["label"] == fa["meta"]["label"] and "measured on CPU" in abl["label"]
    assert [r[:3] for r in abl["rows"]] == [[s["setting"], f"{s['val_bpb_mean']:.4f} ± {s['val_bpb_sd']:.4f}",
                                             f"{s['delta']:+.4f}"] for s in fa["summary"]]
    assert "not a preset's default" in steps["muon"]["measured"][0]["text"]
    assert "not a preset's default" in steps["ablation"]["measured"][0]["text"]

    name = "speedrun_ramp_fixed_steps.json"
    ramp = json.loads((res / name).read_text())
    v = lambda d, n: [r["val_bpb"] for r in d["rows"] if r["setting"] == n]
    ramp100 = "kit + momentum ramp 100"
    said = f"kit {_pm(v(ramp, 'kit'))} vs {ramp100} {_pm(v(ramp, ramp100))} at 460 steps, 3 seeds"
    [text] = _texts(steps["speedrun"], name)
    assert said in text and ramp["meta"]["date"] in next(b["source"] for b in steps["speedrun"]["measured"]
                                                         if b.get("file") == f"nbs/results/{name}")
    ramp["rows"][0]["val_bpb"] += 0.1                       # kit, seed 0
    (res / name).write_text(json.dumps(ramp))
    [text2] = _texts({s["id"]: s for s in tour(runs, None, repo=repo)}["speedrun"], name)
    assert text2 != text and f"kit {_pm(v(ramp, 'kit'))} vs" in text2
    for name in ("speedrun_vs_kit.json", "speedrun_kit_changes.json"):   # a file without a label: its machine
        d = json.loads((res / name).read_text())
        assert {b["label"] for b in steps["speedrun"]["measured"] if b.get("file") == f"nbs/results/{name}"} == {
            f"measured on {d['meta']['machine']}"}


def test_a_missing_results_file_gives_a_block_naming_its_command(tmp_path):
    res = tmp_path / "results"
    shutil.copytree(ROOT / "nbs" / "results", res)
    (res / "speedrun_vs_kit.json").unlink()
    (res / "kernels_report.json").unlink()
    steps = {s["id"]: s for s in tour(None, None, results=res)}
    [miss] = [b for b in steps["speedrun"]["measured"] if b["label"] == "missing"]
    assert miss["file"] == "nbs/results/speedrun_vs_kit.json" and miss["command"] == RESULTS["speedrun_vs_kit.json"]
    assert 'python benchmarks/ablation.py --variants kit "kit + heads of 64"' in miss["text"]
    assert _texts(steps["speedrun"], "speedrun_ramp_fixed_steps.json")          # the other files still count
    [k] = steps["kernels"]["measured"]
    assert k["label"] == "missing" and "neuronfrontier kernels-report --config dense-124m" in k["text"]

    empty = tmp_path / "empty"
    empty.mkdir()
    blocks = [b for s in tour(None, None, results=empty) for b in s["measured"]]
    gone = {b["file"]: b["text"] for b in blocks if b["label"] == "missing"}
    assert set(gone) == {f"nbs/results/{n}" for n in RESULTS} and all(RESULTS[f[12:]] in t for f, t in gone.items())

    (res / "frontier_ablation.json").write_text('{"meta": {}, "rows": [{"setting": "frontier"}]}')   # no numbers
    steps = {s["id"]: s for s in tour(None, None, results=res)}
    assert [b["label"] for b in steps["ablation"]["measured"]] == ["unreadable"]


def test_ablation_json_is_the_file_the_tour_reads(pydocs, tmp_path):
    "`benchmarks/ablation.py --json` writes meta, rows and summary; the tour shows them with the file's label."
    res = tmp_path / "results"
    args = ["--config", "cpu-micro", "--steps", "2", "--seeds", "0", "1", "--variants", "baseline", "frontier",
            "--jobs", "2", "--threads", "1", "--data", str(pydocs), "--out", str(tmp_path / "abl"),
            "--set", "eval_tokens=4096", "--machine", "the test machine", "--json", str(res / "frontier_ablation.json")]
    r = subprocess.run([sys.executable, "benchmarks/ablation.py", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads((res / "frontier_ablation.json").read_text())
    m = d["meta"]
    assert m["command"].startswith("python benchmarks/ablation.py --config cpu-micro") and m["steps"] == 2
    assert m["label"] == f"measured on {'CPU' if m['device'] == 'cpu' else m['device']} (the test machine)"
    assert (m["reference"], m["jobs"], m["threads"], m["seeds"]) == ("baseline", 2, 1, [0, 1]) and m["date"]
    assert sorted((x["setting"], x["seed"]) for x in d["rows"]) == [("baseline", 0), ("baseline", 1), ("frontier", 0),
                                                                    ("frontier", 1)]
    assert all("run_dir" not in x for x in d["rows"])
    assert [s["setting"] for s in d["summary"]] == ["baseline", "frontier"] and d["summary"][0]["delta"] == 0

    steps = {s["id"]: s for s in tour(None, None, results=res)}
    note, tab, text, qk = steps["ablation"]["measured"]
    assert tab["label"] == m["label"] and [row[0] for row in tab["rows"]] == ["baseline", "frontier"]
    fr = sorted((x for x in d["rows"] if x["setting"] == "frontier"), key=lambda x: x["seed"])
    assert tab["rows"][1][3] == ", ".join(f"{x['val_bpb']:.4f}" for x in fr)
    assert "at 2 steps, 2 seeds: frontier − baseline" in text["text"] and qk["label"] == "missing"


def test_dashboard_off_loopback_prints_a_token_and_requires_it(tmp_path):
    port = free_port()
    exe = Path(sys.executable).parent / "neuronfrontier"
    p = subprocess.Popen([str(exe), "dashboard", "--runs", str(tmp_path), "--host", "0.0.0.0", "--port", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        lines = [p.stdout.readline(), p.stdout.readline()]
        assert lines[0].startswith("token (printed once") and "dashboard: http://0.0.0.0:" in lines[1], lines
        tok = lines[0].rsplit(" ", 1)[1].strip()
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try: page = httpx.get(base + "/", timeout=2); break
            except httpx.TransportError: time.sleep(0.1)
        assert page.status_code == 200 and tok not in page.text                   # the page does not hand it out
        assert httpx.post(base + "/api/checks/tile").status_code == 401
        r = httpx.post(base + "/api/checks/tile", headers={"X-NF-Token": tok}, timeout=60)
        assert r.status_code == 200 and r.json()["ok"] is True and "d_model=700" in r.json()["output"]
    finally:
        p.send_signal(signal.SIGINT); p.wait(30)


def test_sweep_directory_in_the_sweep_commands_layout(tmp_path):
    "`neuronfrontier sweep --out DIR` writes DIR/<setting>/s<seed>/ run directories and (sweep.write_outputs) table.csv."
    from neuronfrontier.research.sweep import collect, setting_dir, write_outputs
    sw = tmp_path / "runs" / "sw"
    pts = {"lr=0.01": (2.40, 900.0), "lr=0.02": (2.30, 800.0), "lr=0.04": (2.50, 850.0)}
    settings = {k: [k] for k in pts}
    for setting, (bpb, tps) in pts.items():
        rd = setting_dir(sw, setting) / "s0"; rd.mkdir(parents=True)
        (rd / "result.json").write_text(json.dumps({"status": "completed", "val_bpb": bpb, "tok_s": tps, "steps": 10, "tokens": 100, "train_s": 1.0}))
    write_outputs(sw, collect(sw, settings, [0]), settings, plots=False)
    with TestClient(make_app(tmp_path / "runs", ".", TOKEN)) as c:
        assert c.get("/api/sweeps").json() == ["sw"]
        s = c.get("/api/sweeps/sw").json()
        assert (s["source"], s["bpb"], s["toks"], s["pareto"]) == ("table.csv", "val_bpb_mean", "tok_s", [0, 1])
        assert [r["name"] for r in s["runs"]] == ["sw/lr=0.01/s0", "sw/lr=0.02/s0", "sw/lr=0.04/s0"]
        assert c.get("/api/runs/sw/lr=0.02/s0").json()["val_bpb"] == 2.30
        assert {r["name"] for r in c.get("/api/runs").json()} == {r["name"] for r in s["runs"]}


def test_a_run_stopped_before_its_first_step_is_stopped_not_failed(pydocs, tmp_path):
    "SIGINT during start-up (before `train` handles it) leaves no result.json: the run is `stopped`, with its log."
    L = Launcher(tmp_path / "runs", pydocs)
    name = L.start("cpu-micro", "", 60)
    L.stop(name); L.proc.wait(120)
    d = tmp_path / "runs" / name
    assert not (d / "result.json").exists() and json.loads((d / "launch.json").read_text())["stopped"] > 0
    assert run_summary(d, name)["status"] == "stopped"
    with TestClient(make_app(tmp_path / "runs", pydocs, TOKEN)) as c:
        assert [e for e, _ in events(c.get(f"/api/runs/{name}/stream").text)] == ["status", "log", "end"]


def test_ablation_check_steps_the_schedule_by_budget_fraction(pydocs, monkeypatch):
    "`train_step` takes the fraction of the run done (it applies the schedule itself), not an lr multiplier."
    import neuronfrontier.run.trainer as T
    fracs, real = [], T.train_step
    monkeypatch.setattr(T, "train_step", lambda *a, **k: fracs.append(a[4]) or real(*a, **k))
    ok, out = _check_ablation(pydocs, steps=4)
    assert ok, out
    assert fracs == [0.0, 0.25, 0.5, 0.75] * 2

