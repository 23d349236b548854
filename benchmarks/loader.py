#!/usr/bin/env python
"""Host work of the data path at dense-124m's shapes for 8 ranks: every rank packing the global batch (the previous
design, `data_sharding=global`) against every rank packing its own rows (`data_sharding=rank`), side by side.

    python benchmarks/loader.py                    # embedded corpus (prepared if missing), 4 global batches
    python benchmarks/loader.py --data DIR --batches 8

Measured on CPU (this machine), in CPU-seconds (`time.process_time`: every thread of this process, the tokenizer's
included), one rank at a time in this one process — the 8 ranks of a chip would do the same work in 8 processes:

* per global batch (8 ranks × 16 rows × 2,049 tokens), the host work of all 8 ranks together, each design;
* the loader's tokens/s on one core (one rank's rows per CPU-second, the new design) against the tokens/s one rank
  must be fed — `cost.step_estimate(dense-124m, 16 rows, 8 cores)`, a roofline estimate, not a measurement.

The first batch of each loader (opening the parquet file, filling the packing buffer) is not counted.
"""
import argparse, time
from pathlib import Path

from neuronfrontier.engine.config import resolve
from neuronfrontier.data.shards import PackedLoader, find_shards, load_tokenizer, prepare
from neuronfrontier.research.cost import step_estimate

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds(loader, n: int) -> float:
    "CPU-seconds `loader` takes for `n` batches after its first."
    next(loader)
    t0 = time.process_time()
    for _ in range(n): next(loader)
    return time.process_time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "data" / "cache" / "pydocs"))
    ap.add_argument("--batches", type=int, default=4, help="global batches timed per design")
    ap.add_argument("--ranks", type=int, default=8)
    a = ap.parse_args()
    data = Path(a.data)
    if not (data / "tokenizer").exists(): data = prepare(data, log=lambda *x: None)
    paths, _ = find_shards(data)
    enc, _ = load_tokenizer(data / "tokenizer")
    mcfg, tcfg = resolve("dense-124m")
    B, T, R = tcfg.batch_size, mcfg.seq_len, a.ranks
    # previous design: each rank packs the whole global batch (R·B rows) and keeps B; every rank does the same work
    one_rank_old = cpu_seconds(PackedLoader(paths, enc, B * R, T, seed=0), a.batches) / a.batches
    old = R * one_rank_old
    # this design: rank r packs its own B rows from every R-th document
    per_rank = [cpu_seconds(PackedLoader(paths, enc, B, T, rank=r, world_size=R, seed=0), a.batches) / a.batches
                for r in range(R)]
    new = sum(per_rank)
    est = step_estimate(mcfg, B, world=R)
    need = B * T / est["step_s"]          # tokens/s one rank consumes at the estimated step time
    have = B * T / max(per_rank)          # tokens/s one core packs for its rank (the slowest rank)
    print(f"dense-124m, {R} ranks × {B} rows × {T + 1} tokens; {a.batches} global batches per design (measured on CPU, this machine)")
    print(f"{'design':<34}{'CPU s per global batch':>24}{'per rank':>12}")
    print(f"{'every rank packs the global batch':<34}{old:>24.3f}{one_rank_old:>12.3f}")
    print(f"{'every rank packs its own rows':<34}{new:>24.3f}{max(per_rank):>12.3f}")
    print(f"host work, new / old: {new / old:.3f} (1/{R} = {1 / R:.3f})")
    print(f"one core packs {have:,.0f} tokens/s for its rank; a rank needs {need:,.0f} tokens/s at the roofline estimate of "
          f"a step ({est['step_s'] * 1e3:.1f} ms, not measured): {have / need:.1f}× what is needed")


if __name__ == "__main__":
    main()
