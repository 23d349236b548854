#!/usr/bin/env python
"""Dense vs MoE at an equal training budget on CPU, each balance method; and a trn2 roofline estimate of the MLPs.

    python benchmarks/moe.py                          # cpu-tiny vs cpu-tiny-moe (aux_loss, bias, none), 300 s, 3 seeds, 2 at a time (≈ 35 min on 2 cores)
    python benchmarks/moe.py --budget 60 --seeds 0    # a quick look
    python benchmarks/moe.py --roofline-only          # only the trn2 estimate and grouped_mm vs loop (seconds; no training)

Every run trains on the same prepared data for the same charged budget and is scored on the same validation tokens.
Prints one table: val_bpb mean ± sd over seeds, tokens/s, and for MoE the expert load imbalance (max/mean
assignments per expert, averaged over layers and logged steps) and the dropped share of assignments. Numbers are
measured on whatever machine runs the script: label them so when you quote them (with `uptime`'s load).

The roofline part estimates one layer's MLP, forward + backward, on one trn2 NeuronCore (bf16) for dense-124m
(SwiGLU kernel traces + the down projection at peak) and moe-180m (router at peak + the blockwise expert kernels'
simulated traces), from `dry_run` traces of a few blocks scaled to the step's block count: a roofline estimate,
not a measurement.
"""
import argparse, json, os, statistics as st, subprocess, sys, time
from pathlib import Path

VARIANTS = {"dense (cpu-tiny)": ("cpu-tiny", []),
            "moe aux_loss": ("cpu-tiny-moe", ["balance=aux_loss"]),
            "moe bias (loss-free)": ("cpu-tiny-moe", ["balance=bias"]),
            "moe none": ("cpu-tiny-moe", ["balance=none"])}


def _ms(xs):
    xs = [x for x in xs if x is not None]
    if not xs: return float("nan"), float("nan")
    return st.mean(xs), (st.stdev(xs) if len(xs) > 1 else 0.0)


def moe_log_stats(run_dir: Path) -> tuple[float | None, float | None]:
    "(mean load imbalance, mean dropped share) over the logged steps of a run's metrics.jsonl; None for a dense run."
    recs = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    imb = [r["moe_imbalance"] for r in recs if "moe_imbalance" in r]
    drop = [r["moe_dropped"] for r in recs if "moe_dropped" in r]
    return (st.mean(imb) if imb else None), (st.mean(drop) if drop else None)


def train_all(a):
    from neuronfrontier.data.shards import prepare
    from neuronfrontier.research.sweep import available_cpus, slot_cores
    data = prepare(Path(a.data), log=lambda *x: None)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "neuronfrontier"
    threads = a.threads or max(1, len(available_cpus()) // a.jobs)
    slots, env = slot_cores(a.jobs, threads), dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    print(f"{a.jobs} run(s) at a time × {threads} thread(s){', pinned' if slots[0] else ''}", flush=True)
    # seed-major: every variant of a seed runs under the same machine conditions; a finished run (result.json) is kept
    todo = [(seed, name) for seed in a.seeds for name in a.variants]
    results, t0, running, failed = {n: [] for n in a.variants}, time.time(), {}, []
    rdir = lambda seed, name: out / f"{name.split()[0]}-{name.split()[-1].strip('()')}-s{seed}"
    def collect(seed, name, p=None):
        rd = rdir(seed, name)
        if not (rd / "result.json").exists():
            log = rd.with_suffix(".log")
            failed.append(f"{name} seed {seed}: {(log.read_text() if log.exists() else '').strip()[-300:]}"); return
        r = json.loads((rd / "result.json").read_text())
        r["imbalance"], r["dropped"] = moe_log_stats(rd)
        r["_dir"] = rd.name
        results[name].append(r)
        print(f"[{time.time() - t0:6.0f}s] {name:22s} seed {seed}: val_bpb {r['val_bpb']} steps {r['steps']} "
              f"tok/s {r['tok_s']:,.0f}", flush=True)
    while todo or running:
        free = [j for j in range(a.jobs) if j not in running]
        while todo and free:
            seed, name = todo.pop(0)
            if (rdir(seed, name) / "result.json").exists() and json.loads((rdir(seed, name) / "result.json").read_text()).get("val_bpb") is not None:
                collect(seed, name); continue
            config, extra = VARIANTS[name]
            cmd = [str(exe), "train", "--config", config, "--budget", str(a.budget), "--seed", str(seed), "--data", str(data),
                   "--out", str(rdir(seed, name)), "--quiet"] + [x for kv in extra + a.sets for x in ("--set", kv)]
            j = free.pop(0); cores = slots[j]
            with open(rdir(seed, name).with_suffix(".log"), "w") as log:    # the run's stderr, for a failure's message
                p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env,
                                     preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c)) if cores else None)
            running[j] = (p, seed, name)
        time.sleep(1)
        for j, (p, seed, name) in list(running.items()):
            if p.poll() is not None: del running[j]; collect(seed, name, p)
    if failed: raise RuntimeError("runs failed: " + " | ".join(failed))
    for rs in results.values(): rs.sort(key=lambda r: r["seed"])
    (out / "results.json").write_text(json.dumps({k: [{kk: r[kk] for kk in ("seed", "val_bpb", "steps", "tok_s", "status",
                                                                           "imbalance", "dropped")} for r in v]
                                                  for k, v in results.items()}, indent=1))
    load = os.getloadavg()[0]
    lines = [f"measured on this machine's CPU, {a.budget:g} s per run, seeds {a.seeds} (load now {load:.1f}; runs reused from {a.out} keep their own)", "",
             "| model | val_bpb (mean ± sd) | tok/s | steps | load max/mean | dropped |", "|---|---|---|---|---|---|"]
    for name, rs in results.items():
        m, s = _ms([r["val_bpb"] for r in rs])
        imb, drop = _ms([r["imbalance"] for r in rs])[0], _ms([r["dropped"] for r in rs])[0]
        lines.append(f"| {name} | {m:.4f} ± {s:.4f} | {_ms([r['tok_s'] for r in rs])[0]:,.0f} | "
                     f"{_ms([r['steps'] for r in rs])[0]:.0f} | {'–' if imb != imb else f'{imb:.2f}'} | "
                     f"{'–' if drop != drop else f'{drop:.3f}'} |")
    print("\n".join(lines))
    if a.summary:
        Path(a.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(a.summary).write_text(json.dumps(summary(a, results, lines, load), indent=None, separators=(",", ":")) + "\n")
        print(f"summary for the notebook: {a.summary}")


def _curve(run_dir: Path, points: int = 60) -> dict:
    "A run's logged records, at most `points` of them (evenly spaced, the last kept): what the notebook plots."
    recs = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    n = min(points, len(recs))
    keep = sorted({round(i * (len(recs) - 1) / max(n - 1, 1)) for i in range(n)})
    cols = ("step", "time_s", "loss", "lr_mult", "tok_s", "moe_imbalance", "moe_dropped", "moe_aux", "moe_z")
    out = {c: [recs[i].get(c) for i in keep] for c in cols if any(c in recs[i] for i in keep)}
    if "moe_load" in recs[0]:
        load = [recs[i]["moe_load"] for i in keep]
        out["layer_imbalance"] = [[round(max(l) / (sum(l) / len(l)), 4) for l in rec] for rec in load]   # [point][layer]
        out["load_first"], out["load_last"] = recs[0]["moe_load"], recs[-1]["moe_load"]                  # [layer][expert]
    return out


def summary(a, results: dict, table: list, load: float) -> dict:
    "What the notebook shows: the table, every run's result, its curves (subsampled); measured on this machine's CPU."
    import platform
    return dict(label=f"measured on CPU ({platform.machine()}, {os.cpu_count()} cores), {a.budget:g} s of training per run, "
                      f"{a.jobs} run(s) at a time, each pinned to its own core(s)",
                command="python benchmarks/moe.py" + ("" if a.budget == 300 else f" --budget {a.budget:g}"), budget_s=a.budget, seeds=a.seeds,
                table=table, variants={name: VARIANTS[name][0] + " " + " ".join(VARIANTS[name][1]) for name in results},
                runs={name: [dict({k: r[k] for k in ("seed", "val_bpb", "steps", "tok_s", "tokens", "train_s", "imbalance", "dropped")},
                                  curve=_curve(Path(a.out) / r["_dir"])) for r in rs] for name, rs in results.items()})


def roofline(n_sample_blocks: int = 4) -> dict:
    "Seconds per layer MLP forward + backward on one trn2 NeuronCore, bf16, per rank-step of the presets: a roofline estimate."
    import torch
    from neuronfrontier.engine.config import CONFIGS, TRAIN_DEFAULTS
    from neuronfrontier.hw import TRN2_CORE, PMAX, estimate_time
    from neuronfrontier.sim import dry_run
    from neuronfrontier.kernels.moe import moe_fwd_kernel, moe_bwd_kernel
    from neuronfrontier.kernels.swiglu import swiglu_fwd_kernel, swiglu_bwd_kernel
    from neuronfrontier.engine.moe import expert_capacity
    peak = TRN2_CORE.peak("bf16") * 1e12
    bf = torch.bfloat16
    out = {}
    dcfg, mcfg = CONFIGS["dense-124m"], CONFIGS["moe-180m"]
    N = TRAIN_DEFAULTS["dense-124m"].batch_size * dcfg.seq_len           # tokens per rank-step
    d, Fd = dcfg.d_model, dcfg.d_mlp
    n = n_sample_blocks * PMAX                                            # sample, scaled by N / n
    x, wg, wu = torch.zeros(n, d, dtype=bf), torch.zeros(Fd, d, dtype=bf), torch.zeros(Fd, d, dtype=bf)
    t_sw = estimate_time(dry_run(swiglu_fwd_kernel[1])(x, wg, wu), TRN2_CORE) + \
        estimate_time(dry_run(swiglu_bwd_kernel[1])(x, wg, wu, torch.zeros(n, Fd, dtype=bf)), TRN2_CORE)
    out["dense-124m"] = dict(mlp=t_sw * N / n + 3 * 2 * N * Fd * d / peak)   # + W_down fwd+bwd at peak
    E, k, Fe = mcfg.n_experts, mcfg.top_k, mcfg.d_expert
    C = expert_capacity(N, mcfg)
    nb = E * C // PMAX                                                    # blocks per layer and step
    be = torch.arange(n_sample_blocks, dtype=torch.int32) % E
    xs = torch.zeros(n, d, dtype=bf)
    w3 = (torch.zeros(E, d, Fe, dtype=bf), torch.zeros(E, d, Fe, dtype=bf), torch.zeros(E, Fe, d, dtype=bf))
    t_moe = estimate_time(dry_run(moe_fwd_kernel[1])(xs, *w3, be), TRN2_CORE) + \
        estimate_time(dry_run(moe_bwd_kernel[1])(xs, *w3, be, torch.zeros(n, d, dtype=bf)), TRN2_CORE)
    router = 3 * 2 * N * d * E / peak
    out["moe-180m"] = dict(mlp=t_moe * nb / n_sample_blocks + router, blocks=nb, capacity=C)
    for name, cfg in (("dense-124m", dcfg), ("moe-180m", mcfg)):
        rest = (cfg.flops_per_token() - 6 * sum(cfg._mlp_params(i, True) for i in range(cfg.n_layers))) * N / peak
        out[name]["step"] = cfg.n_layers * out[name]["mlp"] + rest
    return out


def grouped_vs_loop(repeats: int = 5) -> list[str]:
    """The torch backend of ops.moe_mlp two ways on this CPU — one torch._grouped_mm per projection for all experts, or
    a loop over the experts — forward + backward at cpu-tiny-moe's shapes (one rank-step's blocks); median of `repeats`."""
    import torch
    from neuronfrontier.engine.config import CONFIGS, TRAIN_DEFAULTS
    from neuronfrontier.engine.moe import BLOCK, expert_capacity, expert_mlp, grouped_mm_works
    cfg = CONFIGS["cpu-tiny-moe"]
    N = TRAIN_DEFAULTS["cpu-tiny-moe"].batch_size * cfg.seq_len
    E, d, F_ = cfg.n_experts, cfg.d_model, cfg.d_expert
    C = expert_capacity(N, cfg)
    be = torch.arange(E).repeat_interleave(C // BLOCK)                  # every expert's blocks, full capacity
    lines = [f"ops.moe_mlp torch backend, cpu-tiny-moe shapes: {len(be)} blocks of {BLOCK} rows, E={E}, d={d}, d_expert={F_}, "
             f"forward + backward, median of {repeats} (measured on this CPU, {torch.get_num_threads()} threads)"]
    for dt in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(len(be) * BLOCK, d, generator=g).to(dt).requires_grad_()
        ws = [(torch.randn(E, a, b, generator=g) / a ** 0.5).to(dt).requires_grad_() for a, b in ((d, F_), (d, F_), (F_, d))]
        ms = {}
        for impl in ("grouped", "loop"):
            if impl == "grouped" and not grouped_mm_works("cpu", dt): ms[impl] = None; continue
            ts = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter(); y = expert_mlp(x, *ws, be, impl=impl); y.backward(torch.ones_like(y)); ts.append(time.perf_counter() - t0)
            ms[impl] = sorted(ts[1:])[len(ts[1:]) // 2] * 1e3
        ratio = f"{ms['loop'] / ms['grouped']:.2f}x" if ms["grouped"] else "–"
        lines.append(f"  {str(dt)[6:]:8s} grouped_mm {ms['grouped'] or float('nan'):8.1f} ms   loop {ms['loop']:8.1f} ms   loop/grouped {ratio}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data", default="data/cache/pydocs")
    ap.add_argument("--out", default="runs/moe")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), help="subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra override for every run")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, each pinned to its own cores (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="threads per run (default: CPUs / jobs)")
    ap.add_argument("--summary", default="nbs/results/moe_benchmark.json", help="JSON for notebook 08_moe ('' for none)")
    ap.add_argument("--roofline-only", action="store_true")
    a = ap.parse_args(argv)
    r = roofline()
    print("roofline estimate, one trn2 NeuronCore, bf16, per rank-step of 32 × 1024 tokens (simulated kernel traces "
          "scaled to the step's blocks; the rest of the model at peak FLOP/s):")
    for name, v in r.items():
        print(f"  {name}: MLP fwd+bwd {v['mlp'] * 1e3:.2f} ms per layer, step {v['step'] * 1e3:.1f} ms"
              + (f" ({v['blocks']} expert blocks per layer, capacity {v['capacity']} rows per expert)" if "blocks" in v else ""))
    print("\n".join(grouped_vs_loop()))
    if not a.roofline_only: train_all(a)


if __name__ == "__main__":
    sys.exit(main())
