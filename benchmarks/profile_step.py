#!/usr/bin/env python
"""Where one training step's time goes on this machine: torch.profiler over real `train_step` calls.

    python benchmarks/profile_step.py                          # cpu-tiny, default recipe, 2 threads, 8 profiled steps
    python benchmarks/profile_step.py --threads 1 --set mlp=relu2 --steps 5 --ops 20
    python benchmarks/profile_step.py --set prefetch=0            # packing inside the step, as before the Prefetcher

The step is the trainer's own `train_step` on the trainer's own loader, model and optimizers; the script only
wraps the pieces it calls in `torch.profiler.record_function` ranges — the loader's `next`, the model forward
(`GPT.hidden`), the fused loss (`ops.cross_entropy`, forward and the gradient of its input), autograd's
backward, gradient clipping, each optimizer's `step` (Newton–Schulz separately) and `zero_grad`. "python
overhead" is the step's wall time minus all of those. It prints the breakdown (ms per step and share) and the
operators with the most self time. Numbers are measured on the CPU the script runs on; the machine's load
(`os.getloadavg`) is printed next to them, since other processes change them.
"""
import argparse, contextlib, functools, os, statistics, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("loader", "model forward", "loss (fused fwd+grad)", "backward", "grad clip", "newton-schulz",
         "Muon (rest)", "AdamW", "zero_grad")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="cpu-tiny")
    ap.add_argument("--recipe", default=None)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--data", default=str(ROOT / "data/cache/pydocs"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3, help="unprofiled steps first")
    ap.add_argument("--steps", type=int, default=8, help="profiled steps")
    ap.add_argument("--ops", type=int, default=12, help="operators listed by self time")
    a = ap.parse_args(argv)
    import torch
    from torch.profiler import profile, record_function, ProfilerActivity
    import neuronfrontier.ops as ops, neuronfrontier.engine.optim as optim
    from neuronfrontier.engine.config import resolve
    from neuronfrontier.data.shards import prepare, find_shards, load_tokenizer, PackedLoader
    from neuronfrontier.engine.model import GPT
    from neuronfrontier.run.trainer import train_step
    from neuronfrontier.data.batches import Prefetcher
    from neuronfrontier.engine.precision import choose_precision
    from dataclasses import replace

    torch.set_num_threads(a.threads)
    mcfg, tcfg = resolve(a.config, a.recipe, a.sets)
    precision = choose_precision(tcfg.dtype, torch.device("cpu"))   # as `train.setup` resolves dtype=auto
    tcfg = replace(tcfg, dtype=precision.dtype)
    data = prepare(Path(a.data), log=lambda *x: None)
    train_paths, _ = find_shards(data); enc, _ = load_tokenizer(data / "tokenizer")
    torch.manual_seed(0)
    model = GPT(mcfg); opts = optim.build_optimizers(model, tcfg, print_table=False)
    loader = Prefetcher(PackedLoader(train_paths, enc, tcfg.batch_size, mcfg.seq_len, seed=0), tcfg.prefetch)  # as `train` builds it
    dev = torch.device("cpu")

    def ranged(name, fn):
        @functools.wraps(fn)
        def f(*args, **kw):
            with record_function(name): return fn(*args, **kw)
        return f

    class Batches:  # the trainer's loader, each `next` in its own range (with prefetching: the wait for a packed batch)
        def __iter__(self): return self
        def __next__(self):
            with record_function("loader"): return next(loader)

    model.hidden = ranged("model forward", model.hidden)
    ops.cross_entropy = ranged("loss (fused fwd+grad)", ops.cross_entropy)
    torch.Tensor.backward = ranged("backward", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = ranged("grad clip", torch.nn.utils.clip_grad_norm_)
    optim.zeropower_via_newtonschulz5 = ranged("newton-schulz", optim.zeropower_via_newtonschulz5)
    for o in opts:
        o.step = ranged("Muon (rest)" if isinstance(o, optim.Muon) else "AdamW", o.step)
        o.zero_grad = ranged("zero_grad", o.zero_grad)
    batches = Batches()

    def step(): return train_step(model, opts, batches, tcfg, 1.0, dev)
    for _ in range(a.warmup): step()
    walls = []
    for _ in range(a.steps):  # unprofiled wall time per step
        t0 = time.perf_counter(); step(); walls.append(time.perf_counter() - t0)
    load0 = os.getloadavg()[0]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps): step()
        prof_wall = (time.perf_counter() - t0) / a.steps
    ka = {e.key: e for e in prof.key_averages()}
    ms = {p: ka[p].cpu_time_total / 1e3 / a.steps if p in ka else 0.0 for p in PARTS}
    ms["Muon (rest)"] -= ms["newton-schulz"]  # NS runs inside Muon.step
    ms["python overhead"] = max(0.0, prof_wall * 1e3 - sum(ms.values()))
    tok = tcfg.batch_size * tcfg.grad_accum * mcfg.seq_len
    loader.close()
    print(f"{a.config} {a.recipe or '(default recipe)'} {' '.join(a.sets)}: {tok:,} tokens/step, {a.threads} threads, "
          f"load {load0:.2f} — measured on this machine's CPU")
    print(f"dtype: {precision.dtype} ({precision.why}); Newton–Schulz in {precision.ns_dtype}")
    print(f"step wall time: median {statistics.median(walls)*1e3:.0f} ms unprofiled (min {min(walls)*1e3:.0f}), "
          f"{prof_wall*1e3:.0f} ms profiled; {tok / statistics.median(walls):,.0f} tokens/s")
    print(f"\n| part | ms/step | share |\n|---|---|---|")
    for p, v in ms.items(): print(f"| {p} | {v:.1f} | {v / (prof_wall * 1e3):.1%} |")
    print("\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.ops,
                                           max_name_column_width=60))


if __name__ == "__main__":
    sys.exit(main())
