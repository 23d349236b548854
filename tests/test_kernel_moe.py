"ops.moe_mlp with backend nki-sim against the torch backend on shapes the notebook does not show, and a training run."
import pytest
import torch
from neuronfrontier import ops
from neuronfrontier.hw import PMAX as P
from neuronfrontier.chip.testing import compare_backends, traffic, train_losses
from neuronfrontier.kernels.moe import (moe_mlp_nki_sim, moe_fwd_kernel, moe_bwd_kernel, TOL, hbm_traffic,
                                        _register_nki, NKI_REGISTERED)


def moe_inputs(n_blocks, E, d, F_, dtype=torch.float32, seed=0, table=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_blocks * P, d, generator=g).to(dtype)
    wg, wu = ((torch.randn(E, d, F_, generator=g) / d ** 0.5).to(dtype) for _ in range(2))
    wd = (torch.randn(E, F_, d, generator=g) / F_ ** 0.5).to(dtype)
    be = torch.tensor(table) if table is not None else torch.randint(0, E, (n_blocks,), generator=g).sort().values
    return x, wg, wu, wd, be.to(torch.int32)


@pytest.mark.parametrize("n_blocks,E,d,F_,dtype,table", [
    (3, 5, 384, 128, torch.float32, [1, 3, 4]),                  # d > F, most experts empty
    (7, 2, 128, 640, torch.float32, [0, 0, 0, 0, 0, 0, 1]),      # F > 512: two PSUM column chunks in the backward
    (4, 3, 640, 256, torch.bfloat16, [0, 1, 1, 2]),               # d > 512, bf16
])
def test_moe_mlp_matches_torch(n_blocks, E, d, F_, dtype, table):
    e = compare_backends("moe_mlp", *moe_inputs(n_blocks, E, d, F_, dtype, seed=3, table=table), seed=3)
    assert max(e.values()) < TOL[dtype], e


def test_odd_core_split():
    "3 blocks on 2 logical cores split 1 + 2; expert 1 has none."
    e = compare_backends("moe_mlp", *moe_inputs(3, 3, 128, 128, seed=4, table=[0, 2, 2]), seed=4)
    assert max(e.values()) < TOL[torch.float32], e


def test_bad_input_names_op_and_rule():
    x, wg, wu, wd, be = moe_inputs(2, 2, 128, 128)
    with pytest.raises(ValueError, match=r"ops.moe_mlp \(nki-sim\).*\[2, 128, 128\]"):
        moe_mlp_nki_sim(x, wg, wu, wd[:, :, :64], be)
    with pytest.raises(ValueError, match="fp32 or bf16"):
        moe_mlp_nki_sim(x.half(), wg.half(), wu.half(), wd.half(), be)


def test_simulator_refuses_expert_index_out_of_range():
    "The dynamic select bounds-checks the table like the hardware's oob_mode=error."
    x, wg, wu, wd, _ = moe_inputs(2, 2, 128, 128)
    with pytest.raises(Exception, match="out of range"):
        moe_mlp_nki_sim(x, wg, wu, wd, torch.tensor([0, 2], dtype=torch.int32))


def test_traffic_model_equals_simulator():
    args = moe_inputs(5, 3, 128, 256, torch.bfloat16, table=[0, 1, 1, 1, 2])
    dy = torch.randn(5 * P, 128).to(torch.bfloat16)
    for lnc in (1, 2):
        m = hbm_traffic(5, 3, 128, 256, 2, lnc)
        assert traffic(moe_fwd_kernel[lnc], *args).hbm_bytes == m["fwd"]["kernel"]
        assert traffic(moe_bwd_kernel[lnc], *args, dy).hbm_bytes == m["bwd"]["kernel"]
        assert m["fwd"]["kernel"] >= m["fwd"]["compulsory"]


def test_nki_backend_registers_through_nki_op(fake_torch_neuronx):
    "With a stand-in torch_neuronx the nki backend registers and runs the kernels (here: through the simulator)."
    assert NKI_REGISTERED is False
    try:
        assert _register_nki(fake_torch_neuronx) is True
        e = compare_backends("moe_mlp", *moe_inputs(2, 2, 128, 128, seed=6), backend="nki", seed=6)
        assert max(e.values()) < TOL[torch.float32], e
    finally:
        ops._IMPLS["moe_mlp"].pop("nki", None)


# 17 s on a quiet 2-core CPU (measured on CPU)
@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_cpu_tiny_moe_training_matches_torch():
    "cpu-tiny-moe, 10 AdamW steps, fp32, experts by the nki-sim kernels: the torch losses within 1e-4."
    ref = train_losses("cpu-tiny-moe", "torch", batch=1)
    sim = train_losses("cpu-tiny-moe", "moe_mlp=nki-sim", batch=1)
    assert ref[-1] < ref[0] - 0.5, ref          # it learns
    assert max(abs(a - b) for a, b in zip(ref, sim)) <= 1e-4, (ref, sim)
