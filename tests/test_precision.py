"""`dtype=auto`: the CPU probe decides bf16 or fp32 both ways; a run's header line and result.json say which and why;
bf16 forced where it is emulated warns in one line; ranks agree; a resumed run keeps its dtype; the export keeps bf16
for the chip."""
import json, os, platform, subprocess, sys
import pytest
import torch
from conftest import ROOT, cli
from neuronfrontier.run import trainer as T
from neuronfrontier.engine.optim import default_ns_dtype
from neuronfrontier.engine.precision import AVX2_ENV, bf16_is_native, choose_precision, cpu_report, probe_cpu_bf16

FAST = ["--set", "eval_tokens=8192", "--set", "batch_size=1"]
EMULATING = {"capability": "AVX2", "bf16_instructions": False, "mkldnn_bf16": False, "shape": [256, 256, 1024],
             "fp32_ms": 0.6, "bf16_ms": 65.0, "ratio": 108.333, "native": False}
NATIVE = {"capability": "AVX512", "bf16_instructions": True, "mkldnn_bf16": True, "shape": [256, 256, 1024],
          "fp32_ms": 0.6, "bf16_ms": 0.14, "ratio": 0.233, "native": True}
X86 = platform.machine().lower() in ("x86_64", "amd64")   # where AVX2_ENV makes PyTorch dispatch as an AVX2 CPU


def test_the_probe_decides_both_ways():
    "Given an emulating CPU's numbers, auto is fp32; a native CPU's, bf16; the reason carries the numbers."
    slow, fast = choose_precision("auto", "cpu", EMULATING), choose_precision("auto", "cpu", NATIVE)
    assert (slow.dtype, fast.dtype) == ("fp32", "bf16")
    assert slow.why == "CPU AVX2 without native bf16: a 256x256x1024 matmul takes 65 ms in bf16, 0.6 ms in fp32 (108x)"
    assert slow.describe().startswith("fp32 (auto: CPU AVX2 without native bf16") and slow.probe == EMULATING
    assert fast.why.startswith("CPU AVX512 with native bf16") and fast.warning is None
    forced = choose_precision("bf16", "cpu", EMULATING)   # asked for: kept, with one line saying what it costs
    assert forced.dtype == "bf16" and forced.warning.startswith("warning: dtype=bf16") and "\n" not in forced.warning
    assert choose_precision("bf16", "cpu", NATIVE).warning is None
    assert (slow.ns_dtype, fast.ns_dtype) == ("fp32", "bf16")   # Newton–Schulz follows the finding
    ask32 = choose_precision("fp32", "cpu", NATIVE)
    assert (ask32.dtype, ask32.ns_dtype, ask32.why) == ("fp32", "bf16", "asked for")
    assert choose_precision("auto", "neuron").dtype == "bf16"    # the chip, with no probe
    job = fast.for_job(False)   # another rank emulates bf16: the job trains in fp32, Newton–Schulz too
    assert (job.dtype, job.ns_dtype, job.native) == ("fp32", "fp32", False) and "another rank" in job.why
    assert fast.for_job(True) is fast and slow.for_job(False) is slow
    back = slow.resumed("bf16", "bf16")   # started where bf16 was native, resumed where it is emulated: kept, warned
    assert (back.dtype, back.ns_dtype) == ("bf16", "bf16") and back.warning.startswith("warning: dtype=bf16")
    assert choose_precision("fp32", "cpu", NATIVE).resumed("bf16", "bf16").dtype == "fp32"   # asked for: kept
    with pytest.raises(ValueError, match="dtype='fp16' is unknown; use one of auto, fp32, bf16"):
        choose_precision("fp16", "cpu")


def test_the_rule_needs_the_report_and_the_timing():
    "oneDNN's report can rule bf16 out; where it allows it, a bf16 matmul slower than fp32 (AVX512 converting) is not native."
    allowed, ruled_out = {"capability": "AVX512", "mkldnn_bf16": True}, {"capability": "AVX2", "mkldnn_bf16": False}
    assert bf16_is_native(allowed, 0.6, 0.14) and not bf16_is_native(allowed, 0.6, 0.9)
    assert not bf16_is_native(ruled_out, 0.6, 0.14)
    assert bf16_is_native({"capability": "SVE256", "mkldnn_bf16": None}, 0.6, 0.3)   # not reported: the timing decides
    converting = {"capability": "AVX512", "bf16_instructions": False, "mkldnn_bf16": True}   # AVX512 without BF16
    assert not bf16_is_native(converting, 0.6, 0.55)   # however its timing comes out


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_an_avx2_cpu_trains_in_fp32_and_says_why(pydocs, tmp_path):
    """A real emulating CPU: an interpreter that dispatches as an AVX2 CPU (precision.AVX2_ENV) probes bf16 as slow,
    trains in fp32 and says so in its header line and result.json; `--set dtype=bf16` there warns once and keeps bf16."""
    if not X86: pytest.skip(f"AVX2_ENV only changes PyTorch's dispatch on x86, not on {platform.machine()}")
    r = cli("train", "--config", "cpu-micro", "--steps", "2", "--data", pydocs, "--out", tmp_path / "auto", *FAST,
            env=AVX2_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "auto" / "result.json").read_text())
    p = res["precision"]["probe"]
    assert (res["dtype"], res["config"]["train"]["dtype"], res["precision"]["asked"]) == ("fp32", "fp32", "auto")
    assert res["precision"]["ns_dtype"] == "fp32" and res["precision"]["warning"] is None
    assert (p["capability"], p["mkldnn_bf16"], p["native"]) == ("AVX2", False, False) and p["ratio"] > 1
    assert "fp32 (auto: CPU AVX2 without native bf16: a 256x256x1024 matmul takes" in r.stdout
    assert "warning: dtype=" not in r.stderr
    r = cli("train", "--config", "cpu-micro", "--steps", "1", "--data", pydocs, "--out", tmp_path / "forced", *FAST,
            "--set", "dtype=bf16", env=AVX2_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    warnings = [l for l in r.stderr.splitlines() if "warning: dtype=" in l]
    assert len(warnings) == 1 and warnings[0].startswith("warning: dtype=bf16 where bf16 is not native"), r.stderr
    res = json.loads((tmp_path / "forced" / "result.json").read_text())
    assert (res["dtype"], res["precision"]["asked"]) == ("bf16", "bf16") and res["precision"]["warning"] == warnings[0]


def test_a_cpu_with_native_bf16_keeps_training_in_bf16(pydocs, tmp_path):
    """Where oneDNN multiplies bf16 (AVX512-BF16, AMX), the probe finds bf16 faster than fp32 (about 0.2x on an AMD EPYC
    with avx512_bf16: 5x inside the rule's 1.0), and auto trains in bf16, Muon's Newton-Schulz included."""
    rep = cpu_report()
    if not (rep["bf16_instructions"] and rep["mkldnn_bf16"]):   # the hardware's flags, and oneDNN's dispatch
        pytest.skip(f"this CPU has no native bf16 ({rep}): test_the_probe_decides_both_ways covers the rule")
    p = probe_cpu_bf16()
    assert p["native"] and p["ratio"] < 1, p
    assert default_ns_dtype("cpu") == torch.bfloat16
    res = T.train("cpu-micro", pydocs, tmp_path / "r", steps=2, sets=["eval_tokens=8192", "batch_size=1"], verbose=False)
    assert res["dtype"] == "bf16" and res["precision"]["asked"] == "auto" and res["precision"]["probe"]["native"]


def test_an_emulating_cpu_runs_newton_schulz_in_fp32():
    "Muon's orthogonalisation asks the same question: an AVX2 interpreter runs it in fp32."
    if not X86: pytest.skip(f"AVX2_ENV only changes PyTorch's dispatch on x86, not on {platform.machine()}")
    code = "from neuronfrontier.engine.optim import default_ns_dtype; print(default_ns_dtype('cpu'), default_ns_dtype('neuron'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ | AVX2_ENV, check=True)
    assert r.stdout.split() == ["torch.float32", "torch.bfloat16"]


_RANKS_DISAGREE = """
import json, os, sys
import neuronfrontier.engine.precision as P
import neuronfrontier.run.trainer as T
rank = int(os.environ["RANK"])
P.probe_cpu_bf16 = lambda: json.loads(sys.argv[3 + rank])   # rank 0 finds bf16 native, rank 1 does not
r = T.train("cpu-micro", sys.argv[1], sys.argv[2], steps=2, sets=["eval_tokens=8192", "batch_size=1"], verbose=False)
(T.Path(sys.argv[2]) / f"rank{rank}.json").write_text(json.dumps(r))
"""


def test_ranks_train_in_one_dtype(pydocs, tmp_path):
    "Two ranks whose probes disagree both train in fp32: a job has one dtype."
    script, out = tmp_path / "ranks.py", tmp_path / "run"
    script.write_text(_RANKS_DISAGREE)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
                        str(pydocs), str(out), json.dumps(NATIVE), json.dumps(EMULATING)], capture_output=True, text=True,
                       cwd=ROOT, timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    r0, r1 = (json.loads((out / f"rank{i}.json").read_text()) for i in (0, 1))
    assert r0["dtype"] == r1["dtype"] == "fp32" and r0["precision"]["probe"]["native"]
    assert r0["precision"]["ns_dtype"] == r1["precision"]["ns_dtype"] == "fp32"   # Newton–Schulz agrees too
    assert "another rank has no native bf16" in r0["precision"]["why"]


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_a_resumed_run_keeps_its_dtype(pydocs, tmp_path):
    "A run started in the dtype auto would not pick here, resumed with dtype=auto, continues in the one it started in."
    other = "fp32" if choose_precision("auto", "cpu").dtype == "bf16" else "bf16"
    out, sets = tmp_path / "r", ["eval_tokens=8192", "batch_size=1"]
    T.train("cpu-micro", pydocs, out, steps=1, sets=sets + [f"dtype={other}"], verbose=False)
    res = T.train("cpu-micro", pydocs, out, steps=2, sets=sets, resume=True, verbose=False)
    assert res["steps"] == 2 and res["dtype"] == other and res["precision"]["why"].endswith(f"resumed in its own {other}")


def test_the_probe_times_real_fp32_and_bf16_matmuls_whatever_mode_it_is_asked_in(monkeypatch):
    """First asked inside the rehearsal's FakeTensorMode and under bf16 autocast (where `train_step` asks), the probe
    still multiplies real tensors, fp32 in fp32 (a fake matmul takes no time, an autocast one is bf16)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    import neuronfrontier.engine.precision as P
    seen, real = [], P._best_ms
    def spy(a, b, *args, **kw):
        seen.append((type(a), (a @ b).dtype))
        return real(a, b, *args, **kw)
    monkeypatch.setattr(P, "_best_ms", spy)
    P.probe_cpu_bf16.cache_clear()
    try:
        with FakeTensorMode(), torch.autocast("cpu", dtype=torch.bfloat16): P.probe_cpu_bf16()
    finally: P.probe_cpu_bf16.cache_clear()   # the next caller probes again, unspied
    assert seen == [(torch.Tensor, torch.float32), (torch.Tensor, torch.bfloat16)]
