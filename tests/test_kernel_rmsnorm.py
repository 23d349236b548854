"""ops.rms_norm with backend nki-sim against the torch backend on shapes the notebook does not show."""
import pytest, torch
from neuronfrontier import ops
from neuronfrontier.sim import REAL_NKI, simulate
from neuronfrontier.chip.testing import compare_backends, traffic
from neuronfrontier.kernels.rmsnorm import (rms_norm_nki_sim, rmsnorm_fwd_kernel, rmsnorm_bwd_kernel, TOL,
                                            hbm_traffic, _register_nki, NKI_REGISTERED)

pytestmark = pytest.mark.skipif(REAL_NKI, reason='simulator tests (a real NKI is installed)')


def _inputs(shape, dtype, w_dtype=None, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype), (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(w_dtype or dtype)


@pytest.mark.parametrize("shape", [(1, 64), (129, 512), (2, 3, 100, 384), (4, 257, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(shape, dtype):
    e = compare_backends("rms_norm", *_inputs(shape, dtype))
    assert max(e.values()) <= TOL[dtype], e


def test_mixed_dtypes_and_eps():
    "bf16 activations with an fp32 gain (the model under bf16 autocast), and a large eps."
    e = compare_backends("rms_norm", *_inputs((130, 256), torch.bfloat16, torch.float32, seed=2), eps=1e-2)
    assert max(e.values()) <= TOL[torch.bfloat16], e


@pytest.mark.parametrize("lnc", ["1", "2"])
def test_one_or_two_logical_cores(monkeypatch, lnc):
    "The wrapper launches kernel[NEURON_LOGICAL_NC_CONFIG]; both splits give the torch result (3 row tiles: 1 + 2 at LNC=2)."
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    e = compare_backends("rms_norm", *_inputs((300, 256), torch.float32, seed=3))
    assert max(e.values()) <= TOL[torch.float32], e


def test_backend_routing_and_grad_flag():
    x = torch.randn(3, 128, requires_grad=True); w = torch.ones(128, requires_grad=True)
    opset = ops.OpSet("rms_norm=nki-sim")
    assert opset.backend_for("rms_norm") == "nki-sim"
    y = ops.rms_norm(x, w, opset=opset)
    assert y.requires_grad and y.grad_fn is not None
    with torch.no_grad():
        assert not ops.rms_norm(x, w, opset=opset).requires_grad


@pytest.mark.parametrize("x,w,msg", [
    (torch.randn(2, 3584), torch.ones(3584), "d=3584 > 3072"),
    (torch.randn(2, 64), torch.ones(32), "weight shape (32,)"),
    (torch.randn(2, 64).half(), torch.ones(64), "fp32 or bf16"),
    (torch.randn(0, 64), torch.ones(64), "no rows"),
])
def test_clear_errors(x, w, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")) as e:
        rms_norm_nki_sim(x, w)
    assert "ops.rms_norm (nki-sim)" in str(e.value)


@pytest.mark.parametrize("lnc", [1, 2])
def test_traffic_is_compulsory(lnc):
    x, w = (torch.randn(200, 640).to(torch.bfloat16), torch.ones(1, 640, dtype=torch.bfloat16))
    _, rstd = simulate(rmsnorm_fwd_kernel[lnc])(x, w, 1e-6)
    t = dict(fwd=traffic(rmsnorm_fwd_kernel[lnc], x, w, 1e-6), bwd=traffic(rmsnorm_bwd_kernel[lnc], x, w, rstd, x))
    m = hbm_traffic(200, 640, 2, lnc)
    for k in ("fwd", "bwd"):
        assert t[k].hbm_bytes == m[k]["compulsory"] < m[k]["unfused"]


def test_nki_backend_wiring_with_a_custom_op_stand_in(fake_torch_neuronx):
    "The `nki` backend's wiring (custom ops, register_autograd, kernel[lnc]) with torch.library.custom_op for nki_op."
    assert NKI_REGISTERED is False
    assert _register_nki(fake_torch_neuronx)
    try:
        e = compare_backends("rms_norm", *_inputs((200, 256), torch.float32, seed=4), backend="nki")
        assert max(e.values()) <= TOL[torch.float32], e
    finally:
        ops._IMPLS["rms_norm"].pop("nki", None)


@pytest.mark.parametrize("shape", [(1, 64), (129, 512), (2, 3, 100, 256), (4, 257, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_gain_matches_torch(shape, dtype):
    "weight=None: x·r, forward and dx, against the torch backend (x / rms without a gain)."
    x, _ = _inputs(shape, dtype, seed=5)
    e = compare_backends("rms_norm", x, None)
    assert set(e) == {"out", "dx"} and max(e.values()) <= TOL[dtype], e


@pytest.mark.parametrize("lnc", [1, 2])
def test_no_gain_loads_no_gain_and_reduces_no_dw(lnc):
    """Without a gain the kernels read no gain and write no dw (the compulsory bytes of hbm_traffic(gain=False)), and
    have no TensorEngine instruction (the gain's broadcast, dw's row sums): fewer instructions than with a gain."""
    x = torch.randn(200, 640).to(torch.bfloat16)
    w = torch.ones(1, 640, dtype=torch.bfloat16)
    _, rstd = simulate(rmsnorm_fwd_kernel[lnc])(x, None, 1e-6)
    bare = dict(fwd=traffic(rmsnorm_fwd_kernel[lnc], x, None, 1e-6), bwd=traffic(rmsnorm_bwd_kernel[lnc], x, None, rstd, x))
    gain = dict(fwd=traffic(rmsnorm_fwd_kernel[lnc], x, w, 1e-6), bwd=traffic(rmsnorm_bwd_kernel[lnc], x, w, rstd, x))
    m, mg = hbm_traffic(200, 640, 2, lnc, gain=False), hbm_traffic(200, 640, 2, lnc)
    for k in ("fwd", "bwd"):
        assert bare[k].hbm_bytes == m[k]["compulsory"] < mg[k]["compulsory"] == gain[k].hbm_bytes
        assert "tensor" not in bare[k].engine_instructions and gain[k].engine_instructions["tensor"] > 0
        assert bare[k].max_program_instructions < gain[k].max_program_instructions
        assert m[k]["compulsory"] < m[k]["unfused"]


def test_no_gain_through_the_nki_op(fake_torch_neuronx):
    "The `nki` backend without a gain: its own custom operators, the kernels launched with w=None."
    assert _register_nki(fake_torch_neuronx)
    try:
        x, _ = _inputs((200, 256), torch.float32, seed=6)
        e = compare_backends("rms_norm", x, None, backend="nki")
        assert max(e.values()) <= TOL[torch.float32], e
        calls = fake_torch_neuronx.standin.calls
        assert {(c.kernel, c.args[1]) for c in calls} == {("rmsnorm_fwd_kernel", "None"), ("rmsnorm_bwd_kernel", "None")}
    finally:
        ops._IMPLS["rms_norm"].pop("nki", None)
