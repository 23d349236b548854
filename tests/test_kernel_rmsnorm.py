"""ops.rms_norm with backend nki-sim against the torch backend on shapes the notebook does not show."""
import pytest, torch
from neuronfrontier import ops
from neuronfrontier.sim import REAL_NKI
from neuronfrontier.kernels.rmsnorm import compare_backends, rms_norm_nki_sim, TOL, traffic

pytestmark = pytest.mark.skipif(REAL_NKI, reason='simulator tests (a real NKI is installed)')


@pytest.mark.parametrize("shape", [(1, 64), (129, 512), (2, 3, 100, 384), (4, 257, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(shape, dtype):
    e = compare_backends(shape, dtype, seed=1)
    assert max(e.values()) <= TOL[dtype], e


def test_mixed_dtypes_and_eps():
    "bf16 activations with an fp32 gain (the model under bf16 autocast), and a large eps."
    e = compare_backends((130, 256), torch.bfloat16, eps=1e-2, w_dtype=torch.float32, seed=2)
    assert max(e.values()) <= TOL[torch.bfloat16], e


def test_backend_routing_and_grad_flag():
    x = torch.randn(3, 128, requires_grad=True); w = torch.ones(128, requires_grad=True)
    with ops.use_backend("rms_norm=nki-sim"):
        assert ops.resolve("rms_norm") == "nki-sim"
        y = ops.rms_norm(x, w)
    assert y.requires_grad and y.grad_fn is not None
    with torch.no_grad(), ops.use_backend("rms_norm=nki-sim"):
        assert not ops.rms_norm(x, w).requires_grad


@pytest.mark.parametrize("x,w,msg", [
    (torch.randn(2, 3584), torch.ones(3584), "d=3584 > 3072"),
    (torch.randn(2, 64), torch.ones(32), "weight shape (32,)"),
    (torch.randn(2, 64).half(), torch.ones(64), "fp32 or bf16"),
    (torch.randn(0, 64), torch.ones(64), "no rows"),
])
def test_clear_errors(x, w, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")) as e:
        rms_norm_nki_sim(x, w)
    assert "rms_norm" in str(e.value)


def test_traffic_is_compulsory():
    t = traffic(200, 640)
    for k in ("fwd", "bwd"):
        assert t[k]["trace"].hbm_bytes <= 1.1 * t[k]["compulsory"]
        assert t[k]["trace"].hbm_bytes < t[k]["unfused"]
