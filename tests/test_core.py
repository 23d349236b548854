"""CORE through the command line (notebook 38_core): `eval --core` on the sample bundle with the bigram checkpoint,
whose every score is worked out by hand below, and `prepare --core` from a local archive, with a wrong checksum, and
from a server that fails twice."""
import http.server, json, shutil, threading, zipfile
import pytest
from conftest import cli
from neuronfrontier.run.checkpoint import save_model
from neuronfrontier.research.core import bigram_model, byte_tokenizer, write_sample_bundle
from neuronfrontier.data.shards import file_sha256, save_tokenizer

TYPES = {"multiple_choice", "schema", "language_modeling"}


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    "The sample bundle, a data directory holding only the byte tokenizer, the bigram checkpoint, the bundle as a zip."
    d = tmp_path_factory.mktemp("core")
    bundle = write_sample_bundle(d / "eval_bundle")
    save_tokenizer(byte_tokenizer(), d / "data" / "tokenizer", source="bytes")
    save_model(d / "final.pt", bigram_model())
    with zipfile.ZipFile(d / "eval_bundle.zip", "w") as z:   # nanochat's layout: one folder eval_bundle/
        for f in sorted(bundle.rglob("*")):
            if f.is_file(): z.write(f, "eval_bundle/" + str(f.relative_to(bundle)))
    return d


def _rows(stdout: str) -> dict:
    "task → (accuracy, centered) from the table `eval --core` prints."
    out = {}
    for line in stdout.splitlines():
        f = line.split()
        if len(f) == 6 and f[1] in TYPES: out[f[0]] = (float(f[4]), float(f[5]))
    return out


def test_eval_core_scores_the_sample_as_worked_out_by_hand(sample):
    r = cli("eval", sample / "final.pt", "--core", sample / "eval_bundle", "--data", sample / "data", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"val_bpb: not scored (no shards in {sample / 'data'})"
    rows = _rows(r.stdout)
    assert list(rows) == ["sample_mc", "sample_schema", "sample_lm"]
    # The bigram model (strength 20) predicts the successor of the token before:
    # a→b … y→z, z→' ', ' '→a, ':'→' '.
    # A token costs ~0 nats when it is that successor, ~20 when it is not (every scored context has a successor).
    # sample_mc (1-shot, delimiter ' ', baseline 25%): mean loss over each choice's tokens after the shared prefix;
    #   'abc':    def 20/3, dfe 60/3, xz 40/2, zyx 60/3  → def = gold: right
    #   'mno':    pq 20/2, pqrs 20/4, qp 40/2            → pqrs ≠ gold pq: wrong
    #   'hij':    kl 20/2, lk 40/2                       → kl ≠ gold lk: wrong
    #   'Which?': qab / qacdef share 'qa': b 0/1, cdef 20/4 → qab = gold: right
    #   'xyz':    abcd 0/4, bcd 20/3                     → abcd = gold: right
    #   accuracy 3/5 = 0.6; centred (0.6 - 0.25) / (1 - 0.25) = 7/15 = 0.4667
    assert rows["sample_mc"] == pytest.approx((0.6, 0.4667), abs=1e-4)
    # sample_schema (0-shot, delimiter ' ', baseline 50%): the shared suffix starts with the space after each option,
    # which only 'z' predicts;
    #   'xyz' / 'abc' + ' hi' (gold 0):             0+20+0 vs 20+20+0 → xyz: right
    #   'quiz is' / 'cat is' + ' ok' (gold 1):      suffix ' is ok', 0+5·20 vs 6·20 → quiz is: wrong
    #   'abc' / 'wxyz' + ' ab' (gold 1):            20+0+0 vs 0+0+0 → wxyz: right
    #   accuracy 2/3 = 0.6667; centred (2/3 - 1/2) / (1 - 1/2) = 1/3 = 0.3333
    assert rows["sample_schema"] == pytest.approx((0.6667, 0.3333), abs=1e-4)
    # sample_lm (1-shot, delimiter '\nAnswer: ', baseline 0%): the continuation with its leading space, after ':';
    #   ' abcd': every token the successor: right; ' abd': after 'b' the model says 'c': wrong; ' a': right
    #   accuracy 2/3 = 0.6667; centred = accuracy = 0.6667
    assert rows["sample_lm"] == pytest.approx((0.6667, 0.6667), abs=1e-4)
    # CORE = (7/15 + 1/3 + 2/3) / 3 = 22/45 = 0.4889
    assert r.stdout.strip().splitlines()[-1] == "core=0.4889"


def test_eval_core_bad_bundle_is_one_line_and_exit_2(sample, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(sample / "eval_bundle", broken)
    (broken / "core.yaml").write_text("icl_tasks: [unclosed\n")
    for args, expect in [(["--core", tmp_path / "none"], "no such directory; fetch it: neuronfrontier prepare --core"),
                         (["--core", broken], "core.yaml: not valid YAML"),
                         (["--core", sample / "eval_bundle", "--core-max-per-task", "0"], "must be >= 1")]:
        r = cli("eval", sample / "final.pt", *args, "--data", sample / "data")
        assert r.returncode == 2 and expect in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)


def test_prepare_core_from_a_local_archive(sample, tmp_path):
    sha = file_sha256(sample / "eval_bundle.zip")
    r = cli("prepare", "--core", "--core-url", sample / "eval_bundle.zip", "--core-dir", tmp_path / "b",
            "--core-sha256", sha)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"ready: {tmp_path / 'b'}"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["core.yaml", "eval_data", "eval_meta_data.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]   # no archive copy, no temporary folder
    # a file:// URL works the same; a directory that holds a bundle is kept as it is
    r = cli("prepare", "--core", "--core-url", (sample / "eval_bundle.zip").as_uri(), "--core-dir", tmp_path / "c",
            "--core-sha256", sha)
    assert r.returncode == 0 and (tmp_path / "c" / "core.yaml").exists(), r.stderr
    r = cli("prepare", "--core", "--core-dir", tmp_path / "c")   # the default URL is never contacted
    assert r.returncode == 0 and "already" in r.stdout, r.stderr


def test_prepare_core_wrong_checksum_leaves_nothing(sample, tmp_path):
    sha = file_sha256(sample / "eval_bundle.zip")
    r = cli("prepare", "--core", "--core-url", sample / "eval_bundle.zip", "--core-dir", tmp_path / "b",
            "--core-sha256", "0" * 64)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "sha256 mismatch" in r.stderr and f"--core-sha256 {sha}" in r.stderr
    assert list(tmp_path.iterdir()) == []


class _Flaky(http.server.BaseHTTPRequestHandler):
    "The first request gets 503; the second is promised the whole archive, gets half and a closed connection."
    body, seen = b"", []

    def do_GET(self):
        _Flaky.seen.append(self.headers.get("Range"))
        if len(_Flaky.seen) == 1: return self.send_error(503)
        start = int(self.headers["Range"][len("bytes="):-1]) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(self.body) - start))
        self.end_headers()
        self.wfile.write(self.body[start:len(self.body) // 2] if len(_Flaky.seen) == 2 else self.body[start:])

    def log_message(self, *a): pass


def test_prepare_core_retries_a_flaky_server_and_resumes(sample, tmp_path):
    _Flaky.body, _Flaky.seen = (sample / "eval_bundle.zip").read_bytes(), []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = cli("prepare", "--core", "--core-url", f"http://127.0.0.1:{srv.server_port}/eval_bundle.zip",
                "--core-dir", tmp_path / "b", "--core-sha256", file_sha256(sample / "eval_bundle.zip"))
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 0, r.stderr
    assert "attempt 1/5 failed (HTTPError" in r.stdout and "attempt 2/5 failed (OSError" in r.stdout, r.stdout
    assert _Flaky.seen == [None, None, f"bytes={len(_Flaky.body) // 2}-"]   # the third attempt resumed the half
    assert (tmp_path / "b" / "core.yaml").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_speedrun_core_scores_the_run_it_trained(sample, pydocs, tmp_path):
    "`speedrun --core`: the trained final.pt scored after the run's own table; a broken bundle fails first."
    r = cli("speedrun", "--config", "cpu-micro", "--steps", "2", "--data", pydocs, "--out", tmp_path / "run",
            "--set", "eval_tokens=4096", "--quiet", "--core", sample / "eval_bundle")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert any(l.startswith("val_bpb=") for l in lines) and lines[-1].startswith("core=")
    assert set(_rows(r.stdout)) and -1 <= float(lines[-1].split("=")[1]) <= 1
    res = json.loads((tmp_path / "run" / "result.json").read_text())   # the run's record carries its CORE too
    assert f"core={res['core']:.4f}" == lines[-1] and set(res["core_tasks"]) == set(_rows(r.stdout))
    bad = cli("speedrun", "--config", "cpu-micro", "--steps", "2", "--data", pydocs, "--out", tmp_path / "bad",
              "--core", tmp_path / "nowhere")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and not (tmp_path / "bad").exists(), bad.stderr


def test_too_few_items_for_the_shots_fail_before_scoring(sample):
    "--core-max-per-task at or below a task's shots: one line and exit 2 before any task is scored (nothing printed)."
    r = cli("eval", sample / "final.pt", "--core", sample / "eval_bundle", "--data", sample / "data", "--device", "cpu",
            "--core-max-per-task", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "-shot tasks" in r.stderr and r.stdout == "", r
