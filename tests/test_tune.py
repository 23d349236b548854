"""`neuronfrontier tune` times an export's own step with and without each kernel; `export --tuned` bakes what the step
chose; an export with no flags runs PyTorch's ops. On this CPU no NKI kernel runs, so the fault `kernel-slow:swiglu`
stands in for one: as fast as PyTorch's op for the preflight's calls alone, slower in the step."""
import contextlib, io, json

import pytest
from conftest import cli
from neuronfrontier.cli import main
from neuronfrontier.engine.config import resolve
from neuronfrontier.run.resilience import SLOWER_SLACK

FAST = ["--set", "eval_tokens=4096"]
N_LAYERS, D_MODEL = (lambda m: (m.n_layers, m.d_model))(resolve("cpu-micro")[0])


@pytest.fixture(scope="module")
def kern(pydocs, tmp_path_factory):
    "cpu-micro exported for one rank with its kernels (--kernels), the embedded corpus baked in."
    d = tmp_path_factory.mktemp("tune") / "kern"
    r = cli("export", "--config", "cpu-micro", "--nproc", "1", "--kernels", "--no-fit", "--data", pydocs, "--out", d, *FAST)
    assert r.returncode == 0, r.stderr
    return d


@pytest.fixture(scope="module")
def tuned(kern):
    "The eager tune of `kern` on this CPU with a kernel that is fast alone and slow in the step."
    r = cli("tune", kern, "--device", "cpu", "--eager", "--steps", "4", "--warmup", "1", "--ops", "swiglu,attention",
            env={"NF_FAULT": "kernel-slow:swiglu"})
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((kern / "tune.json").read_text()), r.stdout


def test_tune_times_every_variant_and_drops_a_kernel_that_slows_the_step(tuned):
    rec, out = tuned
    print(out)
    # --ops: the two kernels asked for, each alone (in the export's order), then PyTorch's step again
    assert [v["name"] for v in rec["variants"]] == ["torch k=1", "swiglu k=1", "attention k=1", "torch k=1, again"]
    assert rec["format"] == "neuronfrontier-tune/1" and rec["device"] == "cpu" and rec["device_name"].startswith("CPU ")
    assert rec["launch"] == "NEURON_LOGICAL_NC_CONFIG=1 torchrun --standalone --nproc_per_node=1 train.py"
    assert rec["shape"] == {"n_layers": N_LAYERS, "d_model": D_MODEL, "seq_len": 512, "rows": 2, "grad_accum": 1}
    assert rec["versions"]["torch"] and rec["versions"]["torch_neuronx"] is None
    by = {v["name"]: v for v in rec["variants"]}
    base, sw = by["torch k=1"], by["swiglu k=1"]
    assert base["status"] == "ok" and len(base["step_s"]) == 4 and base["median_s"] > 0
    # the kernel ran in the step, and alone it kept PyTorch's speed: the per-op test (the preflight) keeps it ...
    assert sw["status"] == "ok" and sw["preflight"]["swiglu"]["backend"] == "nki"
    alone = sw["preflight"]["swiglu"]
    assert alone["impl_ms"] <= SLOWER_SLACK * alone["torch_ms"] * 3, alone   # not the step's 100 ms a call
    # ... and the whole step, slower with it, drops it
    assert sw["median_s"] > base["median_s"] * 1.1, (sw["median_s"], base["median_s"])
    assert rec["decision"]["swiglu"]["backend"] == "torch" and "against PyTorch's ops" in rec["decision"]["swiglu"]["why"]
    att = by["attention k=1"]   # no NKI on a CPU: said, not timed as a kernel
    assert att["status"] == "n/a" and "no nki implementation on this device" in att["why"]
    assert rec["decision"] == {op: rec["decision"][op] for op in ("swiglu", "attention")}
    assert rec["decision"]["attention"]["backend"] == "torch"
    assert "nki" not in rec["kernels"]
    assert "swiglu: torch (step with its kernel" in out and "wrote " in out


def test_export_tuned_bakes_the_step_decision(tuned, kern, pydocs, tmp_path):
    "The tune file's decision (no kernel here) is what the export ships; a decision that keeps one ships that one only."
    rec, _ = tuned
    base = ["export", "--config", "cpu-micro", "--nproc", "1", "--no-fit", "--data", pydocs, *FAST]
    r = cli(*base, "--tuned", kern / "tune.json", "--out", tmp_path / "t")
    assert r.returncode == 0, r.stderr
    src, readme = (tmp_path / "t" / "train.py").read_text(), (tmp_path / "t" / "README.md").read_text()
    assert f"'kernels={rec['kernels']}'" in src and "'preflight_speed=false'" in src
    assert not (tmp_path / "t" / "nf_kernels").exists()
    assert "## Measured step times (tune.json)" in readme and "| swiglu k=1 |" in readme
    assert "the tune file found no kernel that made the step faster" in readme
    assert "was measured on CPU" in r.stdout   # not trn2: said
    # a decision that keeps SwiGLU's kernel (as a tune on trn2 could): only that kernel is shipped, the rest PyTorch
    keep = dict(rec, kernels=rec["kernels"].replace("swiglu=torch", "swiglu=nki"),
                decision={**rec["decision"], "swiglu": {"backend": "nki", "why": "faster"}})
    (tmp_path / "keep.json").write_text(json.dumps(keep))
    r = cli(*base, "--tuned", tmp_path / "keep.json", "--out", tmp_path / "k")
    assert r.returncode == 0, r.stderr
    assert sorted(p.stem for p in (tmp_path / "k" / "nf_kernels" / "kernels").glob("[!_]*.py")) == ["swiglu"]
    assert "swiglu=nki" in (tmp_path / "k" / "train.py").read_text()
    assert "where `neuronfrontier tune` measured the whole step faster" in (tmp_path / "k" / "README.md").read_text()


def test_the_default_export_runs_pytorch_ops_and_kernels_is_untuned(pydocs, tmp_path):
    r = cli("export", "--config", "cpu-micro", "--no-fit", "--data", pydocs, "--out", tmp_path / "d")
    assert r.returncode == 0 and "nf_kernels/" not in r.stdout, r.stdout + r.stderr
    assert "SETS = ('kernels=torch',)" in (tmp_path / "d" / "train.py").read_text()
    assert not (tmp_path / "d" / "nf_kernels").exists()
    assert "PyTorch's ops, no NKI kernel files shipped" in (tmp_path / "d" / "README.md").read_text()
    r = cli("export", "--config", "cpu-micro", "--no-fit", "--kernels", "--data", pydocs, "--out", tmp_path / "k")
    assert r.returncode == 0 and "nf_kernels/ (NKI kernels for trn2" in r.stdout, r.stdout + r.stderr
    assert "untuned, no timing of the whole step chose them" in (tmp_path / "k" / "README.md").read_text()


def test_tune_and_tuned_bad_input_is_one_line(kern, tuned, tmp_path):
    (tmp_path / "x.json").write_text("{}")
    other = json.loads((kern / "tune.json").read_text()) | {"nproc": 8}
    (tmp_path / "other.json").write_text(json.dumps(other))
    cases = [(("tune", tmp_path / "none"), "no train.py"),
             (("tune", kern, "--steps", "0"), "need steps >= 1"),
             (("tune", kern, "--ops", "relu2_mlp"), "--ops relu2_mlp: not a kernel this export ships"),
             (("export", "--config", "cpu-micro", "--nproc", "1", "--tuned", tmp_path / "x.json", "--out", tmp_path / "o"),
              "not a tune file"),
             (("export", "--config", "cpu-micro", "--nproc", "1", "--tuned", tmp_path / "nope.json", "--out", tmp_path / "o"),
              "no such tune file"),
             (("export", "--config", "cpu-micro", "--nproc", "1", "--tuned", tmp_path / "other.json", "--out", tmp_path / "o"),
              "the tune file timed nproc 8; this export has nproc 1"),
             (("export", "--config", "cpu-micro", "--nproc", "1", "--kernels", "--tuned", kern / "tune.json", "--out",
               tmp_path / "o"), "--tuned chooses the kernels")]
    cases.append((("calibrate", tmp_path / "nope.json"), "nope.json"))
    for args, msg in cases:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()): code = main([str(a) for a in args])
        assert code == 2 and msg in err.getvalue() and err.getvalue().count("\n") == 1, (args, err.getvalue())
    assert not (tmp_path / "o").exists()
    # calibrate takes a tune file, and a CPU's step times never join the trn2 fit: said, exit 1
    r = cli("calibrate", kern / "tune.json")
    assert r.returncode == 1 and "refused: tune.json: measured on cpu, not a trn2 chip" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow   # each variant compiles with inductor (about 40 s a variant on a 2-core CPU)
def test_tune_compiles_each_variant(kern, tmp_path):
    r = cli("tune", kern, "--device", "cpu", "--steps", "4", "--warmup", "1", "--out", tmp_path / "tune.json")
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads((tmp_path / "tune.json").read_text())
    print(r.stdout)
    assert rec["compiled"] and all(v["compile_s"] > 0 for v in rec["variants"])
    assert rec["variants"][0]["status"] == "ok" and "nki" not in rec["kernels"]
