#!/usr/bin/env python
"""Dense vs MoE at an equal training budget on CPU, each balance method; and a trn2 roofline estimate of the MLPs.

    python benchmarks/moe.py                          # cpu-tiny vs cpu-tiny-moe (aux_loss, bias, none), 300 s, 3 seeds (≈ 60 min)
    python benchmarks/moe.py --budget 60 --seeds 0    # a quick look
    python benchmarks/moe.py --roofline-only          # only the trn2 estimate (seconds; no training)

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
    from neuronfrontier.data import prepare
    data = prepare(Path(a.data), log=lambda *x: None)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "neuronfrontier"
    results, t0 = {n: [] for n in a.variants}, time.time()
    for seed in a.seeds:                       # seed-major: every variant sees the same machine conditions
        for name in a.variants:
            config, extra = VARIANTS[name]
            rd = out / f"{name.split()[0]}-{name.split()[-1].strip('()')}-s{seed}"
            cmd = [str(exe), "train", "--config", config, "--budget", str(a.budget), "--seed", str(seed), "--data", str(data),
                   "--out", str(rd), "--quiet"] + [x for kv in extra + a.sets for x in ("--set", kv)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if not (rd / "result.json").exists(): raise RuntimeError(f"{name} seed {seed} failed: {p.stderr.strip()[-500:]}")
            r = json.loads((rd / "result.json").read_text())
            r["imbalance"], r["dropped"] = moe_log_stats(rd)
            results[name].append(r)
            print(f"[{time.time() - t0:6.0f}s] {name:22s} seed {seed}: val_bpb {r['val_bpb']} steps {r['steps']} "
                  f"tok/s {r['tok_s']:,.0f}", flush=True)
    (out / "results.json").write_text(json.dumps({k: [{kk: r[kk] for kk in ("seed", "val_bpb", "steps", "tok_s", "status",
                                                                           "imbalance", "dropped")} for r in v]
                                                  for k, v in results.items()}, indent=1))
    load = os.getloadavg()[0]
    lines = [f"measured on this machine's CPU (load {load:.1f} at the end), {a.budget:g} s per run, seeds {a.seeds}", "",
             "| model | val_bpb (mean ± sd) | tok/s | steps | load max/mean | dropped |", "|---|---|---|---|---|---|"]
    for name, rs in results.items():
        m, s = _ms([r["val_bpb"] for r in rs])
        imb, drop = _ms([r["imbalance"] for r in rs])[0], _ms([r["dropped"] for r in rs])[0]
        lines.append(f"| {name} | {m:.4f} ± {s:.4f} | {_ms([r['tok_s'] for r in rs])[0]:,.0f} | "
                     f"{_ms([r['steps'] for r in rs])[0]:.0f} | {'–' if imb != imb else f'{imb:.2f}'} | "
                     f"{'–' if drop != drop else f'{drop:.3f}'} |")
    print("\n".join(lines))


def roofline(n_sample_blocks: int = 4) -> dict:
    "Seconds per layer MLP forward + backward on one trn2 NeuronCore, bf16, per rank-step of the presets: a roofline estimate."
    import torch
    from neuronfrontier.config import CONFIGS, TRAIN_DEFAULTS
    from neuronfrontier.hw import TRN2_CORE, PMAX, estimate_time
    from neuronfrontier.sim import dry_run
    from neuronfrontier.kernels.moe import moe_fwd_kernel, moe_bwd_kernel
    from neuronfrontier.kernels.swiglu import swiglu_fwd_kernel, swiglu_bwd_kernel
    from neuronfrontier.moe import expert_capacity
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data", default="data/cache/pydocs")
    ap.add_argument("--out", default="runs/moe")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), help="subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra override for every run")
    ap.add_argument("--roofline-only", action="store_true")
    a = ap.parse_args(argv)
    r = roofline()
    print("roofline estimate, one trn2 NeuronCore, bf16, per rank-step of 32 × 1024 tokens (simulated kernel traces "
          "scaled to the step's blocks; the rest of the model at peak FLOP/s):")
    for name, v in r.items():
        print(f"  {name}: MLP fwd+bwd {v['mlp'] * 1e3:.2f} ms per layer, step {v['step'] * 1e3:.1f} ms"
              + (f" ({v['blocks']} expert blocks per layer, capacity {v['capacity']} rows per expert)" if "blocks" in v else ""))
    if not a.roofline_only: train_all(a)


if __name__ == "__main__":
    sys.exit(main())
