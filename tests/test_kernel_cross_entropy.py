"Cross-entropy NKI kernels (nbs/20_kernel_cross_entropy.ipynb) on shapes the notebook does not run: several d pieces, a narrow last vocabulary tile, several token blocks, zero padding rows, mixed dtypes."
import numpy as np
import pytest
import torch

from neuronfrontier import ops
from neuronfrontier.engine import loss as nf_loss   # registers the torch reference of ops.cross_entropy
from neuronfrontier import sim
from neuronfrontier.kernels import cross_entropy as ce


def _run(backend, h, W, y, block_tiles=None, **kw):
    hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
    if backend == "torch" or block_tiles is None:
        l = ops.cross_entropy(hh, WW, y, **kw, opset=ops.OpSet(backend))
    else:   # the simulator's kernel op directly, to force small blocks
        l = ce._cross_entropy(ce._SIM_OP, "nki-sim", hh, WW, y, kw.get("softcap"), kw.get("reduction", "mean"),
                              kw.get("vocab_size"), block_tiles, kw.get("weights"))
    (l.sum() if l.ndim else l).backward()
    return l.detach(), hh.grad, WW.grad


def _compare(h, W, y, rel=1e-5, block_tiles=None, **kw):
    l0, dh0, dW0 = _run("torch", h, W, y, **kw)
    l1, dh1, dW1 = _run("cross_entropy=nki-sim", h, W, y, block_tiles=block_tiles, **kw)
    assert dh1.dtype == h.dtype and dW1.dtype == W.dtype
    for a, b in ((l1, l0), (dh1, dh0), (dW1, dW0)):
        a, b = a.float(), b.float()
        assert (a - b).abs().max().item() <= rel * max(b.abs().max().item(), 1e-30), (a - b).abs().max().item()
    return l1, dh1, dW1


def test_registered_backends():
    assert ops._IMPLS["cross_entropy"]["nki-sim"] is ce.cross_entropy_nki_sim
    if not sim.REAL_NKI: assert "nki" not in ops._IMPLS["cross_entropy"]   # guarded: only with the Neuron SDK
    assert ops.OpSet("cross_entropy=nki-sim").backend_for("cross_entropy") == "nki-sim"


def test_d_pieces_narrow_vocab_tile_padded_tokens():
    # d = 640: two d pieces (512 + 128) in the backward; V = 640: tiles of 512 and 128 columns, vocab_size = 600 inside
    # the narrow one; N = 130 pads to 256 with ignored rows
    g = torch.Generator().manual_seed(0)
    h, W = torch.randn(130, 640, generator=g), torch.randn(640, 640, generator=g) * 0.05
    y = torch.randint(0, 600, (130,), generator=g); y[5] = -1
    _compare(h, W, y, softcap=15.0, vocab_size=600)


def test_several_blocks_and_zero_padding_rows():
    # three token blocks (dW read-added-written twice); vocab_size = 500 of V = 1536 leaves rows 512.. untouched: zero
    g = torch.Generator().manual_seed(1)
    h, W = torch.randn(384, 128, generator=g), torch.randn(1536, 128, generator=g) * 0.1
    y = torch.randint(0, 500, (384,), generator=g); y[::11] = -1
    _, _, dW = _compare(h, W, y, block_tiles=1, reduction="sum", vocab_size=500)
    assert dW[500:].abs().max().item() == 0.0


def test_bf16_and_mixed_dtypes():
    g = torch.Generator().manual_seed(2)
    h, W = torch.randn(256, 256, generator=g), torch.randn(1024, 256, generator=g) * 0.05
    y = torch.randint(0, 1024, (256,), generator=g)
    _compare(h.bfloat16(), W.bfloat16(), y, rel=2e-2, block_tiles=1, softcap=30.0)   # bf16 matmuls: 8-bit mantissa
    # mixed dtypes (the torch reference refuses them): the matmuls run in h's dtype (bf16, as under autocast), so the
    # loss is that of the bf16-rounded weights; gradients come back in each input's dtype (dW rounded through bf16 operands)
    l1, dh1, dW1 = _run("cross_entropy=nki-sim", h.bfloat16(), W, y)
    l0, dh0, dW0 = _run("torch", h.bfloat16().float(), W.bfloat16().float(), y)
    assert dh1.dtype == torch.bfloat16 and dW1.dtype == torch.float32
    assert abs(l1.item() - l0.item()) <= 1e-5 * l0.item() and (dW1 - dW0).abs().max() <= 2e-2 * dW0.abs().max()


def test_reduction_none_and_single_counted_token():
    g = torch.Generator().manual_seed(3)
    h, W = torch.randn(128, 128, generator=g), torch.randn(512, 128, generator=g) * 0.1
    y = torch.full((128,), -1); y[17] = 3
    l, _, _ = _compare(h, W, y, reduction="none")
    assert (l != 0).sum().item() == 1
    _compare(h, W, y)                          # mean over one counted token


def test_refusals():
    opset = ops.OpSet("cross_entropy=nki-sim")
    with pytest.raises(ValueError, match="targets"):
        ops.cross_entropy(torch.randn(64, 128), torch.randn(512, 128), torch.zeros(63, dtype=torch.long), opset=opset)
    with pytest.raises(ValueError, match="disagree on d"):
        ops.cross_entropy(torch.randn(64, 128), torch.randn(512, 256), torch.zeros(64, dtype=torch.long), opset=opset)
    with pytest.raises(ValueError, match="unknown reduction"):
        ops.cross_entropy(torch.randn(64, 128), torch.randn(512, 128), torch.zeros(64, dtype=torch.long), reduction="max",
                          opset=opset)


def test_hbm_traffic_formula_and_no_NxV_write():
    # d = 384 (three contraction chunks), two backward blocks; the formula is the simulator's count byte for byte and
    # no DMA writes more than one [128, d] fp32 tile
    N, d, V, vs = 256, 384, 1024, 1024
    r = np.random.default_rng(4)
    h = r.standard_normal((N, d), dtype=np.float32); W = (r.standard_normal((V, d)) * 0.05).astype(np.float32)
    y = r.integers(0, vs, N).astype(np.int32)[:, None]
    writes, orig = [], sim._hbm_count
    def rec(tr, t, write):
        if write and t.buffer in (sim.nl.private_hbm, sim.nl.shared_hbm): writes.append(t.size * np.dtype(t.dtype).itemsize)
        return orig(tr, t, write)
    sim._hbm_count = rec
    try:
        for lnc in (1, 2):
            loss, lse = sim.simulate(ce.cross_entropy_fwd_kernel[lnc])(h, W, y, vs, 0.0, 1)
            tf = sim.last_trace()
            g = np.full((N, 1), 1.0 / N, np.float32)
            sim.simulate(ce.cross_entropy_bwd_kernel[lnc])(h, W, y, lse, g, vs, 0.0, 1)
            tb = sim.last_trace()
            m = ce.hbm_traffic(N, d, V, vs, 4, 1, lnc)
            rw = lambda t: dict(read=t.hbm_read_bytes, written=t.hbm_write_bytes)
            assert m == dict(fwd=rw(tf), bwd=rw(tb)), lnc
            assert "dma_compute" in tb.instructions or lnc == 2      # dW read-add-write on the DMA engines
    finally:
        sim._hbm_count = orig
    assert max(writes) == 128 * d * 4 < N * V * 4


def test_larger_shape():
    g = torch.Generator().manual_seed(5)
    h, W = torch.randn(1024, 512, generator=g), torch.randn(8192, 512, generator=g) * 0.03
    y = torch.randint(0, 8000, (1024,), generator=g); y[::13] = -1
    _compare(h, W, y, softcap=15.0, vocab_size=8000)


@pytest.mark.slow
def test_gpt2_head_shape():
    # the GPT-2 head: d = 768 (backward d pieces of 512 + 256), vocab 50,257 padded to 50,304 (last tile 128 wide)
    g = torch.Generator().manual_seed(6)
    h, W = torch.randn(256, 768, generator=g), torch.randn(50304, 768, generator=g) * 0.02
    y = torch.randint(0, 50257, (256,), generator=g)
    _compare(h, W, y, softcap=15.0, vocab_size=50257)


def test_default_block_fits_sbuf_at_gpt2_width():
    # d = 768 bf16: the default backward block (17 tiles) must run within the simulator's 192 KiB SBUF budget
    import ml_dtypes
    d, V = 768, 512
    bt = ce._block_tiles(1 << 20, d, 2)
    assert bt == 17
    N = bt * 128
    r = np.random.default_rng(7)
    h = r.standard_normal((N, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    W = (r.standard_normal((V, d)) * 0.05).astype(ml_dtypes.bfloat16)
    y = r.integers(0, V, N).astype(np.int32)[:, None]
    loss, lse = sim.simulate(ce.cross_entropy_fwd_kernel)(h, W, y, V, 15.0, ce._block_tiles(N, d, 2, backward=False))
    sim.simulate(ce.cross_entropy_bwd_kernel)(h, W, y, lse, np.ones((N, 1), np.float32), V, 15.0, bt)
    assert sim.last_trace().peak_sbuf_bytes <= ce.SBUF_BLOCK_BUDGET


def test_nki_backend_wiring_with_a_custom_op_stand_in(fake_torch_neuronx):
    # The `nki` backend cannot run here (no Trainium). Its wiring — custom ops, register_autograd, padding, reductions —
    # is exercised with torch.library.custom_op standing in for torch_neuronx.nki_op; under the emulator calling a
    # kernel runs the simulator.
    assert ce._register_nki(fake_torch_neuronx)
    try:
        g = torch.Generator().manual_seed(8)
        h, W = torch.randn(200, 128, generator=g), torch.randn(1024, 128, generator=g) * 0.1
        y = torch.randint(0, 1000, (200,), generator=g); y[::9] = -1
        for kw in (dict(softcap=15.0, vocab_size=1000), dict(reduction="sum")):
            l0, dh0, dW0 = _run("torch", h, W, y, **kw)
            l1, dh1, dW1 = _run("cross_entropy=nki", h, W, y, **kw)
            for a, b in ((l1, l0), (dh1, dh0), (dW1, dW0)):
                assert (a - b).abs().max().item() <= 1e-5 * b.abs().max().item()
    finally:
        ops._IMPLS["cross_entropy"].pop("nki", None)
    assert not ce.NKI_REGISTERED


def _mtp_inputs(dtype, seed=10, rows=2, T=100, d=256, V=1024, vs=1000):
    "k = 3 next-token targets of `rows` rows (−1 past each row's end, and one ignored next token), a padded head."
    g = torch.Generator().manual_seed(seed)
    h, W = torch.randn(rows * T, d, generator=g).to(dtype), (torch.randn(V, d, generator=g) * 0.1).to(dtype)
    y = torch.randint(0, vs, (rows, T), generator=g)
    y[0, 7] = -1
    return h, W, nf_loss.multi_token_targets(y, 3).flatten(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softcap", [None, 15.0])
def test_mtp_through_the_kernel_equals_the_chunked_torch_loss(dtype, softcap):
    # k = 3 targets a token, weights with a zero, targets ignored at the rows' ends, 200 tokens padded to 256, a head
    # of 1,000 real rows padded to 1,024: loss, dh and dW of every reduction equal PyTorch's chunked loss
    h, W, t = _mtp_inputs(dtype)
    w = torch.tensor([1.0, 0.0, 0.25])
    assert (t[:, 1:] < 0).any() and (t[:, 0] < 0).any()
    rel = ce.TOL[dtype]
    for kw in (dict(), dict(reduction="sum"), dict(reduction="none")):
        l, _, _ = _compare(h, W, t, rel=rel, softcap=softcap, vocab_size=1000, weights=w, **kw)
    assert l.shape == (200,) and l[t[:, 0] < 0].abs().max().item() > 0   # an ignored next token, later ones counted
    if dtype == torch.float32:   # several token blocks (dW read-added-written), and the weights as data
        _compare(h, W, t, block_tiles=1, softcap=softcap, vocab_size=1000, weights=torch.tensor([0.5, 0.3, 0.2]))


def test_mtp_kernels_sweep_the_vocabulary_once_for_k_targets():
    # the k = 3 kernels against k = 1: the same matmuls (the weights are broadcast by a DMA), so no logits tile
    # computed twice; hbm_traffic counts the targets' and weights' bytes, byte for byte, on 1 and 2 cores; the per-token losses
    # equal Σ_q w_q (lse − ζ_{t_q}) in float64
    N, d, V, vs = 256, 384, 1024, 1000
    r = np.random.default_rng(11)
    h = r.standard_normal((N, d), dtype=np.float32); W = (r.standard_normal((V, d)) * 0.05).astype(np.float32)
    y3 = r.integers(-1, vs, (N, 3)).astype(np.int32)
    w3 = np.array([[1.0, 0.5, 0.25]], np.float32)
    for lnc in (1, 2):
        traces = {}
        for k, y, wt in ((0, y3[:, :1], ()), (3, y3, (w3,))):
            loss, lse = sim.simulate(ce.cross_entropy_fwd_kernel[lnc])(h, W, y, vs, 15.0, 1, *wt)
            tf = sim.last_trace()
            sim.simulate(ce.cross_entropy_bwd_kernel[lnc])(h, W, y, lse, np.ones((N, 1), np.float32), vs, 15.0, 1, *wt)
            traces[k] = (tf, sim.last_trace())
            rw = lambda t: dict(read=t.hbm_read_bytes, written=t.hbm_write_bytes)
            assert ce.hbm_traffic(N, d, V, vs, 4, 1, lnc, k) == dict(fwd=rw(tf), bwd=rw(traces[k][1])), (lnc, k)
        for one, three in zip(traces[0], traces[3]):   # forward, then backward
            assert three.instructions["nc_matmul"] == one.instructions["nc_matmul"]   # no logits recomputed
            assert three.pe_cycles == one.pe_cycles and set(three.matmul_flops) == {"float32"}
            assert three.hbm_read_bytes - one.hbm_read_bytes == 8 * N + 128 * 12 * lnc   # 2 more targets; 3 weights
            assert three.hbm_write_bytes == one.hbm_write_bytes
    ref = ce._reduce(torch.tensor(loss[:, 0]), torch.tensor(y3), "sum")
    z = torch.tensor(h).double() @ torch.tensor(W).double().T
    z = 15 * torch.tanh(z / 15)
    z[:, vs:] = float("-inf")
    lse_ref = torch.logsumexp(z, 1)
    tl = torch.tensor(y3).long()
    want = sum(wq * torch.where(tl[:, q] >= 0, lse_ref - z.gather(1, tl[:, q:q + 1].clamp_min(0))[:, 0], 0.0)
               for q, wq in enumerate(w3[0]))
    assert abs(ref.item() - want.sum().item()) <= 1e-5 * want.sum().item()


def test_mtp_weights_are_a_kernel_input_through_the_nki_op(fake_torch_neuronx):
    # the `nki` backend's custom operators (TorchNeuron stand-in) with k targets: the weights reach both kernels as a
    # [1, k] fp32 tensor argument, so new weights are new data; the results equal PyTorch's
    assert ce._register_nki(fake_torch_neuronx)
    try:
        h, W, t = _mtp_inputs(torch.float32, seed=12)
        for w in (torch.tensor([1.0, 0.5, 0.25]), torch.tensor([1.0, 0.0, 0.0])):
            l0, dh0, dW0 = _run("torch", h, W, t, softcap=15.0, vocab_size=1000, weights=w)
            l1, dh1, dW1 = _run("cross_entropy=nki", h, W, t, softcap=15.0, vocab_size=1000, weights=w)
            for a, b in ((l1, l0), (dh1, dh0), (dW1, dW0)):
                assert (a - b).abs().max().item() <= 1e-5 * b.abs().max().item()
        calls = fake_torch_neuronx.standin.calls
        assert {c.kernel for c in calls} == {"cross_entropy_fwd_kernel", "cross_entropy_bwd_kernel"}
        assert all(c.args[-1] == ((1, 3), "torch.float32") and c.args[2] == ((256, 3), "torch.int32") for c in calls)
    finally:
        ops._IMPLS["cross_entropy"].pop("nki", None)


def test_mtp_refusals():
    h, W, t = torch.randn(64, 128), torch.randn(512, 128), torch.zeros(64, 3, dtype=torch.long)
    opset = ops.OpSet("cross_entropy=nki-sim")
    with pytest.raises(ValueError, match=r"must be \[N\]=\[64\] \(or \[N, k\] with weights \[k\]\)"):
        ops.cross_entropy(h, W, t, opset=opset)
    with pytest.raises(ValueError, match="one weight each"):
        ops.cross_entropy(h, W, t, weights=torch.ones(2), opset=opset)
    with pytest.raises(ValueError, match="at most 8"):
        ops.cross_entropy(h, W, torch.zeros(64, 9, dtype=torch.long), weights=torch.ones(9), opset=opset)
