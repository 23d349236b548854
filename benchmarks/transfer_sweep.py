#!/usr/bin/env python
"""Learning-rate transfer across widths: where the embedding, head and matrix rates are best at each width.

    python benchmarks/transfer_sweep.py                       # widths 128 256 384, 100 steps, seeds 0 1, 2 jobs × 1 core
    python benchmarks/transfer_sweep.py --widths 128 256 --steps 60 --out runs/transfer-quick

At each width (`cpu-tiny`'s depth, sequence length and tokenizer; `--recipe kit`, so heads of 128 and an MLP of
4·d follow the width) the kit's rates are the centre: embedding 0.6·s, head 0.004·s, scalars 0.5·s with
s = (d/768)^-½, and Muon 0.04. Each of the three swept rates is then multiplied by each of `--factors` alone (one
at a time, the others at the centre), so a width costs 1 + 3·len(factors) settings × seeds runs. Every run trains
the same fixed number of steps on the same batches (`--steps`: a step count, not a time budget, so runs that
share the machine compare), with `lr_width_scale` off and the rates written out, and is scored on the same
validation tokens. One `neuronfrontier sweep` per width under --out (resumable: run the same command again).

Writes `transfer.json` (one row per run: width, rate group, factor, rate, seed, val_bpb, steps, tok/s) into --out
and, with --results, a copy for the notebook (`nbs/results/transfer_sweep.json`, read by `60_recipe`).
Numbers are measured on whatever machine runs it: label them so when you quote them.
"""
import argparse, json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT_RATES = {"embed_lr": 0.6, "head_lr": 0.004, "scalar_lr": 0.5, "muon_lr": 0.04}  # the kit's, tuned at d = 768
SWEPT = ("embed_lr", "head_lr", "muon_lr")
WIDTH_SCALED = ("embed_lr", "head_lr", "scalar_lr")  # the AdamW groups the kit multiplies by (d/768)^-½


def centre(width: int) -> dict[str, float]:
    "The kit's rates at `width`: its AdamW rates × (d/768)^-½, Muon's unscaled."
    s = (width / 768) ** -0.5
    return {k: v * s if k in WIDTH_SCALED else v for k, v in KIT_RATES.items()}


def width_settings(width: int, factors) -> dict[str, list[str]]:
    "Setting name → overrides: the centre, then each swept rate × each factor alone."
    c = centre(width)
    base = [f"d_model={width}", "lr_width_scale=false", f"scalar_lr={c['scalar_lr']:.6g}"]
    out = {"centre": base + [f"{k}={c[k]:.6g}" for k in SWEPT]}
    for k in SWEPT:
        for f in factors:
            out[f"{k}x{f:g}"] = base + [f"{j}={c[j] * (f if j == k else 1):.6g}" for j in SWEPT]
    return out


def rows_for(width: int, factors, runs: list[dict]) -> list[dict]:
    "Flatten the sweep's rows into (width, group, factor, rate, seed, val_bpb, ...)."
    c, out = centre(width), []
    for r in runs:
        name = r["setting"]
        group, factor = ("centre", 1.0) if name == "centre" else (name.split("x")[0], float(name.split("x")[1]))
        rates = {k: c[k] * (factor if k == group else 1) for k in SWEPT}
        out.append(dict(width=width, group=group, factor=factor, **rates, seed=r["seed"], val_bpb=r["val_bpb"],
                        steps=r["steps"], tokens=r["tokens"], tok_s=round(r["tok_s"], 1)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="cpu-tiny")
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256, 384])
    ap.add_argument("--factors", type=float, nargs="+", default=[0.25, 4.0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="extra overrides for every run (default: batch_size=4 muon_momentum_steps=30 eval_tokens=65536)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default=str(ROOT / "data" / "cache" / "pydocs"))
    ap.add_argument("--out", default="runs/transfer")
    ap.add_argument("--results", action="store_true", help="also write nbs/results/transfer_sweep.json")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from neuronfrontier.data.shards import prepare
    from neuronfrontier.research.sweep import run_sweep

    if not (Path(a.data) / "tokenizer").exists(): prepare(Path(a.data), source="embedded")
    sets = a.sets or ["batch_size=4", "muon_momentum_steps=30", "eval_tokens=65536"]
    rows, failures = [], []
    for w in a.widths:
        settings = width_settings(w, a.factors)
        runs, failed = run_sweep(a.config, settings, seeds=a.seeds, out=Path(a.out) / f"d{w}", data_dir=a.data,
                                 steps=a.steps, recipe="kit", sets=sets, jobs=a.jobs, threads=a.threads, device="cpu",
                                 reference="centre", plots=False)
        rows += rows_for(w, a.factors, runs)
        failures += failed
    meta = dict(config=a.config, recipe="kit", steps=a.steps, sets=sets, factors=a.factors, seeds=a.seeds,
                widths=a.widths, kit_rates=KIT_RATES, threads=a.threads, jobs=a.jobs)
    doc = json.dumps(dict(meta=meta, rows=rows), indent=1)
    (Path(a.out) / "transfer.json").write_text(doc)
    if a.results: (ROOT / "nbs" / "results" / "transfer_sweep.json").write_text(doc)
    print(f"{len(rows)} runs in {a.out}/transfer.json" + (f"; {len(failures)} failed: {failures}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
