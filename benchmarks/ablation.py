#!/usr/bin/env python
"""Recipe ablation at an equal training budget: named variants (sets of overrides) run as one `neuronfrontier sweep`.

    python benchmarks/ablation.py                                   # cpu-tiny, 300 s per run, 3 seeds, recipe variants
    python benchmarks/ablation.py --jobs 2 --threads 1              # two runs at once, one pinned core each
    python benchmarks/ablation.py --variants frontier "frontier + relu2" "frontier + normuon" --reference frontier

Every run trains the same preset on the same prepared data for the same charged budget and is scored on the
same validation tokens; the sweep machinery (`neuronfrontier.sweep`) runs them, resumes an interrupted ablation
(run the same command again) and writes results.jsonl, table.csv/table.md and the plots into --out. Printed:
val_bpb mean ± sd over seeds, Δ to the reference variant, tokens/s, steps. Numbers are measured on whatever
machine runs the script (label them so when you quote them).
"""
import argparse, shlex, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONTIER = ["recipe=frontier"]
VARIANTS = {
    "baseline": ["recipe=baseline"],
    "frontier": FRONTIER,
    "frontier - muon (adamw)": FRONTIER + ["optim=adamw"],
    "frontier - qk_norm": FRONTIER + ["qk_norm=false"],
    "frontier - wsd (cosine)": FRONTIER + ["schedule=cosine"],
    # the kit baseline's tricks, one at a time on top of frontier
    "frontier + relu2": FRONTIER + ["mlp=relu2"],
    "frontier + value_embeds": FRONTIER + ["value_embeds=true"],
    "frontier + layer_scalars": FRONTIER + ["layer_scalars=true"],
    "frontier + normuon": FRONTIER + ["normuon=true"],
    "frontier + polar_express": FRONTIER + ["ns_coeffs=polar_express"],
    "frontier + cautious_wd": FRONTIER + ["weight_decay=0.2", "cautious_wd=true"],
    "frontier + lr_width_scale": FRONTIER + ["lr_width_scale=true"],
    # the kit's recipe (the default of cpu-tiny and dense-124m, `config.DEFAULT_RECIPE`) and changes to it
    "default": [],
    "kit": ["recipe=kit"],
    "kit + heads of 64": ["recipe=kit", "n_heads=4", "d_head=64"],
    "kit + momentum ramp 100": ["recipe=kit", "muon_momentum_steps=100"],   # the kit ramps over 300 of ~340 steps
    "kit + batch 4": ["recipe=kit", "batch_size=4"],                         # twice the steps at half the batch
}
RECIPE_VARIANTS = ["baseline", "frontier", "frontier - muon (adamw)", "frontier - qk_norm", "frontier - wsd (cosine)"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="cpu-tiny")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--steps", type=int, default=None, help="exactly N steps per run instead of the budget")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data", default=str(ROOT / "data/cache/pydocs"))
    ap.add_argument("--out", default="runs/ablation")
    ap.add_argument("--variants", nargs="+", default=RECIPE_VARIANTS, help="subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--reference", default=None, help="variant the Δ column is measured against (default: the first)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra override applied to every run")
    ap.add_argument("--jobs", type=int, default=1, help="runs at the same time (each a separate process)")
    ap.add_argument("--threads", type=int, default=None, help="threads per run (default: CPUs / jobs)")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args(argv)
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown: ap.error(f"unknown variant(s) {', '.join(map(repr, unknown))}; choose from: {', '.join(VARIANTS)}")
    from neuronfrontier.data import prepare
    from neuronfrontier.sweep import run_sweep
    data = prepare(Path(a.data), log=lambda *x: None)
    settings = {v: VARIANTS[v] for v in a.variants}
    print(f"`python benchmarks/ablation.py {shlex.join(argv if argv is not None else sys.argv[1:])}` — measured on this machine's CPU", flush=True)
    _, failures = run_sweep(a.config, settings, a.seeds, a.out, data, None if a.steps else a.budget, a.steps, None, a.sets,
                            a.jobs, a.threads, a.device, a.reference or a.variants[0], log=lambda m: print(m, flush=True))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
