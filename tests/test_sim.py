"""Tests of the NKI CPU simulator (`neuronfrontier.sim`): the NKI 0.8 API table (0.6 stubs + the 0.7 and 0.8 changes), kernels written from the public NKI
documentation on shapes no other test uses, every rule NKI 0.6 enforces (and 0.2 code broke), and the `Trace`."""
import inspect, os, warnings
from enum import Enum
import numpy as np, ml_dtypes, pytest
import neuronfrontier.sim as sim
from neuronfrontier.sim import (nki, nl, nisa, simulate, dry_run, last_trace, NKIConstraintError, NotSimulatedError, REAL_NKI, NKI_API, InstructionLimitWarning)
from neuronfrontier.hw import estimate_time

pytestmark = pytest.mark.skipif(REAL_NKI, reason='emulator-specific tests (a real NKI is installed)')
rng = np.random.default_rng(0)
bf16 = ml_dtypes.bfloat16


# ---------------------------------------------------------------- the NKI 0.6 API table
def _src(v):
    "A default value as the stubs write it (the table stores default expressions as source text)."
    if v is inspect.Parameter.empty: return None
    if isinstance(v, sim.MemoryRegion): return v.name
    if isinstance(v, Enum): return f'{type(v).__name__}.{v.name}'
    if isinstance(v, sim._Op): return v.name
    if isinstance(v, type): return sim._dtname(v)
    return repr(v)


def _sig(f, drop_self=False):
    ps = [[p.name, p.kind.name, _src(p.default)] for p in inspect.signature(f).parameters.values()]
    return ps[1:] if drop_self else ps


def _implemented(obj): return not getattr(obj, 'not_simulated', False)


def test_table_provenance():
    p = NKI_API['provenance']
    assert p['repository'] == 'github.com/aws-neuron/aws-neuron-sdk' and len(p['commit']) == 40 and p['stubs_nki_version'] == '0.6.0'
    assert (p['nki_version'], p['neuron_sdk']) == ('0.8.0', '2.34.0') and p['paths']['nki.isa'] == 'nki/api/nki/isa/__init__.py'
    assert {c['nki_version'] for c in p['changes']} == {'0.7.0', '0.8.0'}
    assert all(c['source'].startswith('https://awsdocs-neuron.readthedocs-hosted.com/') for c in p['changes'])
    assert {'dma_copy', 'dma_compute', 'nc_matmul', 'affine_select'} <= set(NKI_API['nki.isa'])


@pytest.mark.parametrize('mod,ns', [('nki.language', sim.emu_nl), ('nki.isa', sim.emu_nisa), ('nki', sim.emu_nki)])
def test_signatures_match_the_table(mod, ns):
    "Every implemented nl/nisa callable has exactly the 0.8 parameter names, order, kinds and defaults."
    checked = 0
    for name, e in NKI_API[mod].items():
        if e['kind'] != 'function': continue
        obj = getattr(ns, name)
        if not _implemented(obj): continue
        assert _sig(obj) == e['params'], (name, _sig(obj), e['params'])
        checked += 1
    assert checked >= {'nki.language': 95, 'nki.isa': 23, 'nki': 2}[mod]


def test_tensor_methods_match_the_table():
    cls = NKI_API['nki.language']['NkiTensor']
    for name, e in cls['methods'].items():
        assert _sig(getattr(sim.NkiTensor, name), drop_self=True) == e['params'], name
    t = nl.ndarray((128, 4), dtype=nl.float32)
    for a in cls['attributes']: getattr(t, a)
    assert t.shape == (128, 4) and t.strides == (4, 1) and t.offset == 0 and t.buffer is nl.sbuf and t.ndim == 2 and t.size == 512


def test_namespaces_are_exactly_the_table():
    "No name the 0.6 API lacks (nl.par_dim, nl.identity, nisa.Kernel ...) and none missing; enums and tile_size as listed."
    for mod, ns in (('nki.language', nl), ('nki.isa', nisa)):
        ours = {n for n in vars(ns) if not n.startswith('__')}
        assert ours == {n for n in NKI_API[mod] if not n.startswith('_') or n == '_TileSize'}
    for name, e in NKI_API['nki.isa'].items():
        if e['kind'] == 'enum': assert {m.name: m.value for m in getattr(nisa, name)} == e['members'], name
    assert {m.name for m in nl.MemoryRegion} == set(NKI_API['nki.language']['MemoryRegion']['members'])
    ts = NKI_API['nki.language']['_TileSize']
    for a in ts['attributes'] + ts['properties']: assert isinstance(getattr(nl.tile_size, a), int), a


def test_unimplemented_names_say_so():
    assert 'nl.rand' in sim.NOT_SIMULATED and 'nisa.dma_transpose' in sim.NOT_SIMULATED
    for full in sim.NOT_SIMULATED:
        mod, name = full.rsplit('.', 1)
        obj = getattr({'nl': nl, 'nisa': nisa, 'nki.lnc': sim.emu_lnc}[mod], name)
        if callable(obj):
            with pytest.raises((NotSimulatedError, NKIConstraintError), match=rf'{full}'), warnings.catch_warnings():
                warnings.simplefilter('ignore', DeprecationWarning)
                obj(None)
    with pytest.raises(NotSimulatedError, match='not simulated in neuronfrontier.sim: nl.tfloat32'):
        nl.ndarray((128, 4), dtype=nl.tfloat32)


# ---------------------------------------------------------------- kernels written from the NKI 0.6 documentation
@nki.jit
def tiled_add(a, b):
    "Element-wise a + b over row tiles of 128 and column tiles of 512 (nl.load / nl.add / nl.store)."
    R, C = a.shape
    out = nl.ndarray((R, C), dtype=a.dtype, buffer=nl.shared_hbm)
    for i in range((R + 127) // 128):
        r0, rn = i * 128, min(128, R - i * 128)
        for j in range((C + 511) // 512):
            c0, cn = j * 512, min(512, C - j * 512)
            x = nl.load(a[r0:r0 + rn, c0:c0 + cn])
            y = nl.load(b[r0:r0 + rn, c0:c0 + cn])
            nl.store(out[r0:r0 + rn, c0:c0 + cn], nl.add(x, y))
    return out


def test_doc_tiled_add():
    a, b = rng.standard_normal((300, 1100), dtype=np.float32), rng.standard_normal((300, 1100), dtype=np.float32)
    np.testing.assert_array_equal(simulate(tiled_add)(a, b), a + b)
    tr = last_trace()
    assert tr.instructions == {'nl.load': 18, 'nl.add': 9, 'nl.store': 9} and tr.engine_instructions == {'dma': 27, 'vector': 9}


@nki.jit
def matmul_accumulate(lhsT, rhs):
    "result = lhsT.T @ rhs, K in 128-row tiles accumulated in one PSUM tile with accumulate=(k > 0) (the nc_matmul example)."
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    res_psum = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    for k in range(K // 128):
        lhs_sb = nl.ndarray((128, M), dtype=lhsT.dtype, buffer=nl.sbuf)
        rhs_sb = nl.ndarray((128, N), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=lhs_sb, src=lhsT[k * 128:(k + 1) * 128, :])
        nisa.dma_copy(dst=rhs_sb, src=rhs[k * 128:(k + 1) * 128, :])
        nisa.nc_matmul(dst=res_psum, stationary=lhs_sb, moving=rhs_sb, accumulate=(k > 0))
    res_sb = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res_sb, src=res_psum)
    nisa.dma_copy(dst=result, src=res_sb)
    return result


def test_doc_matmul_with_psum_accumulation():
    a = rng.standard_normal((384, 96)).astype(bf16)
    b = rng.standard_normal((384, 320)).astype(bf16)
    r = simulate(matmul_accumulate)(a, b)
    np.testing.assert_allclose(r, a.astype(np.float32).T @ b.astype(np.float32), rtol=1e-5, atol=1e-4)
    tr = last_trace()
    assert tr.tensor_flops == 2 * 384 * 96 * 320 and tr.engine_instructions['tensor'] == 2 * 3


@nki.jit
def row_stats(x):
    """Per-row mean and variance of a [P, 1024] tile: two bn_stats of 512 columns and one bn_aggr (the bn_aggr recipe),
    plus the row sums over two free axes with nl.sum."""
    P, F = x.shape
    out = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    stats = nl.ndarray((P, 2 * 6), dtype=nl.float32, buffer=nl.sbuf)
    for c in range(F // 512):
        nisa.bn_stats(dst=stats[:, c * 6:(c + 1) * 6], data=t[:, c * 512:(c + 1) * 512])
    mv = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mv, data=stats)
    nisa.dma_copy(dst=out[:, 0:2], src=mv)
    s = nl.sum(t.reshape((P, 8, 128)), axis=(1, 2), keepdims=True)
    nisa.dma_copy(dst=out[:, 2:3], src=s)
    return out


def test_doc_reductions():
    x = rng.standard_normal((96, 1024), dtype=np.float32) * 3 + 1
    r = simulate(row_stats)(x)
    np.testing.assert_allclose(r[:, 0], x.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r[:, 1], x.var(1), rtol=1e-4)
    np.testing.assert_allclose(r[:, 2], x.sum(1), rtol=1e-5, atol=1e-3)


@nki.jit
def transpose_any(x):
    "out = x.T for any [R, C] by TensorEngine transposes of ≤128×128 blocks (partial edge blocks included)."
    R, C = x.shape
    out = nl.ndarray((C, R), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in range((R + 127) // 128):
        r0, rn = i * 128, min(128, R - i * 128)
        for j in range((C + 127) // 128):
            c0, cn = j * 128, min(128, C - j * 128)
            blk = nl.ndarray((rn, cn), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=blk, src=x[r0:r0 + rn, c0:c0 + cn])
            tp = nl.ndarray((cn, rn), dtype=x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=blk)
            blk_t = nl.ndarray((cn, rn), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=blk_t, src=tp)
            nisa.dma_copy(dst=out[c0:c0 + cn, r0:r0 + rn], src=blk_t)
    return out


def test_doc_transpose_partial_tiles_bit_exact():
    x = rng.standard_normal((200, 300)).astype(bf16)
    x[3, 7] = np.nan
    r = simulate(transpose_any)(x)
    np.testing.assert_array_equal(r.view(np.uint16), x.T.view(np.uint16))


@nki.jit
def lnc_reciprocal(inp):
    "The LNC overview's kernel: reciprocal of a [2, 128, 128] tensor, one [128, 128] slab per logical core under LNC=2."
    in_tile = nl.ndarray(inp.shape[1:], inp.dtype, buffer=nl.sbuf)
    out_tile = nl.ndarray(inp.shape[1:], inp.dtype, buffer=nl.sbuf)
    output = nl.ndarray(inp.shape, inp.dtype, buffer=nl.shared_hbm)
    slabs = range(2) if nl.num_programs() == 1 else [nl.program_id(0)]
    for i in slabs:
        nisa.dma_copy(in_tile, inp[i])
        nisa.reciprocal(out_tile, in_tile)
        nisa.dma_copy(output[i], out_tile)
    return output


@pytest.mark.parametrize('lnc', [1, 2])
def test_doc_lnc_split(lnc):
    x = rng.uniform(0.5, 2.0, (2, 128, 128)).astype(np.float32)
    np.testing.assert_allclose(simulate(lnc_reciprocal[lnc])(x), 1 / x, rtol=1e-6)
    assert last_trace().lnc == lnc and last_trace().program_instructions == ([6] if lnc == 1 else [3, 3])


def test_doc_access_patterns():
    "The access-pattern deep dive: t.ap([[16, 16], [1, 8]], offset=8) is t[0:16, 8:16]; a strided free access."
    @nki.jit
    def k(x):
        out = nl.ndarray((16, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((16, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((16, 16), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        a = t.ap(pattern=[[16, 16], [1, 8]], offset=8)
        assert a.get_pattern() == t.slice(1, 8, 16).get_pattern() and a.offset == 8
        c = nl.ndarray((16, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=c, src=a)
        nisa.dma_copy(dst=out, src=c)
        nisa.tensor_copy(dst=c, src=t.ap(pattern=[[16, 16], [2, 8]]))   # every other column
        nisa.dma_copy(dst=out2, src=c)
        return out, out2
    x = np.arange(256, dtype=np.float32).reshape(16, 16)
    o1, o2 = simulate(k)(x)
    np.testing.assert_array_equal(o1, x[:, 8:16]); np.testing.assert_array_equal(o2, x[:, 0::2])


# ---------------------------------------------------------------- the ten rules of issue 12
def _run1(body, *arrays, lnc=None):
    @nki.jit
    def k(*args):
        body(*args)
    return simulate(k if lnc is None else k[lnc])(*arrays)


def _trips(body, match, *arrays, lnc=None):
    with pytest.raises(NKIConstraintError, match=match) as e:
        _run1(body, *arrays, lnc=lnc)
    assert '\n' not in str(e.value)


def test_rule1_no_dst_rmw_op_accumulate_with_dma_compute():
    def old(x):
        t = nl.load(x)
        nisa.dma_copy(dst=x, src=t, dst_rmw_op=nl.add)
    _trips(old, r"nisa.dma_copy: got an unexpected keyword argument 'dst_rmw_op'", np.ones((128, 8), np.float32))

    @nki.jit
    def acc(x):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nisa.dma_copy(dst=out, src=t)
        for _ in range(3): nisa.dma_compute(dst=out, srcs=[t, out], reduce_op=nl.add)
        return out
    x = rng.standard_normal((128, 8), dtype=np.float32)
    np.testing.assert_allclose(simulate(acc)(x), 4 * x, rtol=1e-6)
    tr = last_trace()
    assert tr.hbm_read_bytes == 4 * x.nbytes and tr.hbm_write_bytes == 4 * x.nbytes   # 3 RMW reads + the load
    _trips(lambda x: nisa.dma_compute(dst=x, srcs=[x, x], reduce_op=nl.maximum), 'only nl.add', np.ones((4, 4), np.float32))


def test_rule2_bracket_is_the_logical_core_count(monkeypatch):
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out
    for bad in (4, 8, 0, (2, 2)):
        with pytest.raises(NKIConstraintError, match=r'the bracket is the logical-core count, 1 or 2'):
            k[bad]
    x = np.ones((4, 4), np.float32)
    simulate(k[2])(x)
    assert last_trace().lnc == 2
    monkeypatch.setenv('NEURON_LOGICAL_NC_CONFIG', '1')
    with pytest.raises(NKIConstraintError, match=r'NEURON_LOGICAL_NC_CONFIG=1'):
        simulate(k[2])(x)
    simulate(k[1])(x)


def test_rule3_unknown_keywords_are_errors():
    _trips(lambda: nisa.memset(dst=nl.ndarray((128, 4), dtype=nl.float32), value=0.0, mask=None),
           r"nisa.memset: got an unexpected keyword argument 'mask'; the NKI 0.8 signature is memset\(dst, value, engine=engine.unknown, name=None\)")
    _trips(lambda: nl.num_programs(axis=None), r"nl.num_programs: got an unexpected keyword argument 'axis'")
    _trips(lambda: nl.ndarray((128, 4), dtype=nl.float32, bogus=1), r"nl.ndarray: got an unexpected keyword argument 'bogus'")


def test_rule4_operands_agree_in_partitions_and_elements():
    def vec_as_tile():
        a, b = nl.zeros((128, 512), dtype=nl.float32), nl.zeros((128, 1), dtype=nl.float32)
        nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    _trips(vec_as_tile, r'tensor_tensor: data2 \(128, 1\) and data1 \(128, 512\) must have the same partition count')

    def broadcast_into_dst():   # NKI 0.2-era simulators broadcast a (128, 1) result over a (128, 512) dst
        a, b = nl.zeros((128, 512), dtype=nl.float32), nl.zeros((128, 1), dtype=nl.float32)
        nisa.activation(dst=a, op=nl.exp, data=b)
    _trips(broadcast_into_dst, r'activation: dst \(128, 512\) and data \(128, 1\) must have the same partition count')

    def fewer_partitions():
        a, b = nl.zeros((128, 64), dtype=nl.float32), nl.zeros((64, 128), dtype=nl.float32)
        nisa.tensor_copy(dst=a, src=b)
    _trips(fewer_partitions, r'tensor_copy: src \(64, 128\) and dst \(128, 64\) must have the same partition count')

    def ok():   # same partitions and elements per partition, different free shapes: fine
        a, b = nl.zeros((128, 4, 8), dtype=nl.float32), nl.zeros((128, 32), dtype=nl.float32)
        nisa.tensor_tensor(dst=b, data1=a, data2=b, op=nl.add)
    _run1(ok)


def test_rule5_partition_start_and_stride():
    def start(sl):
        def body():
            a = nl.zeros((128, 64), dtype=nl.float32)
            nisa.tensor_copy(dst=a[sl], src=a[sl])
        return body
    _trips(start(slice(32, 96)), r'covers partitions 32..95: an access of 64 partitions must start at partition 0 or 64')
    _trips(start(slice(16, 48)), r'covers partitions 16..47: an access of 32 partitions must start at partition 0, 32, 64 or 96')
    _trips(start(slice(1, 101)), r'an access of 100 partitions must start at partition 0')
    _trips(start(slice(0, 128, 2)), r'consecutive partitions')
    for ok in (slice(64, 128), slice(96, 128), slice(32, 64), slice(0, 100), slice(64, 100)): _run1(start(ok))


def test_rule6_matmul_onto_memset_psum():
    a = rng.standard_normal((128, 128), dtype=np.float32)

    def body(init, acc):
        def k(x):
            t = nl.load(x)
            ps = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
            if init == 'memset': nisa.memset(ps, 0.0)
            elif init == 'copy': nisa.tensor_copy(ps, t)
            nisa.nc_matmul(ps, t, t, accumulate=acc)
        return k
    for init in ('memset', 'copy'):
        _trips(body(init, None), r'nc_matmul: dst \(128, 128\) was last written by a non-matmul instruction', a)
        _trips(body(init, True), r'was last written by a non-matmul instruction', a)
        _run1(body(init, False), a)                       # an explicit overwrite starts a new group
    _trips(body(None, True), r'accumulate=True onto PSUM no matmul has written', a)
    _run1(body(None, None), a)

    @nki.jit
    def groups(x):
        o = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        ps = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, t, t)                          # first: overwrite (the NaN fill disappears)
        nisa.nc_matmul(ps, t, t)                          # then accumulate
        nisa.nc_matmul(ps, t, t, accumulate=False)        # restart
        s = nl.ndarray((128, 128), dtype=nl.float32)
        nisa.tensor_copy(s, ps)
        nl.store(o, s)
        return o
    np.testing.assert_allclose(simulate(groups)(a), a.T @ a, rtol=1e-5, atol=1e-4)


def test_rule7_affine_select_iota_num_programs_signatures():
    def old_affine():
        a = nl.zeros((128, 64), dtype=nl.float32)
        nisa.affine_select(a, [[-1, 64]], 0, 1, a, -1e4)   # 0.2: (dst, pattern, offset, channel_multiplier, on_true, on_false)
    _trips(old_affine, r'affine_select: on_true_tile must be a NKI tensor, got 1; the 0.6 order is')

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        m = nl.ndarray(x.shape, dtype=nl.float32)
        nisa.affine_select(m, [[-1, 64]], 1, t, -1.0, nl.greater_equal, 0)   # 0.6 positional order
        idx = nl.ndarray(x.shape, dtype=nl.int32)
        nisa.iota(idx, [[1, 64]])                                           # offset defaults to 0
        nisa.tensor_tensor(dst=m, data1=m, data2=idx, op=nl.add)
        assert nl.num_programs() == 1 and nl.program_id() == 0
        nl.store(out, m)
        return out
    x = np.ones((64, 64), np.float32)
    np.testing.assert_array_equal(simulate(k)(x), np.where(np.tril(np.ones((64, 64), bool)), 1.0, -1.0) + np.arange(64))


def test_rule8_buffers():
    _trips(lambda: nl.ndarray((128, 4), dtype=nl.float32, buffer='sbuf'), r"buffer='sbuf': string buffer names are not accepted")
    _trips(lambda: nl.zeros((128, 4), dtype=nl.float32, buffer='psum'), r"buffer='psum'")
    assert nl.hbm is nl.private_hbm

    @nki.jit
    def private_out(x):
        o = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=o, src=x)
        return o
    with pytest.raises(NKIConstraintError, match=r'output #0 \(4, 4\) is in private_hbm: kernel outputs must be allocated with buffer=nl.shared_hbm'):
        simulate(private_out)(np.ones((4, 4), np.float32))


def test_rule9_tiles_stay_2d():
    @nki.jit
    def k(x):
        t = nl.load(x)                                   # (128, 64)
        assert t[0].shape == (1, 64) and t[:, 3].shape == (128, 1) and t[5, 6].shape == (1, 1)
        assert x[0].shape == (64,) and x[0, 0].shape == (1,)   # HBM drops indexed dims
        row = nl.ndarray((1, 64), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=row, src=t[32])                     # one partition: it may start at 0, 32, 64 or 96
        col = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=col, src=t[:, 9])
        o = nl.ndarray((2, 128), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o[0, 0:64], src=row)
        nisa.dma_copy(dst=o[1], src=col)
        return o
    x = rng.standard_normal((128, 64), dtype=np.float32)
    o = simulate(k)(x)
    np.testing.assert_array_equal(o[0, :64], x[32]); np.testing.assert_array_equal(o[1], x[:, 9])

    def numpy_rules(x):   # NumPy would make t[0] a (64,) vector of the first partition: a (64, 1)-shaped dst no longer fits
        t = nl.load(x)
        d = nl.ndarray((64, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=d, src=t[0])
    _trips(numpy_rules, r'tensor_copy: src \(1, 64\) and dst \(64, 1\)', x)
    _trips(lambda x: nisa.tensor_copy(dst=nl.ndarray((1, 64), dtype=x.dtype), src=nl.load(x)[7]),
           r'src covers partitions 7..7: an access of 1 partition must start at partition 0, 32, 64 or 96', x)
    _trips(lambda x: nl.load(x)[0:200], r'0:200:None of dim 0 is out of range', x)


def test_rule10_float8_formats_are_distinct():
    assert nl.float8_e4m3 is not nl.float8_e4m3fn and np.dtype(nl.float8_e4m3) != np.dtype(nl.float8_e4m3fn)

    def mm(sdt, mdt):
        def body():
            a, b = nl.zeros((128, 128), dtype=sdt), nl.zeros((128, 128), dtype=mdt)
            p = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=p, stationary=a, moving=b)
        return body
    _trips(mm(nl.float8_e4m3, nl.float8_e4m3fn), r'moving is float8_e4m3fn \(OCP FP8\): a NeuronCore-v4 \(trn3\) matmul type')
    _run1(mm(nl.float8_e4m3, nl.float8_e5m2))
    _run1(mm(nl.float8_e4m3, nl.bfloat16))

    @nki.jit
    def cast(x):   # 448 is E4M3FN's largest value and out of E4M3's range (largest 240)
        o = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray(x.shape, dtype=nl.float8_e4m3); b = nl.ndarray(x.shape, dtype=nl.float8_e4m3fn)
        t = nl.load(x)
        nisa.tensor_copy(dst=a, src=t); nisa.tensor_copy(dst=b, src=t)
        r = nl.ndarray((x.shape[0], 2), dtype=nl.float32)
        nisa.tensor_copy(dst=r[:, 0:1], src=a); nisa.tensor_copy(dst=r[:, 1:2], src=b)
        nl.store(o, r[:, 0:1])
        return o, simulate_out(r)
    def simulate_out(r):
        o = nl.ndarray(r.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=r)
        return o
    _, r = simulate(cast)(np.float32([[448.0], [1.0]]))
    assert r[0, 1] == 448.0 and r[0, 0] != 448.0 and r[1].tolist() == [1.0, 1.0]


# ---------------------------------------------------------------- other constraints
def _mm(sshape, mshape, sdt=nl.bfloat16, mdt=nl.bfloat16, dshape=None, ddt=nl.float32):
    def body():
        s = nl.zeros(sshape, dtype=sdt, buffer=nl.sbuf)
        m = nl.zeros(mshape, dtype=mdt, buffer=nl.sbuf)
        d = nl.ndarray(dshape or (sshape[1], mshape[1]), dtype=ddt, buffer=nl.psum)
        nisa.nc_matmul(d, s, m)
    return body


def test_partition_limit():
    _trips(lambda: nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf),
           r"nl.ndarray: partition dimension 256 of 'tensor' exceeds the limit of 128 \(shape \(256, 4\), sbuf\)")
    _trips(lambda x: nl.load(x), r'nl.load: source partition dimension 200 exceeds the limit of 128', np.zeros((200, 4), np.float32))


def test_matmul_limits_and_dtypes():
    _trips(_mm((128, 128), (128, 1024), dshape=(128, 512)),
           r'nc_matmul: moving operand free size 1024 exceeds the TensorEngine limit of 512 \(shape \(128, 1024\)\)')
    _trips(_mm((128, 256), (128, 512), dshape=(128, 512)),
           r'nc_matmul: stationary operand free size 256 exceeds the TensorEngine limit of 128 \(shape \(128, 256\)\)')
    _trips(_mm((64, 128), (128, 512)), r'must share the partition \(contraction\) dimension')
    _trips(_mm((128, 128), (128, 128), sdt=nl.float32), r'stationary dtype float32 and moving dtype bfloat16: fp32 can only be multiplied with fp32')
    _trips(_mm((128, 128), (128, 128), sdt=nl.int32, mdt=nl.int32), r'nc_matmul: stationary dtype int32 is not supported')
    _trips(_mm((128, 128), (128, 128), ddt=nl.bfloat16), r'matmul results are written to PSUM as float32')

    def sbuf_dst():
        s = nl.zeros((128, 128), dtype=nl.bfloat16)
        nisa.nc_matmul(nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf), s, s)
    _trips(sbuf_dst, r'nc_matmul: dst is in sbuf \(shape \(128, 128\)\); it must be in psum')
    with pytest.raises(NotSimulatedError, match='perf_mode=double_row'):
        _run1(lambda: nisa.nc_matmul(nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum), nl.zeros((128, 128), dtype=nl.float8_e4m3),
                                     nl.zeros((128, 128), dtype=nl.float8_e4m3), perf_mode=nisa.matmul_perf_mode.double_row))


def test_memory_limits():
    _trips(lambda: nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum),
           r"PSUM tile 'tensor' needs 4096 bytes per partition, exceeding one PSUM bank of 2048 bytes")

    def psum_live():
        tiles = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum, name=f'p{i}') for i in range(9)]
        nisa.memset(tiles[0], 0.0)
    _trips(psum_live, r"live PSUM 18432 bytes per partition exceeds the limit of 16384 bytes, 8 banks of 2048 \(newest tile 'p8'")

    def psum_reuse():   # 8 banks live, reused in a loop: fine
        for _ in range(20):
            tiles = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum) for i in range(8)]
            nisa.memset(tiles[0], 0.0)
    _run1(psum_reuse)

    def sbuf_live():
        a = nl.ndarray((128, 32 * 1024), dtype=nl.float32, buffer=nl.sbuf, name='a')
        b = nl.ndarray((128, 24 * 1024), dtype=nl.float32, buffer=nl.sbuf, name='b')
        nisa.memset(a, 0.0)
    _trips(sbuf_live, r"memset: live SBUF 229376 bytes per partition exceeds the budget of 196608 bytes \(newest tile 'b'")


def test_limits_bind_inside_a_kernel_only():
    """Tiles held outside any kernel (a notebook's examples, an earlier notebook in the same test worker) add up on the
    process-wide scratch state; they must not make a later top-level example trip a limit no kernel reaches."""
    held = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum, name=f'held{i}') for i in range(9)]
    big = [nl.ndarray((128, n * 1024), dtype=nl.float32, buffer=nl.sbuf, name=f'big{n}') for n in (32, 24)]
    nisa.memset(held[0], 0.0)   # 9 PSUM banks and 224 KiB of SBUF live outside a kernel: counted, not refused

    def nine_banks():           # the same inside a kernel is refused, whatever the scratch state holds
        tiles = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum, name=f'p{i}') for i in range(9)]
        nisa.memset(tiles[0], 0.0)
    _trips(nine_banks, r"live PSUM 18432 bytes per partition exceeds the limit of 16384 bytes")
    _run1(lambda: nisa.memset(nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum), 0.0))   # and one bank is fine
    del held, big


def test_dma_rules():
    def from_psum(x):
        nisa.dma_copy(dst=x, src=nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum))
    _trips(from_psum, r'dma_copy: src is in PSUM \(shape \(128, 512\)\); DMA cannot access PSUM', np.zeros((128, 512), np.float32))
    _trips(lambda x: nisa.dma_copy(dst=nl.ndarray((128, 500), dtype=nl.float32), src=x),
           r'src \(256, 256\) \(65536 elements\) and dst \(128, 500\) \(64000 elements\) must hold the same number', np.zeros((256, 256), np.float32))
    _trips(lambda x: nisa.dma_copy(dst=x, src=x, priority=1), r'priorities need NeuronCore-v4', np.zeros((4, 4), np.float32))
    _trips(lambda x: nisa.dma_copy(dst=nl.ndarray((4, 4), dtype=nl.bfloat16), src=x, dge_mode=nisa.dge_mode.hwdge),
           r'hwdge moves raw bytes', np.zeros((4, 4), np.float32))
    _trips(lambda x: nisa.dma_copy(dst=x, src=x, dge_mode=2), r'dge_mode=2 must be a member of nisa.dge_mode', np.zeros((4, 4), np.float32))

    @nki.jit
    def reshape_copy(x):   # same element count, different shapes: copied in row-major order
        t = nl.ndarray((128, 512), dtype=nl.float32)
        nisa.dma_copy(dst=t, src=x)
        o = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o
    x = rng.standard_normal((256, 256), dtype=np.float32)
    np.testing.assert_array_equal(simulate(reshape_copy)(x), x.reshape(128, 512))


def test_engine_rules():
    def gpsimd_psum():
        p = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=nl.ndarray((128, 64), dtype=nl.float32), src=p, engine=nisa.engine.gpsimd)
    _trips(gpsimd_psum, r'tensor_copy: GpSimd engine cannot access PSUM: operand src is in PSUM')
    _trips(lambda: nisa.tensor_copy(dst=nl.zeros((128, 4), dtype=nl.float32), src=nl.zeros((128, 4), dtype=nl.float32), engine=5),
           r'engine=5 must be a member of nisa.engine')
    t = lambda: nl.zeros((128, 4), dtype=nl.float32)
    _trips(lambda: nisa.tensor_scalar(dst=t(), data=t(), op0=nl.subtract, operand0=1.0, engine=nisa.engine.scalar),
           r'the Scalar engine supports op0/op1 = multiply/add')
    _trips(lambda: nisa.tensor_scalar(dst=t(), data=t(), op0=nl.multiply, operand0=1.0, engine=nisa.engine.gpsimd),
           r'engine=gpsimd is only allowed for op0=nl.rsqrt')
    _trips(lambda: nisa.tensor_tensor(dst=t(), data1=t(), data2=t(), op=nl.exp), r'op=nl.exp is not a Vector-engine ALU operator')
    _trips(lambda: nisa.activation(dst=t(), op=nl.add, data=t()), r'op=nl.add is not an activation function')
    _trips(lambda: nisa.memset(dst=nl.ndarray((128, 4), dtype=nl.int32), value=2.0), r'value=2.0 for a int32 tile')
    _trips(lambda: nisa.tensor_scalar(dst=t(), data=t(), op0=nl.multiply, operand0=nl.zeros((128, 1), dtype=nl.bfloat16)),
           r'operand0 tile must be float32')
    _trips(lambda: nisa.tensor_tensor(dst=t(), data1=t(), data2=t(), op=nl.bitwise_and), r'bitvec operators need integer tiles')


def test_activation_rules():
    def body():
        t = nl.zeros((128, 4), dtype=nl.float32)
        nisa.activation(dst=t, op=nl.exp, data=t, reduce_op=nl.maximum, reduce_res=nl.ndarray((128, 1), dtype=nl.float32))
    _trips(body, r'activation: reduce_op=nl.maximum: the Scalar engine accumulators only add')
    _trips(lambda: nisa.activation(dst=nl.zeros((128, 4), dtype=nl.float32), op=nl.exp, data=nl.zeros((128, 4), dtype=nl.float32),
                                   reduce_cmd=nisa.reduce_cmd.reset_reduce), r'reduce_cmd=reset_reduce needs reduce_op=nl.add')


def test_tensor_reduce_axis_rules():
    def body():
        nisa.tensor_reduce(dst=nl.ndarray((128, 8), dtype=nl.float32), op=nl.add, data=nl.zeros((128, 4, 8), dtype=nl.float32), axis=1)
    _trips(body, r'tensor_reduce: axis 1 must be the last contiguous free axes of the tile \(shape \(128, 4, 8\)\)')

    @nki.jit
    def k(x):   # several trailing free axes at once
        t = nl.load(x)
        r = nl.ndarray((128, 2), dtype=nl.float32)
        nisa.tensor_reduce(dst=r, op=nl.maximum, data=t, axis=(2, 3))
        o = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o, r)
        return o
    x = rng.standard_normal((128, 2, 3, 4), dtype=np.float32)
    np.testing.assert_array_equal(simulate(k)(x), x.max((2, 3)))


def test_kernel_signature_rules():
    def kwonly(x, *, flag=True): return x
    with pytest.raises(NKIConstraintError, match=r"keyword-only parameters \['flag'\]"):
        nki.jit(kwonly)
    with pytest.raises(NKIConstraintError, match=r'platform_target= was removed in NKI 0.3'):
        nki.jit(platform_target='trn2')
    with pytest.raises(NKIConstraintError, match=r'argument 1 is a list'):
        _run1(lambda x, s: None, np.ones((4, 4), np.float32), [1, 1])


def test_views_and_broadcast_to():
    @nki.jit
    def k(x, v):
        t = nl.load(x)                                            # (128, 24)
        w = nl.load(v)                                            # (128, 1)
        wb = nl.broadcast_to(w, (128, 24))
        s = nl.ndarray((128, 4, 6), dtype=nl.float32)
        nisa.tensor_tensor(dst=s, data1=t.reshape_dim(1, (4, 6)), data2=wb, op=nl.multiply)
        p = nl.ndarray((128, 6, 4), dtype=nl.float32)
        nisa.tensor_copy(dst=p, src=s.permute((0, 2, 1)))
        o = nl.ndarray((128, 24), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=p)
        return o
    x, v = rng.standard_normal((128, 24), dtype=np.float32), rng.standard_normal((128, 1), dtype=np.float32)
    np.testing.assert_allclose(simulate(k)(x, v), (x * v).reshape(128, 4, 6).transpose(0, 2, 1).reshape(128, 24), rtol=1e-6)


# ---------------------------------------------------------------- Trace fields, hand counts
@nki.jit
def copy_kernel(x):
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in range(P // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], t)
    return out


def test_trace_copy_hbm_bytes_and_peak_sbuf():
    x = rng.standard_normal((4096, 256)).astype(bf16)
    np.testing.assert_array_equal(simulate(copy_kernel)(x), x)
    tr = last_trace()
    assert tr.hbm_read_bytes == 4096 * 256 * 2 and tr.hbm_write_bytes == 4096 * 256 * 2
    assert tr.dma_count == 2 * 32 and tr.peak_sbuf_bytes == 256 * 2 and tr.peak_psum_bytes == 0
    assert tr.tensor_flops == tr.pe_cycles == tr.vector_elems == tr.scalar_elems == tr.gpsimd_elems == 0
    assert tr.instructions == {'nl.load': 32, 'nl.store': 32} and tr.engine_instructions == {'dma': 64}


def test_trace_engine_instructions_and_elements():
    @nki.jit
    def k(x):
        t = nl.load(x)                                            # (128, 64): dma
        y = nl.ndarray((128, 64), dtype=nl.float32)
        r = nl.ndarray((128, 1), dtype=nl.float32)
        nisa.activation(dst=y, op=nl.silu, data=t, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)  # scalar: 2 instructions (the read-out)
        nisa.tensor_scalar(dst=y, data=y, op0=nl.rsqrt, operand0=0.0, engine=nisa.engine.gpsimd)
        m = nl.ndarray((128, 64), dtype=nl.float32)
        nisa.iota(dst=m, pattern=[[1, 64]])                       # gpsimd
        nisa.tensor_tensor(dst=y, data1=y, data2=m, op=nl.add)    # vector
        nisa.tensor_reduce(dst=r, op=nl.max, data=y, axis=1)      # vector
        ps = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=t, moving=t)            # tensor: 2 instructions
    simulate(k)(np.ones((128, 64), np.float32))
    tr = last_trace()
    assert tr.engine_instructions == dict(dma=1, scalar=2, gpsimd=2, vector=2, tensor=2) and tr.n_instructions == 9
    assert (tr.scalar_elems, tr.gpsimd_elems, tr.vector_elems) == (8192, 2 * 8192, 2 * 8192)
    assert tr.program_instructions == [9] and len(tr.timeline) == 7   # one sample per call
    assert tr.timeline_ops == [('nl.load', 'dma'), ('activation', 'scalar'), ('tensor_scalar', 'gpsimd'), ('iota', 'gpsimd'),
                               ('tensor_tensor', 'vector'), ('tensor_reduce', 'vector'), ('nc_matmul', 'tensor')]   # what each sample follows
    t = estimate_time(tr, breakdown=True)
    assert t['label'] == 'roofline estimate' and t['total'] == max(v for k_, v in t.items() if k_ in ('tensor', 'vector', 'scalar', 'gpsimd', 'hbm'))


def test_dry_run_counts_exactly():
    a = rng.standard_normal((384, 96)).astype(bf16)
    b = rng.standard_normal((384, 320)).astype(bf16)
    simulate(matmul_accumulate)(a, b); full = last_trace()
    dry = dry_run(matmul_accumulate)(a, b)
    assert dry.dry and not full.dry
    for f in ('hbm_read_bytes', 'hbm_write_bytes', 'peak_sbuf_bytes', 'peak_psum_bytes', 'tensor_flops', 'pe_cycles',
              'vector_elems', 'scalar_elems', 'gpsimd_elems', 'dma_count', 'instructions', 'engine_instructions', 'program_instructions'):
        assert getattr(dry, f) == getattr(full, f), f
    with pytest.raises(NKIConstraintError):   # rules are still checked
        dry_run(matmul_accumulate)(np.zeros((384, 200), bf16), b)


def test_instruction_limit_warning(monkeypatch):
    monkeypatch.setattr(sim, 'INSTRUCTION_LIMIT', 50)
    with pytest.warns(InstructionLimitWarning, match=r'copy_kernel\[1\]: 64 ISA instructions on one core exceed the compiler limit of 50 \(neuronx-cc error NCC_EXTP004\)'):
        simulate(copy_kernel)(np.zeros((4096, 8), np.float32))


def test_high_level_ops_and_vector_transpose():
    @nki.jit
    def k(x):
        t = nl.load(x)
        m = nl.max(nl.exp(t), axis=1, keepdims=True)
        o = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o, m)
        tt = nl.ndarray((16, 32), dtype=nl.float32)
        nisa.nc_transpose(dst=tt, data=t)
        o2 = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o2, tt)
        sm = nl.softmax(t, axis=1)
        o3 = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(o3, sm)
        return o, o2, o3
    x = rng.standard_normal((32, 16), dtype=np.float32)
    m, xt, sm = simulate(k)(x)
    np.testing.assert_allclose(m, np.exp(x).max(1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(xt, x.T)
    np.testing.assert_allclose(sm, np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-5)


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
    assert torch.equal(simulate(k)(x), x.to(torch.bfloat16))


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


def test_activation_accumulator_registers():
    @nki.jit
    def k(x):
        t = nl.load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32)
        r = nl.ndarray((x.shape[0], 4), dtype=nl.float32)
        nisa.activation(dst=y, op=nl.copy, data=t, reduce_res=r[:, 0:1])                      # idle: registers unwritten
        nisa.activation(dst=y, op=nl.copy, data=t, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=y, op=nl.square, data=t, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=r[:, 1:2])
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


def test_tensor_scalar_reduce_one_hot_gather():
    "The cross-entropy gather: one-hot of the target column by iota == target, then a sum of logits * one-hot."
    @nki.jit
    def k(logits, target):
        P, V = logits.shape
        x, tg = nl.load(logits), nl.load(target)
        tgf = nl.ndarray((P, 1), dtype=nl.float32)
        nisa.tensor_copy(dst=tgf, src=tg)
        col = nl.ndarray((P, V), dtype=nl.int32)
        nisa.iota(dst=col, pattern=[[1, V]], offset=0)
        onehot = nl.ndarray((P, V), dtype=nl.float32)
        nisa.tensor_scalar(dst=onehot, data=col, op0=nl.equal, operand0=tgf)
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


def test_trace_sum_and_kernel_calling_kernel():
    @nki.jit
    def inner(x):
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(y, nl.load(x))
        return y

    @nki.jit
    def outer(x): return inner(x)
    x = rng.standard_normal((256, 64), dtype=np.float32)
    np.testing.assert_array_equal(simulate(outer)(x[:128]), x[:128])
    assert last_trace().kernel == 'outer' and last_trace().dma_count == 2
    simulate(copy_kernel)(x); t1 = last_trace()
    simulate(lnc_reciprocal[2])(np.ones((2, 128, 128), np.float32)); t2 = last_trace()
    t = sum([t1, t2])
    assert t.hbm_read_bytes == t1.hbm_read_bytes + t2.hbm_read_bytes and t.dma_count == 4 + 4
    assert t.engine_instructions['dma'] == 4 + 4 and t.program_instructions == [4, 3, 3] and 'timeline' not in repr(t)


# ---------------------------------------------------------------- real-SDK detection
def _probe(tmp_path, files):
    import subprocess, sys
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


def test_the_facade_reaches_and_instruments_the_submodules():
    "`neuronfrontier.sim` is a package: an internal read through it comes from its submodule, one assigned through it is rebound there."
    from neuronfrontier.sim import isa, language, trace
    assert sim._hbm_count is isa._hbm_count and sim._LAST is trace._LAST and sim._valueless is language._valueless
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"): sim.no_such_name
    orig, writes = sim._hbm_count, []
    sim._hbm_count = lambda tr, t, write: writes.append((write, t.buffer.name)) or orig(tr, t, write)   # as 16_nki_sim does
    try:
        simulate(tiled_add)(np.ones((128, 8), np.float32), np.ones((128, 8), np.float32))
    finally:
        sim._hbm_count = orig
    assert [b for w, b in writes if w] == ['sbuf', 'sbuf', 'shared_hbm']   # two nl.load, one nl.store
    assert isa._hbm_count is orig and '_hbm_count' not in vars(sim)


# ---------------------------------------------------------------- what NKI 0.7 and 0.8 changed, enforced
def test_removed_names_say_what_replaces_them():
    assert not hasattr(nl, 'dynamic_range')                  # removed in 0.7: an AttributeError that says what to use
    with pytest.raises(sim.RemovedNameError, match=r'nl.dynamic_range: removed in NKI 0.7.0; use nl.fori_loop'):
        nl.dynamic_range(4)


def test_deprecated_names_warn_at_the_call_site():
    with pytest.warns(DeprecationWarning, match=r'nisa.sendrecv is deprecated since NKI 0.8.0: use nki.lnc.sendrecv'):
        with pytest.raises(NotSimulatedError): nisa.sendrecv(None, None, 0, 1, 0)
    with pytest.warns(DeprecationWarning, match=r'nl.affine_range is deprecated since NKI 0.7.0: use range'):
        assert list(nl.affine_range(3)) == [0, 1, 2]
    assert 'nki.lnc.sendrecv' in sim.NOT_SIMULATED and callable(sim.emu_nki.lnc.core_barrier)


def test_new_names_and_signatures_of_0_7_and_0_8():
    for name in ('NkiScalar', 'scalar_load', 'scalar_store', 'scalar_alu'): assert f'nisa.{name}' in sim.NOT_SIMULATED
    for name in ('if_else', 'tiles', 'alloc_tiles'): assert f'nl.{name}' in sim.NOT_SIMULATED
    cfg = sim.emu_nki.compiler.CompileConfig(dead_code_elim=False)
    k = sim.emu_nki.jit(tiled_add, compile_config=cfg)                       # 0.7's keyword-only compile options
    assert simulate(k)(np.ones((128, 4), np.float32), np.ones((128, 4), np.float32)).sum() == 1024
    _trips(lambda: sim.emu_nki.jit(tiled_add, compile_config={'opt': 1}), r'nki.jit: compile_config= takes a nki.compiler.CompileConfig')
    t = nl.ndarray((128, 4), dtype=nl.float32)
    _trips(lambda: nisa.activation(dst=t, op=nl.exp, data=t, engine=nisa.engine.gpsimd), r'activation: engine=gpsimd: .* NeuronCore-v4')


@nki.jit
def branch_on_values(x):
    "Python control flow on a tile's values: what tracing (NKI 0.7+) cannot do."
    t = nl.load(x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    if t: nl.store(out, t)
    return out


def test_python_cannot_branch_on_device_values():
    with pytest.raises(NKIConstraintError, match=r'used as a Python truth value: its values are unknown while the kernel is traced'):
        simulate(branch_on_values)(np.ones((128, 4), np.float32))
