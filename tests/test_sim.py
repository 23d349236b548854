"""Tests of the NKI CPU simulator (`neuronfrontier.sim`): kernels written from the public NKI docs, every
hardware constraint tripping, and every `Trace` field against a hand count."""
import numpy as np, ml_dtypes, pytest
from neuronfrontier.sim import nki, nl, nisa, simulate, last_trace, NKIConstraintError, Trace, REAL_NKI
from neuronfrontier.hw import estimate_time, TRN2

pytestmark = pytest.mark.skipif(REAL_NKI, reason='emulator-specific tests (a real NKI is installed)')
rng = np.random.default_rng(0)
bf16 = ml_dtypes.bfloat16


# ---------------------------------------------------------------- kernels from the documentation
@nki.jit
def matmul_kernel(lhsT, rhs):
    "Tiled matmul: result[M, N] = lhsT[K, M].T @ rhs[K, N], PSUM accumulation over K."
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            res_psum = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.sequential_range(K // TK):
                lhsT_tile = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * TK:(k + 1) * TK, nl.ds(n * TN, TN)])
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tile, moving=rhs_tile)
            res_sb = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=res_sb)
    return result


@nki.jit
def softmax_causal_kernel(scores, bias):
    """Row softmax of scale*scores + bias with a causal mask (rows = queries on partitions):
    iota/affine_select mask, max and sum reductions, activation with bias and scale."""
    P, F = scores.shape
    out = nl.ndarray((P, F), dtype=scores.dtype, buffer=nl.shared_hbm)
    x = nl.load(scores)
    b = nl.load(bias)
    masked = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=masked, pattern=[[-1, F]], offset=0, channel_multiplier=1, on_true_tile=x,
                       on_false_value=-30000.0, cmp_op=nl.greater_equal)
    mx = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mx, op=nl.maximum, data=masked, axis=1, negate=True, keepdims=True)
    nbias = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    # -max*scale + bias  (bias is a per-row value)
    nisa.scalar_tensor_tensor(dst=nbias, data=mx, op0=nl.multiply, operand0=0.5, op1=nl.add, operand1=b)
    e = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    ssum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=masked, bias=nbias, scale=0.5, reduce_op=nl.add, reduce_res=ssum,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    ssum2 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=ssum2, op=nl.add, data=e, axis=1, keepdims=True)
    rs = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rs, data=ssum2)
    y = nl.ndarray((P, F), dtype=scores.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=rs)
    nl.store(out, y)
    return out, ssum_out(ssum)


def ssum_out(ssum):
    o = nl.ndarray(ssum.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=ssum)
    return o


def test_matmul_kernel_matches_numpy():
    a = rng.standard_normal((512, 256), dtype=np.float32)
    b = rng.standard_normal((512, 1024), dtype=np.float32)
    r = simulate(matmul_kernel)(a, b)
    np.testing.assert_allclose(r, a.T @ b, rtol=1e-4, atol=1e-3)


def test_matmul_kernel_bf16_torch_roundtrip():
    torch = pytest.importorskip('torch')
    a = torch.randn(256, 128).to(torch.bfloat16)
    b = torch.randn(256, 512).to(torch.bfloat16)
    r = simulate(matmul_kernel)(a, b)
    assert isinstance(r, torch.Tensor) and r.dtype == torch.bfloat16 and r.shape == (128, 512)
    ref = (a.float().T @ b.float()).to(torch.bfloat16)
    # same fp32 sums up to summation order, then one bf16 rounding
    assert (r.float() - ref.float()).abs().max() <= 2 ** -7 * ref.float().abs().max()


def test_softmax_causal_kernel():
    P, F = 128, 128
    s = rng.standard_normal((P, F), dtype=np.float32) * 3
    bias = rng.standard_normal((P, 1), dtype=np.float32)
    y, ssum = simulate(softmax_causal_kernel)(s, bias)
    m = np.where(np.tril(np.ones((P, F), bool)), s, -30000.0)
    e = np.exp(0.5 * (m - m.max(1, keepdims=True)) + bias)
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ssum, e.sum(1, keepdims=True), rtol=1e-5)


@nki.jit
def transpose_kernel(x):
    "Tiled transpose through the TensorEngine: out[F, P] = x[P, F].T"
    P, F = x.shape
    out = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(P // 128):
        for j in nl.affine_range(F // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128])
            tp = nl.ndarray((128, 128), dtype=x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=t)
            ts = nl.ndarray((128, 128), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=ts, src=tp)
            nl.store(out[j * 128:(j + 1) * 128, i * 128:(i + 1) * 128], ts)
    return out


def test_transpose_kernel():
    x = rng.standard_normal((256, 384)).astype(bf16)
    r = simulate(transpose_kernel)(x)
    assert r.dtype == bf16
    np.testing.assert_array_equal(r, x.T)


@nki.jit
def spmd_add(a, b):
    "kernel[2]: each program adds its half of the rows."
    n = nl.num_programs(0)
    P = a.shape[0] // n
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    x, y = nl.load(a[i * P:(i + 1) * P]), nl.load(b[i * P:(i + 1) * P])
    z = nl.ndarray(x.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=z, data1=x, data2=y, op=nl.add)
    nl.store(out[i * P:(i + 1) * P], z)
    return out


def test_spmd_grid():
    a, b = rng.standard_normal((256, 64), dtype=np.float32), rng.standard_normal((256, 64), dtype=np.float32)
    np.testing.assert_array_equal(simulate(spmd_add[2])(a, b), a + b)
    tr = last_trace()
    assert tr.grid == (2,) and tr.dma_count == 6 and tr.vector_elems == 256 * 64


def test_preallocated_output_and_iota():
    @nki.jit
    def k(out):
        t = nl.ndarray((128, 4, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=[[8, 4], [1, 8]], offset=5, channel_multiplier=100)
        nisa.dma_copy(dst=out, src=t)
    out = np.zeros((128, 4, 8), np.int32)
    simulate(k)(out)
    np.testing.assert_array_equal(out, 5 + 100 * np.arange(128)[:, None, None] + np.arange(32).reshape(4, 8))


def test_unwritten_memory_is_nan():
    @nki.jit
    def k(x):
        o = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 0:4], src=x)
        nisa.dma_copy(dst=o, src=t)
        return o
    r = simulate(k)(np.ones((128, 4), np.float32))
    assert (r[:, :4] == 1).all() and np.isnan(r[:, 4:]).all()


def test_bf16_rounding_matches_torch():
    torch = pytest.importorskip('torch')
    x = torch.randn(128, 512) * 1000
    x[0, :4] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 65504.7])  # ties to even

    @nki.jit
    def k(x):
        o = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load(x)
        tb = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=tb, src=t)
        nl.store(o, tb)
        return o
    r = simulate(k)(x)
    assert torch.equal(r, x.to(torch.bfloat16))


def test_psum_accumulation_semantics():
    a = rng.standard_normal((128, 128), dtype=np.float32)

    @nki.jit
    def k(a, acc):
        o = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        ps = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, t, t)            # first: overwrite (the NaN fill disappears)
        nisa.nc_matmul(ps, t, t)            # then accumulate
        if acc == 0:
            nisa.memset(ps, 1.0)           # a non-matmul write closes the group ...
            nisa.nc_matmul(ps, t, t)       # ... so this overwrites
        else:
            nisa.nc_matmul(ps, t, t, accumulate=False)
        s = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(s, ps)
        nl.store(o, s)
        return o
    np.testing.assert_allclose(simulate(k)(a, 0), a.T @ a, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(simulate(k)(a, 1), a.T @ a, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- constraints
def _run1(body, *arrays):
    @nki.jit
    def k(*args):
        body(*args)
    return simulate(k)(*arrays)


def _trips(body, match, *arrays):
    with pytest.raises(NKIConstraintError, match=match):
        _run1(body, *arrays)


def test_partition_limit():
    _trips(lambda: nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf),
           r"nl.ndarray: partition dimension 256 of 'tensor' exceeds the limit of 128 \(shape \(256, 4\), sbuf\)")
    _trips(lambda x: nl.load(x), r'nl.load: source partition dimension 200 exceeds the limit of 128', np.zeros((200, 4), np.float32))


def _mm(sshape, mshape, sdt=nl.bfloat16, mdt=nl.bfloat16, dshape=None, ddt=nl.float32):
    def body():
        s = nl.zeros(sshape, dtype=sdt, buffer=nl.sbuf)
        m = nl.zeros(mshape, dtype=mdt, buffer=nl.sbuf)
        d = nl.ndarray(dshape or (sshape[1], mshape[1]), dtype=ddt, buffer=nl.psum)
        nisa.nc_matmul(d, s, m)
    return body


def test_matmul_limits():
    _trips(_mm((128, 128), (128, 1024), dshape=(128, 512)),
           r'nc_matmul: moving operand free size 1024 exceeds the TensorEngine limit of 512 \(shape \(128, 1024\)\)')
    _trips(_mm((128, 256), (128, 512), dshape=(128, 512)),
           r'nc_matmul: stationary operand free size 256 exceeds the TensorEngine limit of 128 \(shape \(128, 256\)\)')
    _trips(_mm((64, 128), (128, 512)), r'must share the partition \(contraction\) dimension')


def test_matmul_dtype_rules():
    _trips(_mm((128, 128), (128, 128), sdt=nl.float32), r'nc_matmul: stationary dtype float32 and moving dtype bfloat16: fp32 can only be multiplied with fp32')
    _trips(_mm((128, 128), (128, 128), sdt=nl.int32, mdt=nl.int32), r'nc_matmul: stationary dtype int32 is not supported \(shape \(128, 128\)\)')
    _trips(_mm((128, 128), (128, 128), ddt=nl.bfloat16), r'nc_matmul: dst dtype bfloat16 \(shape \(128, 128\)\): matmul results are written to PSUM as float32')

    def sbuf_dst():
        s = nl.zeros((128, 128), dtype=nl.bfloat16)
        d = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_matmul(d, s, s)
    _trips(sbuf_dst, r'nc_matmul: operand dst must be in PSUM, not SBUF \(shape \(128, 128\)\)')
    # fp8 x bf16 is allowed
    _run1(_mm((128, 128), (128, 512), sdt=nl.float8_e4m3))


def test_psum_tile_limit():
    _trips(lambda: nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum),
           r"nl.ndarray: PSUM tile 'tensor' needs 4096 bytes per partition, exceeding one PSUM bank of 2048 bytes \(shape \(128, 1024\), float32\)")


def test_live_psum_limit():
    def body():
        tiles = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum, name=f'p{i}') for i in range(9)]
        nisa.memset(tiles[0], 0.0)
    _trips(body, r"live PSUM 18432 bytes per partition exceeds the limit of 16384 bytes, 8 banks of 2048 \(newest tile 'p8' shape \(128, 512\) float32\)")

    def ok():  # 8 banks live, reused in a loop: fine
        for _ in range(20):
            tiles = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum) for i in range(8)]
            nisa.memset(tiles[0], 0.0)
    _run1(ok)


def test_live_sbuf_limit():
    def body():
        a = nl.ndarray((128, 32 * 1024), dtype=nl.float32, buffer=nl.sbuf, name='a')    # 128 KiB per partition
        b = nl.ndarray((128, 24 * 1024), dtype=nl.float32, buffer=nl.sbuf, name='b')    # + 96 KiB
        nisa.memset(a, 0.0)
    _trips(body, r"memset: live SBUF 229376 bytes per partition exceeds the budget of 196608 bytes \(newest tile 'b' shape \(128, 24576\) float32\)")
    _trips(lambda: nl.ndarray((128, 64 * 1024), dtype=nl.float32, buffer=nl.sbuf),
           r'nl.ndarray: SBUF tensor .* needs 262144 bytes per partition, exceeding the SBUF budget of 196608 bytes')


def test_no_dma_from_psum():
    def body(x):
        p = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.dma_copy(dst=x, src=p)
    _trips(body, r'dma_copy: src is in PSUM \(shape \(128, 512\)\); DMA cannot access PSUM', np.zeros((128, 512), np.float32))

    def body2(x):
        p = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        nl.store(x, p)
    _trips(body2, r'nl.store: value is in PSUM \(shape \(128, 512\)\)', np.zeros((128, 512), np.float32))


def test_engines_read_only_onchip():
    def body(x):
        t = nl.ndarray((128, 4), dtype=nl.float32)
        nisa.tensor_copy(dst=t, src=x)
    _trips(body, r'tensor_copy: operand src is in hbm \(shape \(128, 4\)\); compute engines read and write only SBUF/PSUM', np.zeros((128, 4), np.float32))


def test_activation_reduce_op_must_be_add():
    def body():
        t = nl.zeros((128, 4), dtype=nl.float32)
        r = nl.ndarray((128, 1), dtype=nl.float32)
        nisa.activation(dst=t, op=nl.exp, data=t, reduce_op=nl.maximum, reduce_res=r)
    _trips(body, r'activation: reduce_op nl.maximum is not supported')


def test_tensor_reduce_axis_rules():
    def body():
        t = nl.zeros((128, 4, 8), dtype=nl.float32)
        r = nl.ndarray((128, 8), dtype=nl.float32)
        nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=1)
    _trips(body, r'tensor_reduce: axis 1 must be the last contiguous free axes of data \(shape \(128, 4, 8\)\)')


# ---------------------------------------------------------------- Trace fields, hand counts
@nki.jit
def copy_kernel(x):
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(P // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], t)
    return out


def test_trace_copy_hbm_bytes_and_peak_sbuf():
    x = rng.standard_normal((4096, 256)).astype(bf16)
    np.testing.assert_array_equal(simulate(copy_kernel)(x), x)
    tr = last_trace()
    assert tr.hbm_read_bytes == 4096 * 256 * 2 and tr.hbm_write_bytes == 4096 * 256 * 2
    assert tr.dma_count == 2 * 32
    assert tr.peak_sbuf_bytes == 256 * 2           # one (128, 256) bf16 tile live at a time
    assert tr.peak_psum_bytes == 0
    assert tr.tensor_flops == tr.pe_cycles == tr.vector_elems == tr.scalar_elems == tr.gpsimd_elems == 0
    assert tr.instructions == {'nl.load': 32, 'nl.store': 32}


def test_trace_matmul_counts():
    a = rng.standard_normal((512, 256), dtype=np.float32).astype(bf16)
    b = rng.standard_normal((512, 1024), dtype=np.float32).astype(bf16)
    simulate(matmul_kernel)(a, b)
    tr = last_trace()
    K, M, N = 512, 256, 1024
    assert tr.tensor_flops == 2 * K * M * N
    n_mm = (K // 128) * (M // 128) * (N // 512)                 # 16 matmuls of 512 moving columns
    assert tr.pe_cycles == n_mm * 512
    assert tr.vector_elems == M * N                              # PSUM -> SBUF copies
    assert tr.dma_count == 2 * n_mm + (M // 128) * (N // 512)    # loads + stores
    assert tr.hbm_read_bytes == n_mm * (128 * 128 + 128 * 512) * 2 and tr.hbm_write_bytes == M * N * 2
    assert tr.peak_psum_bytes == 2048
    # lhsT tile 256 B + rhs tile 1024 B + result tile 1024 B (bf16) per partition
    assert tr.peak_sbuf_bytes == 128 * 2 + 512 * 2 + 512 * 2


def test_trace_engine_elements():
    @nki.jit
    def k(x):
        t = nl.load(x)                                            # (128, 64)
        y = nl.ndarray((128, 64), dtype=nl.float32)
        nisa.activation(dst=y, op=nl.silu, data=t)                # scalar: 8192
        nisa.tensor_scalar(dst=y, data=y, op0=nl.multiply, operand0=2.0, engine=nisa.engine.gpsimd)  # gpsimd 8192
        m = nl.ndarray((128, 64), dtype=nl.float32)
        nisa.iota(dst=m, pattern=[[1, 64]], offset=0)             # gpsimd 8192
        nisa.tensor_tensor(dst=y, data1=y, data2=m, op=nl.add)    # vector 8192
        r = nl.ndarray((128, 1), dtype=nl.float32)
        nisa.tensor_reduce(dst=r, op=nl.max, data=y, axis=1)      # vector 8192
    simulate(k)(np.zeros((128, 64), np.float32))
    tr = last_trace()
    assert (tr.scalar_elems, tr.gpsimd_elems, tr.vector_elems) == (8192, 2 * 8192, 2 * 8192)
    assert tr.dma_count == 1 and tr.hbm_read_bytes == 128 * 64 * 4 and tr.hbm_write_bytes == 0
    assert tr.peak_sbuf_bytes == 3 * 256 + 4                      # t, y, m and r
    assert tr.n_instructions == 6 and len(tr.timeline) == 6
    assert tr.engines == {'dma': 1, 'scalar': 1, 'gpsimd': 2, 'vector': 2}     # per engine, from the same counters
    assert [op for op, _ in tr.timeline_ops] == ['nl.load', 'activation', 'tensor_scalar', 'iota', 'tensor_tensor', 'tensor_reduce']
    assert sum([tr, tr]).engines == {k_: 2 * v for k_, v in tr.engines.items()}
    t = estimate_time(tr, breakdown=True)
    assert t['label'] == 'roofline estimate' and t['total'] == max(v for k_, v in t.items() if k_ in ('tensor', 'vector', 'scalar', 'gpsimd', 'hbm'))


def test_high_level_ops_and_transpose_vector():
    @nki.jit
    def k(x):
        t = nl.load(x)
        e = nl.exp(t)
        m = nl.max(e, axis=1, keepdims=True)
        o = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o, m)
        tt = nl.ndarray((16, 32), dtype=nl.float32)
        nisa.nc_transpose(dst=tt, data=t)
        o2 = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o2, tt)
        return o, o2
    x = rng.standard_normal((32, 16), dtype=np.float32)
    m, xt = simulate(k)(x)
    np.testing.assert_allclose(m, np.exp(x).max(1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(xt, x.T)


# ---------------------------------------------------------------- real-SDK detection
def _probe(tmp_path, files):
    import subprocess, sys, os
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    code = ('import neuronfrontier.sim as s; print(s.REAL_NKI, s.nl.__name__, s.nisa.__name__); '
            'print(s.simulate(lambda: 0)() if s.REAL_NKI else "emu")')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.dirname(os.path.dirname(__file__))]))
    env.pop('NEURONFRONTIER_SIM', None)
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_pypi_placeholder_nki_is_not_real(tmp_path):
    assert _probe(tmp_path, {'nki/__init__.py': ''}) == ['False', 'nki.language', 'nki.isa', 'emu']


def test_real_nki_is_used_when_importable(tmp_path):
    out = _probe(tmp_path, {'nki/__init__.py': 'from . import isa, language\ndef jit(f): return f\n'
                                                'def simulate(k): return lambda *a: "real-simulate"\n',
                            'nki/isa.py': 'def nc_matmul(*a, **k): pass\n',
                            'nki/language.py': ''})
    assert out == ['True', 'nki.language', 'nki.isa', 'real-simulate']


def test_transpose_rules_and_is_transpose():
    def wrong_dtype():
        t = nl.zeros((128, 64), dtype=nl.bfloat16)
        p = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=t)
    _trips(wrong_dtype, r'nc_transpose: transpose output dtype float32 must equal the input dtype bfloat16 \(dst shape \(64, 128\)\)')

    def gpsimd_psum():
        p = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.psum)
        s = nl.ndarray((128, 64), dtype=nl.float32)
        nisa.tensor_copy(dst=s, src=p, engine=nisa.engine.gpsimd)
    _trips(gpsimd_psum, r'tensor_copy: GpSimd engine cannot access PSUM: operand src is in PSUM \(shape \(128, 64\)\)')

    @nki.jit
    def k(x, ident):
        t, i = nl.load(x), nl.load(ident)
        p = nl.ndarray((64, 128), dtype=x.dtype, buffer=nl.psum)
        nisa.nc_matmul(p, t, i, is_transpose=True)
        o = nl.ndarray((64, 128), dtype=x.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray((64, 128), dtype=x.dtype)
        nisa.tensor_copy(s, p)
        nl.store(o, s)
        return o
    x = rng.standard_normal((128, 64)).astype(bf16)
    x[0, 0] = np.nan
    r = simulate(k)(x, np.eye(128, dtype=bf16))
    np.testing.assert_array_equal(r.view(np.uint16), x.T.view(np.uint16))   # bit-accurate, NaN included


def test_kernel_calling_kernel():
    @nki.jit
    def inner(x):
        t = nl.load(x)
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(y, t)
        return y

    @nki.jit
    def outer(x):
        return inner(x)
    x = rng.standard_normal((128, 8), dtype=np.float32)
    np.testing.assert_array_equal(simulate(outer)(x), x)
    assert last_trace().kernel == 'outer' and last_trace().dma_count == 2


def test_tensor_scalar_reduce_one_hot_gather():
    "The cross-entropy gather: one-hot of the target column by iota == target, then a sum of logits * one-hot."
    @nki.jit
    def k(logits, target):
        P, V = logits.shape
        x, tg = nl.load(logits), nl.load(target)
        col = nl.ndarray((P, V), dtype=nl.int32)
        nisa.iota(dst=col, pattern=[[1, V]], offset=0)
        onehot = nl.ndarray((P, V), dtype=nl.float32)
        nisa.tensor_scalar(dst=onehot, data=col, op0=nl.equal, operand0=tg)
        prod = nl.ndarray((P, V), dtype=nl.float32)
        nisa.tensor_tensor(dst=prod, data1=x, data2=onehot, op=nl.multiply)
        junk = nl.ndarray((P, V), dtype=nl.float32)
        picked = nl.ndarray((P, 1), dtype=nl.float32)
        nisa.tensor_scalar_reduce(dst=junk, data=prod, op0=nl.multiply, operand0=1.0, reduce_op=nl.add, reduce_res=picked)
        out = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, picked)
        return out
    logits = rng.standard_normal((128, 512), dtype=np.float32)
    target = rng.integers(0, 512, (128, 1)).astype(np.int32)
    np.testing.assert_allclose(simulate(k)(logits, target)[:, 0], logits[np.arange(128), target[:, 0]], rtol=1e-6)


def test_trace_sum():
    x = rng.standard_normal((256, 64), dtype=np.float32)
    simulate(copy_kernel)(x); t1 = last_trace()
    simulate(spmd_add[2])(x, x); t2 = last_trace()
    t = sum([t1, t2])
    assert t.hbm_read_bytes == t1.hbm_read_bytes + t2.hbm_read_bytes == 256 * 64 * 4 * 3
    assert t.dma_count == 4 + 6 and t.peak_sbuf_bytes == max(t1.peak_sbuf_bytes, t2.peak_sbuf_bytes)
    assert t.instructions['nl.load'] == 2 + 4
    assert 'timeline' not in repr(t)


def test_activation_accumulator_registers():
    @nki.jit
    def k(x):
        t = nl.load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32)
        r = nl.ndarray((x.shape[0], 4), dtype=nl.float32)
        nisa.activation(dst=y, op=nl.copy, data=t, reduce_res=r[:, 0:1])                      # idle: registers unwritten
        nisa.activation(dst=y, op=nl.copy, data=t, reduce_cmd=nisa.reduce_cmd.reset_reduce)  # regs = row sums
        nisa.activation(dst=y, op=nl.square, data=t, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=r[:, 1:2])
        nisa.activation(dst=y, op=nl.copy, data=t, reduce_res=r[:, 2:3])                      # idle: read only
        nisa.activation_reduce(dst=y, op=nl.copy, data=t, reduce_op=nl.add, reduce_res=r[:, 3:4])
        o = nl.ndarray(r.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o, r)
        return o
    x = rng.standard_normal((16, 8), dtype=np.float32)
    r = simulate(k)(x)
    assert np.isnan(r[:, 0]).all()
    np.testing.assert_allclose(r[:, 1], x.sum(1) + (x * x).sum(1), rtol=1e-5)
    np.testing.assert_allclose(r[:, 2], r[:, 1])
    np.testing.assert_allclose(r[:, 3], x.sum(1), rtol=1e-5)


def test_dma_shapes_must_match():
    def body(x):
        t = nl.ndarray((128, 512), dtype=nl.float32)
        nisa.dma_copy(dst=t, src=x)
    _trips(body, r'dma_copy: src shape \(256, 256\) and dst shape \(128, 512\) differ', np.zeros((256, 256), np.float32))

    def ok(x):   # size-1 dimensions may differ: a (64,) HBM vector into a (64, 1) column or a (1, 64) row
        t = nl.ndarray((1, 64), dtype=nl.float32)
        nisa.dma_copy(dst=t, src=x)
        t2 = nl.ndarray((64, 1), dtype=nl.float32)
        nisa.dma_copy(dst=t2, src=x)
    _run1(ok, np.zeros(64, np.float32))
