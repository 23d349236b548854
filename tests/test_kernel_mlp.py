"""ops.relu2_mlp with backend nki-sim against the torch backend on shapes the notebook does not show."""
import numpy as np
import pytest, torch
from neuronfrontier import ops
from neuronfrontier.hw import INSTRUCTION_LIMIT
from neuronfrontier.sim import REAL_NKI, nl
from neuronfrontier.chip.testing import compare_backends, traffic
from neuronfrontier.kernels import mlp
from neuronfrontier.kernels.mlp import (relu2_mlp_nki_sim, relu2_inputs, TOL, hbm_traffic, relu2_mlp_fwd_kernel,
                                        relu2_mlp_bwd_kernel, _register_nki, NKI_REGISTERED)

pytestmark = pytest.mark.skipif(REAL_NKI, reason='simulator tests (a real NKI is installed)')


def errors(n, d, f, dtype, leak, seed=0, lead=(), backend="nki-sim"):
    "Forward and gradient errors; bf16 against an fp32 reference on the same values."
    ref = torch.float32 if dtype == torch.bfloat16 else None
    return compare_backends("relu2_mlp", *relu2_inputs(n, d, f, dtype, seed, lead), leak=leak, ref_dtype=ref,
                            seed=seed, backend=backend)


@pytest.mark.parametrize("n,d,f,lead,dtype,leak", [
    (129, 256, 384, (), torch.float32, 0.35),
    (129, 256, 384, (), torch.bfloat16, 0.0),
    (70, 128, 640, (2,), torch.float32, 0.0),
    (70, 128, 640, (2,), torch.bfloat16, 0.35),
    (300, 640, 256, (), torch.float32, 0.0),
    (300, 640, 256, (), torch.bfloat16, 0.35),
])
def test_matches_torch(n, d, f, lead, dtype, leak):
    "Odd token counts (a partial last tile), d and F above 512 (several PSUM banks), α 0 and 0.35, fp32 and bf16."
    e = errors(n, d, f, dtype, leak, seed=3, lead=lead)
    assert max(e.values()) <= TOL[dtype], e


@pytest.mark.parametrize("dtype,leak", [(torch.bfloat16, 0.35), (torch.float32, 0.0)])
def test_production_width_few_tokens(dtype, leak):
    "d 1,024, F 4,096 (the trn2 recipe's MLP) on 130 tokens: a partial tile; fp32 splits F into two forward calls."
    e = errors(130, 1024, 4096, dtype, leak, seed=4)
    assert max(e.values()) <= TOL[dtype], e


@pytest.mark.parametrize("lnc,n", [("1", 300), ("2", 300), ("2", 100)])
def test_one_or_two_logical_cores(monkeypatch, lnc, n):
    "100 tokens on 2 cores leave one core without a tile: it writes zero weight gradients."
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    e = errors(n, 128, 256, torch.float32, 0.35, seed=5)
    assert max(e.values()) <= TOL[torch.float32], e


def test_token_chunks_and_column_blocks(monkeypatch):
    "Force the wrapper's splitting paths (several backward calls, several forward blocks) and check the result."
    monkeypatch.setattr(mlp, "bwd_chunk", lambda d, s, lnc=1: 128)
    monkeypatch.setattr(mlp, "fwd_block", lambda d, f, s: 128)
    for dtype in (torch.float32, torch.bfloat16):
        e = errors(300, 128, 384, dtype, 0.35, seed=6)
        assert max(e.values()) <= TOL[dtype], e


def test_mixed_weight_dtype():
    "bf16 activations with fp32 master weights: gradients come back in the weights' dtype."
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    wu, wd = (torch.randn(384, 256) / 16).requires_grad_(), (torch.randn(256, 384) / 20).requires_grad_()
    y = ops.relu2_mlp(x, wu, wd, 0.35, opset=ops.OpSet("relu2_mlp=nki-sim"))
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and wu.grad.dtype == wd.grad.dtype == torch.float32
    assert x.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("args,msg", [
    ((torch.randn(4, 100), torch.randn(128, 100), torch.randn(100, 128)), "d=100 and d_mlp=128 must be multiples of 128"),
    ((torch.randn(4, 128), torch.randn(200, 128), torch.randn(128, 200)), "d=128 and d_mlp=200 must be multiples of 128"),
    ((torch.randn(4, 128), torch.randn(256, 128), torch.randn(256, 128)), r"w_down \(256, 128\) must be"),
    ((torch.randn(4, 128).half(), torch.randn(128, 128), torch.randn(128, 128)), "fp32 or bf16"),
    ((torch.randn(4, 128), torch.randn(128, 128), torch.randn(128, 128), 1.5), r"\|leak\| ≤ 1"),
    ((torch.randn(4, 16384), torch.randn(128, 16384), torch.randn(16384, 128)), "exceed SBUF"),
])
def test_clear_errors(args, msg):
    "A shape, dtype or slope the kernels do not take: one line naming the op, the rule and a way out."
    with pytest.raises(ValueError, match=msg) as e:
        relu2_mlp_nki_sim(*args)
    text = str(e.value)
    assert text.startswith("ops.relu2_mlp (nki-sim): ") and "\n" not in text
    assert any(fix in text for fix in ("kernels=relu2_mlp=torch", "nn.Linear weights as they are"))


@pytest.mark.parametrize("lnc", [1, 2])
def test_traffic_model_equals_simulator(monkeypatch, lnc):
    "hbm_traffic's `kernel` bytes are the traced bytes of the wrapper's calls, forward blocks and backward chunks too."
    monkeypatch.setattr(mlp, "bwd_chunk", lambda d, s, lnc=1: 256 * lnc)
    monkeypatch.setattr(mlp, "fwd_block", lambda d, f, s: 256)
    x, wu, wd = relu2_inputs(700, 256, 512, torch.bfloat16)
    for key, kernel in (("fwd", relu2_mlp_fwd_kernel), ("bwd", relu2_mlp_bwd_kernel)):
        trs = []
        def launch(*a, k=kernel):
            trs.append(traffic(k[lnc], *a))
            return mlp.simulate(k[lnc])(*a)
        if key == "fwd": mlp.relu2_forward(x, wu, wd, 0.35, launch)
        else: mlp.relu2_backward(x, wu, wd, x, 0.35, launch, lnc)
        assert sum(t.hbm_bytes for t in trs) == hbm_traffic(700, 256, 512, 2, lnc)[key]["kernel"], key
        assert len(trs) == (2 if key == "fwd" else 4 - lnc)   # 700 tokens in chunks of 256 per core


@pytest.mark.parametrize("lnc", [1, 2])
def test_production_forward_moves_compulsory_bytes(lnc):
    "At the production shapes (8,192 tokens, d 1,024, F 4,096, bf16) the forward's traced bytes are its compulsory ones."
    bf = lambda *s: np.empty(s, nl.bfloat16)
    tr = traffic(relu2_mlp_fwd_kernel[lnc], bf(8192, 1024), bf(4096, 1024), bf(1024, 4096), 0.35, False, dry=True)
    m = hbm_traffic(8192, 1024, 4096, 2, lnc)
    assert tr.hbm_bytes == m["fwd"]["kernel"] == m["fwd"]["compulsory"]
    assert tr.peak_sbuf_bytes <= mlp.SBUF_PP and tr.max_program_instructions < INSTRUCTION_LIMIT / 100


def test_nki_backend_wiring_with_a_custom_op_stand_in(fake_torch_neuronx):
    "The `nki` backend's wiring (custom ops, register_autograd, kernel[lnc]) with torch.library.custom_op for nki_op."
    assert NKI_REGISTERED is False
    assert _register_nki(fake_torch_neuronx)
    try:
        e = errors(200, 256, 384, torch.float32, 0.35, seed=7, backend="nki")
        assert max(e.values()) <= TOL[torch.float32], e
    finally:
        ops._IMPLS["relu2_mlp"].pop("nki", None)


def test_nki_backend_honours_autocast(fake_torch_neuronx):
    """Under bf16 autocast the `nki` wrapper hands the kernels bf16 activations and weights, the TensorEngine multiplies
    bf16 only, and the weights' gradients come back fp32 (the parameters' dtype), close to autocast's torch path."""
    assert _register_nki(fake_torch_neuronx)
    standin = fake_torch_neuronx.standin
    try:
        x, wu, wd = relu2_inputs(256, 256, 512, seed=8)
        grads = {}
        for backend in ("torch", "nki"):
            xs, us, ds = (t.clone().requires_grad_() for t in (x, wu, wd))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = ops.relu2_mlp(xs, us, ds, 0.35, opset=ops.OpSet(f"relu2_mlp={backend}"))
            assert y.dtype == torch.bfloat16
            y.float().square().mean().backward()
            grads[backend] = (xs.grad, us.grad, ds.grad)
        assert [c.direction for c in standin.calls] == ["fwd", "bwd"]
        for c in standin.calls:
            assert all(a[1] == "torch.bfloat16" for a in c.args if isinstance(a, tuple)), c.args
            assert set(c.matmul_flops) == {"bfloat16"}, c.matmul_flops
        for a, b in zip(grads["nki"], grads["torch"]):
            assert a.dtype == b.dtype == torch.float32
            assert (a - b).abs().max() <= 3e-2 * b.abs().max(), (a - b).abs().max()
    finally:
        ops._IMPLS["relu2_mlp"].pop("nki", None)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_production_shape(dtype):
    "A rank's micro-batch at the trn2 recipe: 8,192 tokens, d 1,024, F 4,096, α 0.35, forward and backward (~45 s each)."
    e = errors(8192, 1024, 4096, dtype, 0.35)
    assert max(e.values()) <= TOL[dtype], e
