"""Issue 37's row pool (`row_pool`, `row_pool_from`, `row_pool_salt`): rows drawn without replacement from a pool of
micro-batches, the same rows on one rank and on two with 'global' sharding, and a resume that goes on with them."""
import json
from types import SimpleNamespace

import pytest
import torch

import neuronfrontier.run.trainer as T
from neuronfrontier.data.batches import RowPool, _training_rows, rank_loader
from neuronfrontier.engine.config import TrainConfig, resolve, validate_train
from neuronfrontier.engine.sources import setting_sources
from neuronfrontier.data.shards import PackedLoader, find_shards, load_tokenizer


def _stream(n=None, B=3):
    "Micro-batch i holds the rows 3i, 3i+1, 3i+2 (each row's tokens are its number); y = x + 1."
    i = 0
    while n is None or i < n:
        x = torch.arange(i * B, (i + 1) * B)[:, None].repeat(1, 5)
        yield x, x + 1
        i += 1


def _ids(batches):
    return [x[:, 0].tolist() for x, _ in batches]


def _take(it, n):
    return [next(it) for _ in range(n)]


def test_each_pool_is_a_permutation_of_its_micro_batches_and_the_head_is_the_stream():
    pooled, stream = _take(RowPool(_stream(), size=4, start=3, salt=(4, 0)), 3 + 4 * 5), _take(_stream(), 3 + 4 * 5)
    assert _ids(pooled[:3]) == _ids(stream[:3])   # before row_pool_from: the stream as it is
    for p in range(5):
        got, want = (sum(_ids(b[3 + 4 * p:7 + 4 * p]), []) for b in (pooled, stream))
        assert sorted(got) == want and got != want, p   # the pool's rows, each once, in another order
    assert all(len(x) == 3 and torch.equal(y, x + 1) for x, y in pooled)   # rows stay whole: x with its own y


def test_the_salt_fixes_the_order():
    a, b, c = (_ids(_take(RowPool(_stream(), 4, 0, salt=(s, 0)), 12)) for s in (4, 4, 5))
    assert a == b and a != c
    r1 = _ids(_take(RowPool(_stream(), 4, 0, salt=(4, 1)), 12))   # another rank: another order
    assert r1 != a


@pytest.mark.parametrize("start", [0, 3])
def test_skip_n_goes_on_like_an_unskipped_pool(start):
    "`skip(n)` on a fresh pool (what --resume does), then next: the (n+1)-th micro-batch of an unskipped run."
    ref = _take(RowPool(_stream(), 4, start, salt=(4, 0)), 24)
    for n in range(20):
        rest = _take(RowPool(_stream(), 4, start, salt=(4, 0)).skip(n), 4)
        assert _ids(rest) == _ids(ref[n:n + 4]), n


def test_a_finite_stream_ends_with_its_last_partial_pool():
    assert sorted(sum(_ids(RowPool(_stream(10), 4, 1)), [])) == list(range(30))


def test_settings_are_checked_and_have_sources():
    t = TrainConfig(row_pool=256, row_pool_from=96, row_pool_salt=4)
    assert (t.batch.row_pool, t.batch.row_pool_from, t.batch.row_pool_salt) == (256, 96, 4)
    for k in ("row_pool", "row_pool_from", "row_pool_salt"):
        with pytest.raises(ValueError, match=f"{k}=-1 must be >= 0"): validate_train(TrainConfig(**{k: -1}))
    rows = {k: src for k, _, src in setting_sources("cpu-micro")}
    assert "FrontierForge" in rows["row_pool"] and rows["row_pool_from"] and rows["row_pool_salt"]


@pytest.fixture(scope="module")
def shards(pydocs):
    return find_shards(pydocs)[0], load_tokenizer(pydocs / "tokenizer")[0]


def test_global_sharding_pools_before_the_split(shards):
    "'global': one process and two processes train on the same rows, micro-batch for micro-batch, pooled or not."
    paths, enc = shards
    sets = ["data_sharding=global", "row_pool=3", "row_pool_from=1", "row_pool_salt=4"]
    one_t, two_t = (resolve("cpu-micro", sets=sets + [f"batch_size={b}"])[1] for b in (4, 2))
    one = _take(iter(rank_loader(paths, enc, one_t, 64, 0, 1, 0)[1]), 7)
    ranks = [_take(iter(rank_loader(paths, enc, two_t, 64, r, 2, 0)[1]), 7) for r in (0, 1)]
    for a, b0, b1 in zip(one, *ranks): assert torch.equal(a[0], torch.cat([b0[0], b1[0]]))
    plain = _take(PackedLoader(paths, enc, 4, 64, seed=0), 7)
    assert torch.equal(one[0][0], plain[0][0]) and not torch.equal(one[1][0], plain[1][0])   # pooled from mb 1
    assert sorted(torch.cat([x for x, _ in one[1:4]]).tolist()) == sorted(torch.cat([x for x, _ in plain[1:4]]).tolist())


def test_rank_sharding_and_the_kits_rows_are_pooled_and_resume(shards):
    "'rank': each rank pools its own rows; the kit's loader (spec.rows) is pooled too; both skip exactly."
    paths, enc = shards
    t = resolve("cpu-micro", sets=["batch_size=2", "row_pool=3", "row_pool_from=1"])[1]
    loader, rows = rank_loader(paths, enc, t, 64, 1, 2, 0)
    assert isinstance(loader, RowPool) and loader is rows and loader.rank == 1
    ref = _take(rows, 8)
    assert 0 < loader.utilisation <= 1   # the loader's statistics, through the pool
    resumed = rank_loader(paths, enc, t, 64, 1, 2, 0)[0].skip(5)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(_take(resumed, 3), ref[5:]))
    kit = SimpleNamespace(rows=lambda seed, tcfg, T: ((x.int(), y, {"epoch": 0}) for x, y in _stream()))
    given, given_rows = _training_rows(kit, None, None, t, 64, 0, 1, 0)
    assert isinstance(given, RowPool) and given is given_rows
    kit_ref = _take(given_rows, 10)
    assert _ids(kit_ref[:1]) == [[0, 1, 2]] and _ids(kit_ref[1:4]) != [[3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert kit_ref[0][0].dtype == torch.long
    skipped = _training_rows(kit, None, None, t, 64, 0, 1, 0)[0].skip(6)
    assert _ids(_take(skipped, 4)) == _ids(kit_ref[6:10])


def _losses(run_dir):
    return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_a_pooled_run_resumes_to_the_same_losses(pydocs, tmp_path):
    """cpu-micro with a pool of 2 micro-batches from micro-batch 1, stopped at step 2 (inside the first pool) and
    resumed: the losses of the straight run, step for step."""
    sets = ["eval_tokens=1024", "log_every=1", "batch_size=2", "row_pool=2", "row_pool_from=1"]
    kw = dict(steps=4, sets=sets, verbose=False)   # micro-batches 1, 2: pool 0; 3: pool 1
    straight = T.train("cpu-micro", pydocs, tmp_path / "straight", **kw)
    stopped = T.train("cpu-micro", pydocs, tmp_path / "resumed", callback=lambda rec: rec["step"] >= 2, **kw)
    assert stopped["status"] == "interrupted" and stopped["steps"] == 2, stopped
    resumed = T.train("cpu-micro", pydocs, tmp_path / "resumed", resume=True, **kw)
    assert straight["status"] == resumed["status"] == "completed" and resumed["steps"] == 4
    assert _losses(tmp_path / "resumed") == _losses(tmp_path / "straight")
