#!/usr/bin/env python
"""Tokens/s of 1 and 2 processes on this CPU, side by side, and a roofline estimate of a dense-124m step on 8 NeuronCores.

    python benchmarks/data_parallel.py                       # cpu-micro, global batch 4, 20 steps
    python benchmarks/data_parallel.py --config cpu-tiny --global-batch 8 --steps 30

Part 1 runs `neuronfrontier train --nproc N` (torchrun, gloo) for N = 1 and 2 with the same global batch
(`batch_size` = global batch / N per rank) and the same steps, and prints each run's charged tokens/s (over all
ranks) and the ratio. This machine has 2 cores: one process already uses both (2 torch threads), two processes
use one each, so the ratio measures the overhead of the collectives and of the repeated packing, not a speed-up;
the machine's load (`os.getloadavg`) is printed next to the numbers. Labelled "measured on CPU (this machine)".

Part 2 is a roofline estimate, not a measurement: a `dense-124m` step (global batch `--trn-batch` rows of 2048
tokens) split over 8 NeuronCores (LNC=1): the compute at the cores' bf16 peak, plus a lower bound for the gradient
all-reduce — a ring all-reduce makes every core send and receive 2·(N−1)/N of the fp32 gradient bytes, which
pass through that core's share of HBM bandwidth at least once each way. The core-to-core link bandwidth is not in
`neuronfrontier.hw`, so the bound uses HBM only and is optimistic.
"""
import argparse, json, os, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(config, nproc, global_batch, steps, data, out):
    exe = Path(sys.executable).parent / "neuronfrontier"
    cmd = [str(exe), "train", "--config", config, "--steps", str(steps), "--nproc", str(nproc), "--data", str(data),
           "--out", str(out), "--set", f"batch_size={global_batch // nproc}", "--set", "eval_tokens=8192", "--quiet"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((out / "result.json").read_text())


def roofline(batch_rows: int, cores: int = 8):
    from neuronfrontier import hw
    from neuronfrontier.engine.config import resolve
    m, _ = resolve("dense-124m")
    tokens = batch_rows * m.seq_len
    core = hw.get_device("trn2-core")
    compute_s = m.flops_per_token() * tokens / (cores * core.peak("bf16"))
    grad_bytes = 4 * m.n_params()
    allreduce_s = 2 * (cores - 1) / cores * grad_bytes * 2 / (core.hbm_tbps * 1e12)  # sent + received, through one core's HBM share
    return tokens, compute_s, allreduce_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="cpu-micro")
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--data", default=str(ROOT / "data/cache/pydocs"))
    ap.add_argument("--trn-batch", type=int, default=64, help="dense-124m global batch in 2048-token rows for the estimate")
    a = ap.parse_args(argv)
    from neuronfrontier.data.shards import prepare
    data = prepare(Path(a.data), log=lambda *x: None)
    with tempfile.TemporaryDirectory() as tmp:
        res = {n: run(a.config, n, a.global_batch, a.steps, data, Path(tmp) / f"n{n}") for n in (1, 2)}
    load = os.getloadavg()[0]
    print(f"measured on CPU (this machine, load {load:.1f}): {a.config}, global batch {a.global_batch}, {a.steps} steps")
    print(f"{'processes':>10s} {'tok/s':>10s} {'max step s':>11s} {'train s':>8s}")
    for n, r in res.items(): print(f"{n:>10d} {r['tok_s']:>10,.0f} {r['max_step_s']:>11.3f} {r['train_s']:>8.2f}")
    print(f"ratio tok/s 2 processes / 1 process: {res[2]['tok_s'] / res[1]['tok_s']:.2f}")
    tokens, comp, ar = roofline(a.trn_batch)
    print(f"roofline estimate (not measured): dense-124m, {tokens:,} tokens/step on 8 NeuronCores (LNC=1): "
          f"compute {comp * 1e3:.1f} ms + gradient all-reduce >= {ar * 1e3:.1f} ms = {(comp + ar) * 1e3:.1f} ms/step, "
          f"<= {tokens / (comp + ar):,.0f} tok/s")


if __name__ == "__main__":
    main()
