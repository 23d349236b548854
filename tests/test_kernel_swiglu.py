"""ops.swiglu with backend nki-sim against the torch backend on shapes the notebook does not show."""
import pytest, torch
from neuronfrontier import ops
from neuronfrontier.sim import REAL_NKI
from neuronfrontier.kernels.swiglu import (compare_backends, swiglu_nki_sim, TOL, traffic, bwd_chunk, fwd_block)

pytestmark = pytest.mark.skipif(REAL_NKI, reason='simulator tests (a real NKI is installed)')


@pytest.mark.parametrize("n,d,f,lead", [(1, 128, 128, ()), (129, 384, 640, ()), (70, 256, 1024, (2,)), (300, 512, 384, ())])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(n, d, f, lead, dtype):
    e = compare_backends(n, d, f, dtype, seed=3, lead=lead)
    assert max(e.values()) <= TOL[dtype], e


def test_mixed_weight_dtype():
    "bf16 activations with fp32 master weights: gradients come back in the weights' dtype."
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    wg = (torch.randn(384, 256) / 16).requires_grad_(); wu = (torch.randn(384, 256) / 16).requires_grad_()
    with ops.use_backend("swiglu=nki-sim"):
        h = ops.swiglu(x, wg, wu)
    h.float().sum().backward()
    assert h.dtype == torch.bfloat16 and wg.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16


def test_token_chunks_and_column_blocks(monkeypatch):
    "Force the wrapper's splitting paths (several backward calls, several forward blocks) and check the result."
    import neuronfrontier.kernels.swiglu as sw
    monkeypatch.setattr(sw, "bwd_chunk", lambda d, s: 128)
    monkeypatch.setattr(sw, "fwd_block", lambda d, f, s: 128)
    e = compare_backends(300, 128, 384, torch.float32, seed=4)
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
    assert "swiglu" in str(e.value)


def test_traffic_is_compulsory():
    t = traffic(160, 256, 384)
    for k in ("fwd", "bwd"):
        assert t[k]["trace"].hbm_bytes <= 1.1 * t[k]["compulsory"]
        assert t[k]["trace"].hbm_bytes < t[k]["unfused"]


def test_split_sizes():
    assert fwd_block(768, 3072, 2) == 3072 and fwd_block(4096, 4096, 2) == 1024
    assert bwd_chunk(768, 2) == 16 * 128 and bwd_chunk(2048, 4) == 4 * 128


def _train_losses(config, spec, steps=10, batch=4, seed=0, dtype=torch.float32):
    from dataclasses import replace
    from neuronfrontier.model import GPT
    from neuronfrontier.config import CONFIGS
    cfg = replace(CONFIGS[config], seq_len={"cpu-micro": 128, "cpu-tiny": 256}[config])  # short rows keep the simulator fast
    torch.manual_seed(seed); model = GPT(cfg).to(dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    starts = torch.randint(0, 97, (steps, batch, 1), generator=gen); incs = torch.randint(1, 7, (steps, batch, 1), generator=gen)
    data = (starts + incs * torch.arange(cfg.seq_len + 1)) % 97
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ops.use_backend(spec):
            for b in data:
                loss = model.loss(b[:, :-1], b[:, 1:])
                opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
    finally: torch.set_num_threads(threads)
    return losses


@pytest.mark.slow
def test_cpu_tiny_training_matches_torch():
    "cpu-tiny, 10 AdamW steps, fp32: the nki-sim kernels give the torch losses within 1e-4 (observed ~1e-6)."
    ref = _train_losses("cpu-tiny", "torch")
    sim = _train_losses("cpu-tiny", "rms_norm=nki-sim,swiglu=nki-sim")
    assert ref[-1] < ref[0] - 1, ref          # it learns
    assert max(abs(a - b) for a, b in zip(ref, sim)) <= 1e-4, (ref, sim)


def test_cpu_micro_bf16_training_close_to_torch():
    "cpu-micro with bf16 parameters, 5 steps: the backends round differently; losses agree to 1e-3 relative (observed 4e-5)."
    ref = _train_losses("cpu-micro", "torch", steps=5, dtype=torch.bfloat16)
    sim = _train_losses("cpu-micro", "rms_norm=nki-sim,swiglu=nki-sim", steps=5, dtype=torch.bfloat16)
    assert all(abs(a - b) <= 1e-3 * abs(a) for a, b in zip(ref, sim)), (ref, sim)
