"""`neuronfrontier rehearse`: a submission's own train.py and nf_kernels/ traced as trn2 would run them. It passes an
export, and it catches each class of failure on a built fixture: a kernel assert at the production shape only, a trn2
rule broken only at a large shape, a step that does not fit one rank's HBM, an op that escapes autocast — and the SwiGLU
backward of the previous release, which handed all of a rank's tokens to one kernel call."""
import json, shutil
from pathlib import Path

import pytest
from conftest import cli
from neuronfrontier.submission import shipping as S
from neuronfrontier.submission.rehearsal import rehearse, plan_batch, HBM_MARGIN, AUTOCAST_OPS


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    "cpu-micro as exported (dtype=auto: bf16 autocast on the chip), without the memory plan: 2 × 512 tokens per rank."
    return S.export("cpu-micro", tmp_path_factory.mktemp("rh") / "micro", fit=False, kernels=True)


def _edited(src: Path, dst: Path, rel: str, old: str, new: str) -> Path:
    "A copy of the submission with one edit in one shipped file (the edit must apply exactly once)."
    shutil.copytree(src, dst)
    f = dst / rel
    text = f.read_text()
    assert text.count(old) == 1, (rel, old)
    f.write_text(text.replace(old, new))
    return dst


def _failed(rep):
    return [c for c in rep["kernel_calls"] if not c["passed"]]


def test_rehearsal_passes_the_export(micro):
    rep = rehearse(micro, nproc=2, lnc=1)
    print(rep["summary"])
    assert rep["passed"] and not rep["failures"] and not rep["fallbacks"], rep["failures"]
    assert rep["dtype"] == "bf16"   # the export asks for auto, which the chip resolves to bf16 (this CPU may not)
    assert rep["backends"] == {"rms_norm": "nki", "swiglu": "nki", "relu2_mlp": "torch", "attention": "nki",
                               "cross_entropy": "nki", "moe_mlp": "torch"}
    calls = rep["kernel_calls"]
    # where a step's work runs: per op its calls, FLOPs and bytes (the simulator's); PyTorch's FLOPs counted beside
    w = rep["step_work"]
    assert set(w["ops"]) == {"rms_norm", "swiglu", "attention", "cross_entropy"}
    assert all(o["hbm_bytes"] > 0 for o in w["ops"].values()) and w["torch_matmul_flops"] > 0
    assert 0.5 < w["kernel_share"] < 1 and "of a step's matmul FLOPs in our kernels" in rep["summary"]
    kinds = {(c["op"], c["direction"]) for c in calls}
    assert kinds == {(op, d) for op in ("rms_norm", "swiglu", "attention", "cross_entropy") for d in ("fwd", "bwd")}
    # the production shapes of a rank (2 × 512 tokens), and bf16 on the TensorEngine for every op autocast lowers
    x_arg = {"shape": [1024, 128], "dtype": "bfloat16"}
    assert any(c["kernel"] == "swiglu_fwd_kernel[1]" and c["args"][0] == x_arg for c in calls)
    assert all(set(c["matmul_dtypes"]) == {"bfloat16"} for c in calls if c["op"] in AUTOCAST_OPS)
    m = rep["memory"]
    assert m["limit_bytes"] == int(12 * 2**30 * (1 - HBM_MARGIN)) and all(m["fits"].values())
    assert set(m["per_rank_bytes"]) == {"train step", "evaluation", "scorer forward"}
    assert json.loads((micro / "rehearsal.json").read_text())["summary"] == rep["summary"]


def test_a_kernel_assert_at_the_production_shape_only(micro, tmp_path):
    "A precondition the kernel tests' 256 tokens keep and a rank's 1,024 break: named; swiglu falls back to torch."
    keep = "    KT = d // PMAX\n    assert 2 * KT * F * _isz(x) <= W_BUDGET"   # the forward kernel's own check, then ours
    d = _edited(micro, tmp_path / "assert", "nf_kernels/kernels/swiglu.py", keep,
                "    KT = d // PMAX\n    assert N <= 512, f'{N} tokens: this kernel keeps at most 512'\n"
                "    assert 2 * KT * F * _isz(x) <= W_BUDGET")
    rep = rehearse(d, nproc=2, lnc=1)
    bad = _failed(rep)
    assert not rep["passed"] and bad and {c["kernel"] for c in bad} == {"swiglu_fwd_kernel[1]"}
    assert bad[0]["reason"] == "AssertionError: 1024 tokens: this kernel keeps at most 512"
    assert rep["fallbacks"] == {"swiglu": bad[0]["reason"]} and rep["backends"]["swiglu"] == "torch"
    assert rep["failures"][0].startswith("swiglu_fwd_kernel[1] (neuronfrontier::swiglu_fwd, fwd, bfloat16[1024, 128]")


def test_a_trn2_rule_broken_only_at_a_large_shape(micro, tmp_path):
    "An SBUF tile that grows with the rows: 64 KiB a partition at 256 rows, over the 192 KiB budget at a rank's 1,024."
    fwd = "    rstd = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)\n    w_bc = _w_broadcast(w, d)\n"
    d = _edited(micro, tmp_path / "sbuf", "nf_kernels/kernels/rmsnorm.py", fwd,
                fwd + "    grows = nl.ndarray((PMAX, N * 64), dtype=nl.float32, buffer=nl.sbuf)\n")
    rep = rehearse(d, nproc=2, lnc=1)
    bad = _failed(rep)
    assert not rep["passed"] and bad[0]["kernel"] == "rmsnorm_fwd_kernel[1]", rep["failures"]
    assert bad[0]["reason"].startswith("NKIConstraintError: nl.ndarray: SBUF tensor")
    assert "exceeding the SBUF budget" in bad[0]["reason"]
    assert rep["backends"]["rms_norm"] == "torch"


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_a_step_that_does_not_fit_one_ranks_hbm(micro, tmp_path):
    "The same export against 32 MiB of HBM a rank fails on memory, by the CLI too (exit 1); the plan finds what fits."
    rep = rehearse(micro, nproc=2, lnc=1, out=tmp_path / "r.json", hbm_bytes=32 * 2**20)
    assert not rep["passed"] and not _failed(rep), rep["failures"]
    mem = [f for f in rep["failures"] if f.startswith("memory: the train step needs")]
    assert mem and "lower batch_size and raise grad_accum" in mem[0]
    r = cli("rehearse", micro, "--hbm-gib", "0.03125", "--out", tmp_path / "cli.json")
    assert r.returncode == 1 and "rehearsal FAILED" in r.stdout and "OVER" in r.stdout, r.stdout + r.stderr
    assert "kit run n/a: no data to run it on here" in r.stdout, r.stdout   # exported without data: nothing to run on
    # the plan: with room for the 2-row step it keeps it; with just less, 1 row × 2 accumulation steps (same rows)
    full = plan_batch(micro, nproc=2, lnc=1)
    assert (full["batch_size"], full["grad_accum"]) == (2, 1)
    need = max(full["tried"][0]["peak_bytes"].values())   # the training step's peak, kernels or PyTorch ops
    tight = plan_batch(micro, nproc=2, lnc=1, hbm_bytes=int((need - 1) / (1 - HBM_MARGIN)) + 1)
    assert (tight["batch_size"], tight["grad_accum"]) == (1, 2), tight
    assert max(tight["tried"][-1]["peak_bytes"].values()) < need


def test_an_op_that_escapes_autocast(micro, tmp_path):
    "Without the wrapper's cast, SwiGLU gets the fp32 RMSNorm output under bf16 autocast: fp32 matmuls, a failure."
    cast = "    x = x.to(ops.kernel_dtype(x))   # autocast's dtype: a custom operator is not autocast\n"
    d = _edited(micro, tmp_path / "fp32", "nf_kernels/kernels/swiglu.py", cast, "")
    rep = rehearse(d, nproc=2, lnc=1)
    bad = _failed(rep)
    assert not rep["passed"], rep["summary"]
    assert {c["kernel"] for c in bad} == {"swiglu_fwd_kernel[1]", "swiglu_bwd_kernel[1]"}, rep["failures"]
    for c in bad: assert c["matmul_dtypes"] == {"float32": 1.0} and "float32 matmuls under bf16 autocast" in c["reason"]


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_the_previous_swiglu_backward_fails_at_768_wide(tmp_path):
    """The backward as the previous release launched it — every token of the rank in one call — at d_model 768
    (dense-124m's width) and 4,096 tokens a rank: its own SBUF precondition refuses it; the rehearsal names it."""
    d = S.export("cpu-tiny", tmp_path / "wide", recipe="frontier", sets=["d_model=768"], fit=False, kernels=True)   # SwiGLU
    chunked = ("        return swiglu_backward(x, wg, wu, dh, launch(swiglu_bwd_kernel), logical_cores())"
               "   # dW: fp32 sums\n")
    whole = ("        dx, g, u = swiglu_bwd_kernel[logical_cores()](x, wg, wu, dh)\n"   # directly, as then
             "        return dx, g.sum(0), u.sum(0)\n")
    old = _edited(d, tmp_path / "old", "nf_kernels/kernels/swiglu.py", chunked, whole)
    assert rehearse(d, nproc=8, lnc=1)["passed"]   # the chunked backward of this release
    rep = rehearse(old, nproc=8, lnc=1)
    assert not rep["passed"] and {c["launched"] for c in _failed(rep)} == {"direct"}
    assert rep["failures"][0] == ("swiglu_bwd_kernel[1] (neuronfrontier::swiglu_bwd, bwd, bfloat16[4096, 768], "
                                  "bfloat16[768, 768], bfloat16[768, 768], bfloat16[4096, 768]): AssertionError: "
                                  "32 token tiles at d=768: resident x, xᵀ, dx exceed 98304 B/partition"), rep


@pytest.mark.slow
def test_dense_124m_export_rehearses_at_production_shapes(tmp_path):
    "dense-124m exported for 8 ranks at LNC 1 (fitted) rehearses: every kernel call passes in bf16, the memory fits."
    r = cli("export", "--config", "dense-124m", "--kernels", "--out", tmp_path / "sub")
    assert r.returncode == 0 and "memory per rank:" in r.stdout, r.stdout + r.stderr
    r = cli("rehearse", tmp_path / "sub")
    print(r.stdout)
    assert r.returncode == 0 and "rehearsal passed" in r.stdout, r.stdout + r.stderr
    rep = json.loads((tmp_path / "sub" / "rehearsal.json").read_text())
    assert rep["per_rank"]["batch_size"] * rep["per_rank"]["grad_accum"] == 16 and rep["per_rank"]["seq_len"] == 2048
    assert all(set(c["matmul_dtypes"]) == {"bfloat16"} for c in rep["kernel_calls"] if c["op"] in AUTOCAST_OPS)


@pytest.mark.slow
def test_the_default_export_is_trn2_124m_and_rehearses(tmp_path):
    """`export` with no --config writes trn2-124m (K82s4's shape and recipe) on PyTorch's ops: under the portal's size,
    fitted, rehearsed; with --kernels the same export ships the kernels, and the rehearsal runs every call of them."""
    r = cli("export", "--out", tmp_path / "plain")
    assert r.returncode == 0 and "memory per rank:" in r.stdout, r.stdout + r.stderr
    src = (tmp_path / "plain" / "train.py").read_text()
    assert "CONFIG = 'trn2-124m'" in src and "'kernels=torch'" in src and not (tmp_path / "plain" / "nf_kernels").exists()
    assert (tmp_path / "plain" / "train.py").stat().st_size < 262_144
    r = cli("rehearse", tmp_path / "plain", "--no-kit-run")
    assert r.returncode == 0 and "rehearsal passed" in r.stdout, r.stdout + r.stderr
    r = cli("export", "--kernels", "--out", tmp_path / "sub")
    assert r.returncode == 0 and (tmp_path / "sub" / "train.py").stat().st_size < 262_144, r.stdout + r.stderr
    r = cli("rehearse", tmp_path / "sub")
    print(r.stdout)
    assert r.returncode == 0 and "rehearsal passed" in r.stdout, r.stdout + r.stderr
    rep = json.loads((tmp_path / "sub" / "rehearsal.json").read_text())
    assert rep["per_rank"]["batch_size"] * rep["per_rank"]["grad_accum"] == 32 and rep["per_rank"]["seq_len"] == 1024
    assert rep["per_rank"]["grad_accum"] % 4 == 0   # the batch warm-up's quarter step is a whole micro-batch
    # attention on the NKI kernels: 4 query heads of 256 on one K/V head (V per query head in the value-embedding
    # layers), every call passing in bf16
    assert rep["backends"]["attention"] == "nki" and not rep["fallbacks"]
    calls = [c for c in rep["kernel_calls"] if c["op"] == "attention"]
    assert {c["direction"] for c in calls} == {"fwd", "bwd"} and all(c["passed"] for c in calls)
    assert {tuple(c["args"][1]["shape"]) for c in calls} == {(8, 256, 1024)}           # kᵀ: 8 rows × 1 K/V head
    assert {tuple(c["args"][2]["shape"]) for c in calls} == {(8, 1024, 256), (32, 1024, 256)}   # v: 1 or 4 heads
    assert all(set(c["matmul_dtypes"]) == {"bfloat16"} for c in calls)
