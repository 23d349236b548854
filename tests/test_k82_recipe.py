"""Issue 50: the `trn2` recipe computes what K82s4 computes (docs/k82s4.md's thirteen differences, each now K82s4's).
Each test states K82s4's behaviour (its file's line in brackets) and fails on the recipe as it was before: best-fit
rows, BOS trained on, the residual scalars at 0.01x, the kit's init, no q gain, bf16 tables, NorMuon 0.95, NS 1.02,
decay fading, the ramp in steps, a linear cooldown, whole pools, the EMA from step 0. The step-for-step comparison with
K82s4's own file is benchmarks/k82_parity.py (it needs that file; these tests do not)."""
import random, types

import pytest
import torch

from neuronfrontier import ops
from neuronfrontier.data.batches import RollingPool, _training_rows
from neuronfrontier.engine.config import resolve
from neuronfrontier.data.shards import StreamRows
from neuronfrontier.engine.model import GPT
from neuronfrontier.engine.optim import apply_schedule, build_optimizers, lr_multiplier, weight_decay_multiplier

SMALL = ["d_model=256", "n_layers=4", "seq_len=256", "eval_seq_len=256", "global_batch_tokens=8192"]


def test_the_trn2_recipe_is_k82s4s_settings():
    m, t = resolve("trn2-124m")
    assert (m.qk_gain, m.rms_eps, m.embed_dtype, m.wte_std, m.mlp_up_init, m.ve_std, m.x0_init) == \
        (1.44, None, "fp32", 0.8, 0.4, 1.0, 0.05)                                  # l.599, 328, 26, 890, 587, 1896, 894
    assert (t.rows, t.stream_mix, t.mask_bos_targets, t.row_pool_mode) == ("streams", 8, True, "rolling")   # l.499-610
    assert (t.normuon_beta2, t.ns_safety, t.ns_eps, t.wd_fade) == (0.9, 1.01, 1e-6, False)       # l.604, 3387, 4399
    assert (t.muon_momentum_unit, t.cooldown_levels, t.ema_prewarm, t.ema_pure_above) == ("full_batch", 19, 4, 0.15)
    assert (t.resid_lr_scale, t.embed_lr, t.head_lr, t.scalar_lr) == (1.0, 0.42426, 0.0084852, 0.28284)   # l.2022


def test_the_scalar_group_and_the_init_are_k82s4s():
    m, t = resolve("trn2-124m", None, SMALL)
    torch.manual_seed(0)
    g = GPT(m)
    assert all(p.dtype == torch.float32 for p in g.parameters())   # fp32 tables, so fp32 AdamW moments
    bound = (3 / m.d_model) ** 0.5
    w_up = torch.cat([b.mlp.w_up.weight.flatten() for b in g.blocks])
    assert 0.39 * bound < w_up.abs().max() <= 0.4 * bound
    assert abs(g.wte.weight.std().item() - 0.8) < 0.01 and abs(g.value_embeds["0"].weight.std().item() - 1) < 0.01
    assert torch.equal(g.x0_lambdas, torch.full_like(g.x0_lambdas, 0.05))
    adam = build_optimizers(g, t, print_table=False)[-1]
    groups = {gr["role"]: gr for gr in adam.param_groups}
    assert {groups[r]["lr"] for r in ("scalar", "resid", "x0")} == {0.28284}
    assert {groups[r]["betas"] for r in ("scalar", "resid", "x0")} == {(0.9, 0.95)}


def test_q_gain_and_the_norms_epsilon():
    m, _ = resolve("trn2-124m", None, SMALL)
    torch.manual_seed(0)
    g = GPT(m, kernels="torch")
    with torch.no_grad():
        for b in g.blocks: b.attn.wo.weight.normal_(std=0.02)   # let attention reach the output
    idx = torch.randint(0, 8192, (1, 64))
    with torch.no_grad():
        with_gain = g(idx)
        for b in g.blocks: b.attn.qk_gain = 1.0
        assert not torch.allclose(g(idx), with_gain)
    eps = []
    with ops.watched(["rms_norm"], lambda op, args, kw: eps.append(args[2])), g.using(ops.OpSet("torch")):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16): g(idx)
        with torch.no_grad(): g(idx)
    assert set(eps) == {2.0 ** -7, 2.0 ** -23}   # bf16 under autocast (the chip), fp32 here: F.rms_norm(eps=None)


def test_stream_rows_deal_documents_to_the_shortest_stream_and_cut_at_stride_t():
    "Documents of known ids: each (BOS first) joins the shortest of 2 streams; row r from stream r mod 2."
    docs = [[[1] * 5, [2] * 3], [[3] * 6, [4] * 2, [5] * 9]]   # two batches of 'texts', already ids
    rows = StreamRows(iter((d, 0) for d in docs), lambda texts: texts, bos=0, batch_size=2, seq_len=4, n_streams=2,
                      mask_bos=True)
    x, y = next(rows)
    # stream 0: 0 1 1 1 1 1, stream 1: 0 2 2 2; row 1 needs 5 tokens: the 3s join stream 0 (2 left < 4), the 4s and 5s
    # stream 1
    assert x.tolist() == [[0, 1, 1, 1], [0, 2, 2, 2]]
    assert y.tolist()[1] == [2, 2, 2, -1]   # the next document's BOS, masked
    x2, y2 = next(rows)   # stride T: each row goes on from the last token of its stream's previous row
    assert x2.tolist() == [[1, 1, 0, 3], [0, 4, 4, 0]] and y2.tolist() == [[1, -1, 3, 3], [4, 4, -1, 5]]


def test_the_rolling_pool_reads_ahead_keeps_order_then_draws_without_replacement():
    def mbs(n):
        for i in range(n): yield torch.arange(4 * i, 4 * i + 4)[:, None], torch.arange(4 * i, 4 * i + 4)[:, None]
    src = mbs(100)
    pool = RollingPool(src, size=8, start=3, seed=73, rank=1, salt=4)
    out = [next(pool)[0][:, 0].tolist() for _ in range(40)]
    assert out[:3] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]   # the first `start`: stream order
    flat = [v for mb in out for v in mb]
    assert len(set(flat)) == len(flat)                                 # none twice
    assert max(out[3]) > 4 * 8                                         # drawn from micro-batches read ahead
    again = RollingPool(mbs(100), 8, 3, seed=73, rank=1, salt=4)
    assert [next(again)[0][:, 0].tolist() for _ in range(40)] == out   # K82s4's seed·7919 + rank + 7777·salt
    other = RollingPool(mbs(100), 8, 3, seed=73, rank=0, salt=4)
    assert [next(other)[0][:, 0].tolist() for _ in range(40)] != out
    # the first draw: every row of micro-batches 3-11 waits (l.3702-3715)
    rng = random.Random(73 * 7919 + 1 + 7777 * 4)
    waiting = list(range(12, 48))
    j = rng.randrange(len(waiting))
    waiting[j], waiting[-1] = waiting[-1], waiting[j]
    assert out[3][0] == waiting.pop()


def test_the_staircase_the_constant_decay_and_the_ramp_in_full_batches():
    _, t = resolve("trn2-124m")
    assert lr_multiplier(0.29, t) == 1.0 and lr_multiplier(0.3 + 1e-9, t) == 0.95   # l.3894-3902: level 19 of 20
    assert lr_multiplier(0.3 + 0.7 * 10.5 / 19, t) == 9 / 20 and lr_multiplier(1.0, t) == 1 / 20
    assert weight_decay_multiplier(0.9, t) == 1.0                                     # constant x lr (l.4399)
    m, _ = resolve("trn2-124m", None, SMALL)
    opts = build_optimizers(GPT(m), t, print_table=False)
    _, mom = apply_schedule(opts, t, 0.1, step=60, full_batches=30.0)   # a batch warm-up: 60 steps, 30 full batches
    assert mom == pytest.approx(0.85 + 0.1 * 30 / 300)


def test_a_submission_reads_the_kits_document_batches_or_says_it_reads_the_shards(pydocs, monkeypatch):
    from neuronfrontier.submission import kit_prepare, entry as submission
    monkeypatch.setenv("NEURON_COMPETITION_R1_CACHE_DIR", str(pydocs))
    _, t = resolve("trn2-124m", None, SMALL)
    tok = kit_prepare.ensure_tokenizer()
    rows = submission.kit_rows(kit_prepare, tok)(73, t, 256)
    assert isinstance(rows, StreamRows)
    x, y = next(rows)
    assert x.shape == (8, 256) and (y == -1).any() and not (y == tok.get_bos_token_id()).any()
    spec = types.SimpleNamespace(rows=submission.kit_rows(kit_prepare, tok))
    pooled, _ = _training_rows(spec, [], None, t, 256, 0, 1, 73)
    assert isinstance(pooled, RollingPool)
    assert "of the kit's documents (its _document_batches)" in submission._rows_line(True, True, kit_prepare, "d")
    no_reader = type("Kit", (), {})()
    assert "(the kit's prepare.py has no _document_batches)" in submission._rows_line(True, False, no_reader, "d")
    assert submission.kit_data_fails(kit_prepare, tok, streams=True) == ""
    assert "AttributeError" in submission.kit_data_fails(no_reader, tok, streams=True)
