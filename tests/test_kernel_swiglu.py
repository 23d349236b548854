"""ops.swiglu with backend nki-sim against the torch backend on shapes the notebook does not show."""
import pytest, torch
from neuronfrontier import ops
from neuronfrontier.sim import REAL_NKI
from neuronfrontier.chip.testing import compare_backends, traffic, train_losses
from neuronfrontier.kernels.swiglu import (swiglu_nki_sim, swiglu_inputs, TOL, hbm_traffic, bwd_chunk, fwd_block,
                                           swiglu_fwd_kernel, swiglu_bwd_kernel, _register_nki, NKI_REGISTERED)

pytestmark = pytest.mark.skipif(REAL_NKI, reason='simulator tests (a real NKI is installed)')


@pytest.mark.parametrize("n,d,f,lead", [(1, 128, 128, ()), (129, 384, 640, ()), (70, 256, 1024, (2,)), (300, 512, 384, ())])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(n, d, f, lead, dtype):
    e = compare_backends("swiglu", *swiglu_inputs(n, d, f, dtype, seed=3, lead=lead), seed=3)
    assert max(e.values()) <= TOL[dtype], e


@pytest.mark.parametrize("lnc", ["1", "2"])
def test_one_or_two_logical_cores(monkeypatch, lnc):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    e = compare_backends("swiglu", *swiglu_inputs(300, 256, 384, seed=5), seed=5)
    assert max(e.values()) <= TOL[torch.float32], e


def test_mixed_weight_dtype():
    "bf16 activations with fp32 master weights: gradients come back in the weights' dtype."
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    wg = (torch.randn(384, 256) / 16).requires_grad_(); wu = (torch.randn(384, 256) / 16).requires_grad_()
    h = ops.swiglu(x, wg, wu, opset=ops.OpSet("swiglu=nki-sim"))
    h.float().sum().backward()
    assert h.dtype == torch.bfloat16 and wg.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16


def test_token_chunks_and_column_blocks(monkeypatch):
    "Force the wrapper's splitting paths (several backward calls, several forward blocks) and check the result."
    import neuronfrontier.kernels.swiglu as sw
    monkeypatch.setattr(sw, "bwd_chunk", lambda d, s, lnc=1: 128)
    monkeypatch.setattr(sw, "fwd_block", lambda d, f, s: 128)
    e = compare_backends("swiglu", *swiglu_inputs(300, 128, 384, seed=4), seed=4)
    assert max(e.values()) <= TOL[torch.float32], e


@pytest.mark.parametrize("x,wg,wu,msg", [
    (torch.randn(4, 100), torch.randn(128, 100), torch.randn(128, 100), "multiples of 128"),
    (torch.randn(4, 128), torch.randn(200, 128), torch.randn(200, 128), "multiples of 128"),
    (torch.randn(4, 128), torch.randn(128, 256), torch.randn(128, 256), "must both be"),
    (torch.randn(4, 128).half(), torch.randn(128, 128), torch.randn(128, 128), "fp32 or bf16"),
    (torch.randn(4, 16384), torch.randn(128, 16384), torch.randn(128, 16384), "SBUF budget"),
])
def test_clear_errors(x, wg, wu, msg):
    with pytest.raises(ValueError, match=msg) as e:
        swiglu_nki_sim(x, wg, wu)
    assert "ops.swiglu (nki-sim)" in str(e.value)


@pytest.mark.parametrize("lnc", [1, 2])
def test_traffic_is_compulsory(lnc):
    x, wg, wu = swiglu_inputs(160, 256, 384, torch.bfloat16)
    dh = torch.randn(160, 384).to(torch.bfloat16)
    t = dict(fwd=traffic(swiglu_fwd_kernel[lnc], x, wg, wu), bwd=traffic(swiglu_bwd_kernel[lnc], x, wg, wu, dh))
    m = hbm_traffic(160, 256, 384, 2, lnc)
    for k in ("fwd", "bwd"):
        assert t[k].hbm_bytes == m[k]["compulsory"] < m[k]["unfused"]


def test_split_sizes():
    assert fwd_block(768, 3072, 2) == 3072 and fwd_block(4096, 4096, 2) == 1024
    assert bwd_chunk(768, 2) == 16 * 128 and bwd_chunk(2048, 4) == 4 * 128 and bwd_chunk(768, 2, 2) == 32 * 128


def test_nki_backend_wiring_with_a_custom_op_stand_in(fake_torch_neuronx):
    "The `nki` backend's wiring (custom ops, register_autograd, kernel[lnc]) with torch.library.custom_op for nki_op."
    assert NKI_REGISTERED is False
    assert _register_nki(fake_torch_neuronx)
    try:
        e = compare_backends("swiglu", *swiglu_inputs(200, 256, 384, seed=6), backend="nki", seed=6)
        assert max(e.values()) <= TOL[torch.float32], e
    finally:
        ops._IMPLS["swiglu"].pop("nki", None)


@pytest.mark.slow
def test_cpu_tiny_training_matches_torch():
    "cpu-tiny, 10 AdamW steps, fp32: the nki-sim kernels give the torch losses within 1e-4 (observed ~1e-6)."
    ref = train_losses("cpu-tiny", "torch")
    sim = train_losses("cpu-tiny", "rms_norm=nki-sim,swiglu=nki-sim")
    assert ref[-1] < ref[0] - 0.5, ref          # it learns
    assert max(abs(a - b) for a, b in zip(ref, sim)) <= 1e-4, (ref, sim)


def test_cpu_micro_bf16_training_close_to_torch():
    "cpu-micro with bf16 parameters, 5 steps: the backends round differently; losses agree to 1e-3 relative."
    ref = train_losses("cpu-micro", "torch", steps=5, dtype=torch.bfloat16)
    sim = train_losses("cpu-micro", "rms_norm=nki-sim,swiglu=nki-sim", steps=5, dtype=torch.bfloat16)
    assert all(abs(a - b) <= 1e-3 * abs(a) for a, b in zip(ref, sim)), (ref, sim)


def test_nki_backend_honours_autocast(fake_torch_neuronx):
    """Under bf16 autocast the `nki` wrapper hands the kernels bf16 activations and weights (a custom operator is not
    autocast: without the cast they would get the fp32 RMSNorm output), the TensorEngine multiplies bf16, and the
    weights' gradients come back fp32 — the parameters' dtype — close to autocast's own F.linear path."""
    assert _register_nki(fake_torch_neuronx)
    standin = fake_torch_neuronx.standin
    try:
        x, wg, wu = swiglu_inputs(256, 256, 384, seed=7)
        grads = {}
        for backend in ("torch", "nki"):
            xs, gs, us = (t.clone().requires_grad_() for t in (x, wg, wu))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = ops.swiglu(xs, gs, us, opset=ops.OpSet(f"swiglu={backend}"))
            assert h.dtype == torch.bfloat16
            h.float().square().mean().backward()
            grads[backend] = (xs.grad, gs.grad, us.grad)
        assert [c.direction for c in standin.calls] == ["fwd", "bwd"]
        for c in standin.calls:
            assert all(a[1] == "torch.bfloat16" for a in c.args), c.args
            assert set(c.matmul_flops) == {"bfloat16"}, c.matmul_flops
        for a, b in zip(grads["nki"], grads["torch"]):
            assert a.dtype == b.dtype == torch.float32
            assert (a - b).abs().max() <= 3e-2 * b.abs().max(), (a - b).abs().max()
    finally:
        ops._IMPLS["swiglu"].pop("nki", None)
