"The whole-step roofline estimate of `neuronfrontier.hw` (nbs/10_hardware.ipynb): its extrapolated kernel traces against full dry runs, and its bookkeeping."
import numpy as np
import pytest
from neuronfrontier.engine.config import ModelConfig
from neuronfrontier.hw import estimate_time, mfu, PMAX
from neuronfrontier.research.cost import Work, kernel_work, step_estimate, matmul_work, STEP_OPS
from neuronfrontier.sim import REAL_NKI, nl, dry_run
from neuronfrontier.kernels import rmsnorm as R, swiglu as S, cross_entropy as C, mlp as M

pytestmark = pytest.mark.skipif(REAL_NKI, reason="dry runs need the emulator")
bf = lambda *s: np.empty(s, nl.bfloat16)
f32 = lambda *s: np.empty(s, np.float32)
FIELDS = ('pe_cycles', 'vector_elems', 'scalar_elems', 'gpsimd_elems', 'hbm_read_bytes', 'hbm_write_bytes', 'tensor_flops')


def _close(a, b, rel=1e-9):
    for f in FIELDS: assert getattr(a, f) == pytest.approx(getattr(b, f), rel=rel, abs=1e-6), f


def test_token_parallel_kernels_extrapolate_exactly():
    "rmsnorm and swiglu: two dry runs at n1 and 2·n1 tokens, extrapolated to N, equal one dry run at N."
    N, d, F = 5 * 1024, 256, 768
    full = (Work.of(dry_run(R.rmsnorm_fwd_kernel[1])(bf(N, d), bf(1, d), 1e-6))
            + Work.of(dry_run(R.rmsnorm_bwd_kernel[1])(bf(N, d), bf(1, d), f32(N, 1), bf(N, d))))
    _close(kernel_work('rmsnorm', N, d), full)
    nb = S.bwd_chunk(d, 2)
    full = (Work.of(dry_run(S.swiglu_fwd_kernel[1])(bf(N, d), bf(F, d), bf(F, d)))
            + sum(Work.of(dry_run(S.swiglu_bwd_kernel[1])(bf(n, d), bf(F, d), bf(F, d), bf(n, F)))
                  for n in [nb] * (N // nb) + ([N % nb] if N % nb else [])))
    _close(kernel_work('swiglu', N, d, F), full)
    nb = M.bwd_chunk(d, 2)   # the fused ReLU² MLP: one forward call, the backward in the wrapper's chunks
    full = (Work.of(dry_run(M.relu2_mlp_fwd_kernel[1])(bf(N, d), bf(F, d), bf(d, F), 0.35, False))
            + sum(Work.of(dry_run(M.relu2_mlp_bwd_kernel[1])(bf(n, d), bf(F, d), bf(d, F), bf(n, d), 0.35))
                  for n in [nb] * (N // nb) + ([N % nb] if N % nb else [])))
    _close(kernel_work('relu2_mlp', N, d, F), full)
    # weights too wide for SBUF: the wrapper splits F into blocks whose fp32 partial outputs it adds; priced so too
    N, d, F = 1024, 1280, 5120
    fb, nb = M.fwd_block(d, F, 2), M.bwd_chunk(d, 2)
    assert fb < F
    full = (sum(Work.of(dry_run(M.relu2_mlp_fwd_kernel[1])(bf(N, d), bf(min(fb, F - f0), d), bf(d, min(fb, F - f0)),
                                                             0.35, True)) for f0 in range(0, F, fb))
            + sum(Work.of(dry_run(M.relu2_mlp_bwd_kernel[1])(bf(n, d), bf(F, d), bf(d, F), bf(n, d), 0.35))
                  for n in [nb] * (N // nb) + ([N % nb] if N % nb else [])))
    _close(kernel_work('relu2_mlp', N, d, F), full)


def test_cross_entropy_extrapolates_in_blocks_and_vocabulary():
    "N a whole number of blocks, V a multiple of 512: the 2 x 2 extrapolation equals the full dry runs."
    d, V = 256, 3072
    N = C._block_tiles(10**6, d, 2, True) * PMAX * 2
    tgt = np.empty((N, 1), np.int32)
    bt_f, bt_b = C._block_tiles(N, d, 2, False), C._block_tiles(N, d, 2, True)
    assert N % (bt_f * PMAX) == 0 and N % (bt_b * PMAX) == 0
    full = (Work.of(dry_run(C.cross_entropy_fwd_kernel[1])(bf(N, d), bf(V, d), tgt, V, 15.0, bt_f))
            + Work.of(dry_run(C.cross_entropy_bwd_kernel[1])(bf(N, d), bf(V, d), tgt, f32(N, 1), f32(N, 1), V, 15.0, bt_b)))
    _close(kernel_work('cross_entropy', N, d, V, 15.0), full)


def test_step_estimate_bookkeeping():
    cfg = ModelConfig(vocab_size=2048, d_model=256, n_layers=2, n_heads=4, d_head=64, d_mlp=768, seq_len=512)
    e = step_estimate(cfg, batch=4)
    assert tuple(e['ops']) == STEP_OPS and e['label'] == 'roofline estimate'
    assert e['step_s'] == pytest.approx(sum(o['total'] for o in e['ops'].values()))
    assert e['serial_s'] == pytest.approx(sum(o['serial'] for o in e['ops'].values())) and e['serial_s'] > e['step_s']
    assert e['tokens_per_s'] == pytest.approx(8 * 4 * 512 / e['step_s'])
    assert e['mfu'] == pytest.approx(mfu(e['tokens_per_s'], cfg.flops_per_token(), 'trn2'))
    for o in e['ops'].values():
        assert o['total'] == max(o[k] for k in ('tensor', 'vector', 'scalar', 'gpsimd', 'hbm'))
        assert o['total'] == pytest.approx(estimate_time(o['work']))
    flops = sum(o['work'].tensor_flops for o in e['ops'].values())
    assert flops >= 4 * 512 * cfg.flops_per_token()        # the traced and modelled matmuls cover the model's FLOPs
    one = step_estimate(cfg, batch=4, world=1)             # no collectives on one core
    assert one['ops']['collectives']['total'] == 0 and one['ops']['attention'] == e['ops']['attention']
    assert step_estimate(cfg, batch=8)['ops']['MLP']['total'] > e['ops']['MLP']['total']
    adam = step_estimate(cfg, batch=4, optim='adamw')
    assert adam['ops']['optimizer']['work'].tensor_flops == 0 < e['ops']['optimizer']['work'].tensor_flops   # no Newton–Schulz
    with pytest.raises(ValueError, match="optim"): step_estimate(cfg, batch=4, optim='sgd')
    with pytest.raises(ValueError, match="unknown kernel"): kernel_work('softmax', 1)


def test_matmul_work_is_the_tensor_peak():
    w = matmul_work(1024, 1024, 1024)
    assert estimate_time(w) == pytest.approx(w.tensor_flops / 79e12, rel=0.01)   # 79 TFLOP/s bf16 per core
    assert estimate_time(w, breakdown=True)['serial'] > estimate_time(w)


def test_step_estimate_accumulates_micro_batches_and_prices_pytorch_ops():
    "accum: the micro-batch ops k times, the optimizer and collectives once; kernels=False: PyTorch's ops (assumption 7)."
    cfg = ModelConfig(vocab_size=2048, d_model=256, n_layers=2, n_heads=4, d_head=64, d_mlp=768, seq_len=512)
    one, four = step_estimate(cfg, batch=4), step_estimate(cfg, batch=4, accum=4)
    for op in ('embedding', 'attention', 'MLP', 'norms & residual', 'loss'):
        assert four['ops'][op]['total'] == pytest.approx(4 * one['ops'][op]['total']), op
    for op in ('optimizer', 'collectives'): assert four['ops'][op] == one['ops'][op]
    assert four['tokens_per_step'] == 4 * one['tokens_per_step'] and four['accum'] == 4
    plain = step_estimate(cfg, batch=4, kernels=False)
    assert plain['kernels'] is False and plain['ops']['optimizer'] == one['ops']['optimizer']
    # PyTorch's attention scores every key (the masked half too) and writes the T × T scores through HBM
    at, ak = plain['ops']['attention']['work'], one['ops']['attention']['work']
    assert at.tensor_flops > ak.tensor_flops and at.hbm_bytes > ak.hbm_bytes
    assert plain['ops']['loss']['work'].hbm_bytes > one['ops']['loss']['work'].hbm_bytes   # the fp32 logits


def test_the_readme_step_table_is_the_commands_output():
    "README.md's step-estimate table is what `python benchmarks/step_estimate.py --readme` writes (not stale)."
    import importlib.util, re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("step_estimate_bench", root / "benchmarks" / "step_estimate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    readme = (root / "README.md").read_text()
    m = re.search(re.escape(bench.MARK[0]) + r"\n(.*?)\n" + re.escape(bench.MARK[1]), readme, re.S)
    assert m, "README.md lost its step-estimate markers"
    assert m.group(1) == bench.table(), "README's step table is stale: run python benchmarks/step_estimate.py --readme"
