"Chunked cross-entropy vs the naive (materialised-logits) loss: values, gradients, edge cases."
import pytest, torch
from neuronfrontier.engine.loss import chunked_cross_entropy, naive_cross_entropy, auto_chunk_size, online_logsumexp


def _inputs(N, d, Vp, V=None, ignore=0.2, dtype=torch.float32, seed=0, shape=None):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, d, generator=g)
    w = torch.randn(Vp, d, generator=g) / d ** 0.5 * 4
    t = torch.randint(0, V or Vp, (N,), generator=g)
    t[torch.rand(N, generator=g) < ignore] = -1
    if N > 3: t[3] = -100                           # any negative target is ignored
    if shape: h, t = h.reshape(*shape, d), t.reshape(shape)
    return h.to(dtype).requires_grad_(), w.to(dtype).requires_grad_(), t


def _run(f, h, w, t, gout, **kw):
    h.grad = w.grad = None
    loss = f(h, w, t, **kw)
    loss.backward(gout)
    return loss.detach(), h.grad.clone(), w.grad.clone()


def _assert_same(ref, got, rtol=1e-5):
    for a, b, name in zip(ref, got, ("loss", "dh", "dW")):
        torch.testing.assert_close(b.float(), a.float(), rtol=rtol, atol=rtol * a.abs().max().item(), msg=name)


CASES = [  # N, d, Vp, V, chunk_size
    (64, 32, 50304, 50257, None),    # GPT-2: padded head, masked rows
    (96, 16, 8192, None, 40),        # ragged last chunk
    (33, 24, 512, 500, 7),
    (1, 8, 128, 100, None),
]


@pytest.mark.parametrize("N,d,Vp,V,chunk", CASES)
@pytest.mark.parametrize("softcap", [None, 0.0, 15.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_naive_fp32(N, d, Vp, V, chunk, softcap, reduction):
    h, w, t = _inputs(N, d, Vp, V)
    gout = torch.randn(N, generator=torch.Generator().manual_seed(1)) if reduction == "none" else torch.tensor(0.7)
    kw = dict(softcap=softcap, reduction=reduction, chunk_size=chunk, vocab_size=V)
    ref, got = _run(naive_cross_entropy, h, w, t, gout, **kw), _run(chunked_cross_entropy, h, w, t, gout, **kw)
    _assert_same(ref, got)
    if V is not None and V < Vp: assert got[2][V:].abs().sum() == 0     # padding rows: no gradient


def test_batched_shape_and_none():
    h, w, t = _inputs(24, 16, 256, shape=(3, 8))
    per = chunked_cross_entropy(h, w, t, reduction="none", chunk_size=5)
    assert per.shape == (24,)
    assert (per[t.reshape(-1) < 0] == 0).all()
    torch.testing.assert_close(per, naive_cross_entropy(h, w, t, reduction="none"), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(chunked_cross_entropy(h, w, t), per.sum() / (t >= 0).sum(), rtol=1e-6, atol=0)


def test_nothing_counted_is_zero_not_nan():
    h, w, t = _inputs(20, 8, 64, ignore=1.0)
    loss = chunked_cross_entropy(h, w, t)
    loss.backward()
    assert loss.item() == 0.0 and h.grad.abs().sum() == 0 and w.grad.abs().sum() == 0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_gradcheck_fp64(reduction, softcap):
    h, w, t = _inputs(7, 5, 12, V=10, dtype=torch.float64)
    fn = lambda h, w: chunked_cross_entropy(h, w, t, softcap=softcap, reduction=reduction, chunk_size=3, vocab_size=10)
    assert torch.autograd.gradcheck(fn, (h, w))


def test_bf16_documented_tolerance():
    "bf16 in: fp32 math inside, loss fp32, grads bf16 within ~1% of an fp64 reference on the same bf16 values."
    h, w, t = _inputs(256, 64, 1024, V=1000, ignore=0.1, dtype=torch.bfloat16)
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = _run(naive_cross_entropy, h64, w64, t, torch.tensor(1.0, dtype=torch.float64), softcap=15.0, vocab_size=1000)
    got = _run(chunked_cross_entropy, h, w, t, torch.tensor(1.0), softcap=15.0, vocab_size=1000, chunk_size=64)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.bfloat16
    torch.testing.assert_close(got[0].double(), ref[0], rtol=1e-6, atol=0)
    for a, b in zip(ref[1:], got[1:]):
        assert (b.double() - a).abs().max() <= 1e-2 * a.abs().max()


def test_only_one_input_needs_grad():
    h, w, t = _inputs(30, 8, 64)
    w.requires_grad_(False)
    chunked_cross_entropy(h, w, t, chunk_size=8).backward()
    ref = h.grad.clone(); h.grad = None
    naive_cross_entropy(h, w, t).backward()
    torch.testing.assert_close(ref, h.grad, rtol=1e-5, atol=1e-7)


def test_retain_graph_twice():
    h, w, t = _inputs(30, 8, 64)
    loss = chunked_cross_entropy(h, w, t, chunk_size=8)
    loss.backward(retain_graph=True); g1 = w.grad.clone()
    loss.backward(); torch.testing.assert_close(w.grad, 2 * g1)


def test_no_grad_path_and_logits_never_full_size():
    "Under no_grad nothing is saved; the largest block allocated is [chunk, V], not [N, V]."
    h, w, t = _inputs(200, 8, 1000, ignore=0.0)
    h.requires_grad_(False); w.requires_grad_(False)
    seen = []
    orig = torch.Tensor.exp_
    def spy(self): seen.append(self.numel()); return orig(self)
    torch.Tensor.exp_ = spy
    try: loss = chunked_cross_entropy(h, w, t, chunk_size=32)
    finally: torch.Tensor.exp_ = orig
    assert max(seen) == 32 * 1000 and not loss.requires_grad
    torch.testing.assert_close(loss, naive_cross_entropy(h, w, t), rtol=1e-5, atol=0)


def test_errors():
    h, w, t = _inputs(10, 8, 64)
    with pytest.raises(ValueError, match="reduction"): chunked_cross_entropy(h, w, t, reduction="avg")
    with pytest.raises(ValueError, match="vocab_size=65"): chunked_cross_entropy(h, w, t, vocab_size=65)
    with pytest.raises(ValueError, match="targets has 9 tokens"): chunked_cross_entropy(h, w, t[:9])
    with pytest.raises(ValueError, match=r"w_head must be \[V, d=8\]"): chunked_cross_entropy(h, w.t(), t)


def test_auto_chunk_size_and_online_lse():
    assert auto_chunk_size(8192, 50304) * 50304 * 4 <= 32 * 2**20
    assert auto_chunk_size(5, 50304) == 5
    z = torch.randn(4, 777) * 20
    torch.testing.assert_close(online_logsumexp(z.split(100, 1)), torch.logsumexp(z, 1))


def test_every_op_runs_right_after_importing_ops():
    "In a fresh process, `from neuronfrontier import ops` alone runs the loss op and the expert op, with no warning."
    import subprocess, sys
    code = ("import torch\nfrom neuronfrontier import ops\n"
            "h, W, t = torch.randn(10, 32), torch.randn(40, 32), torch.randint(0, 30, (10,))\n"
            "ref = torch.nn.functional.cross_entropy(h @ W.T, t)\n"
            "assert torch.allclose(ops.cross_entropy(h, W, t), ref, atol=1e-5)\n"
            "x, wg, wu, wd = torch.randn(256, 16), torch.randn(2, 16, 8), torch.randn(2, 16, 8), torch.randn(2, 8, 16)\n"
            "assert ops.moe_mlp(x, wg, wu, wd, torch.tensor([0, 1])).shape == (256, 16)\n")
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-800:]
