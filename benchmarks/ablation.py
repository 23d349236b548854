#!/usr/bin/env python
"""Recipe ablation at an equal training budget: baseline vs frontier vs frontier-minus-each-choice.

    python benchmarks/ablation.py                       # cpu-tiny, 300 s per run, 3 seeds (≈ 80 min on 2 cores)
    python benchmarks/ablation.py --budget 60 --seeds 0 1 2 --out runs/ablation

Every run trains the same preset on the same prepared data for the same charged budget and is scored on the
same validation tokens. Prints a table: mean ± sd val_bpb over seeds, steps, tokens/s and the difference to
baseline. Numbers are measured on whatever machine runs the script (label them so when you quote them).
"""
import argparse, json, statistics as st, sys, time
from pathlib import Path

VARIANTS = {
    "baseline": ("baseline", []),
    "frontier": ("frontier", []),
    "frontier - muon (adamw)": ("frontier", ["optim=adamw"]),
    "frontier - qk_norm": ("frontier", ["qk_norm=false"]),
    "frontier - wsd (cosine)": ("frontier", ["schedule=cosine"]),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="cpu-tiny")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data", default="data/cache/pydocs")
    ap.add_argument("--out", default="runs/ablation")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), help="subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra override applied to every run")
    a = ap.parse_args(argv)
    from neuronfrontier.data import prepare
    from neuronfrontier.train import train
    data = prepare(Path(a.data), log=lambda *x: None)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    results = {}
    t0 = time.time()
    for name in a.variants:
        recipe, extra = VARIANTS[name]
        for seed in a.seeds:
            slug = name.replace(" ", "").replace("(", "_").replace(")", "")
            r = train(a.config, data, out / f"{slug}-s{seed}", budget_s=a.budget, seed=seed, recipe=recipe,
                      sets=extra + a.sets, verbose=False)
            results.setdefault(name, []).append(r)
            print(f"[{time.time() - t0:6.0f}s] {name:26s} seed {seed}: val_bpb {r['val_bpb'] if r['val_bpb'] is None else round(r['val_bpb'], 4)}"
                  f" steps {r['steps']} status {r['status']}", flush=True)
    (out / "results.json").write_text(json.dumps({k: [{kk: r[kk] for kk in ("seed", "val_bpb", "steps", "tok_s", "status")} for r in v]
                                                  for k, v in results.items()}, indent=1))
    print(table(results, a))


def _ms(xs):
    xs = [x for x in xs if x is not None]
    if not xs: return float("nan"), float("nan")
    return st.mean(xs), (st.stdev(xs) if len(xs) > 1 else 0.0)


def table(results, a):
    base = _ms([r["val_bpb"] for r in results.get("baseline", [])])[0]
    lines = [f"`python benchmarks/ablation.py --config {a.config} --budget {a.budget:g} --seeds {' '.join(map(str, a.seeds))}`"
             f" — measured on this machine's CPU",
             "", "| recipe | val_bpb (mean ± sd) | Δ vs baseline | steps | tok/s | runs |", "|---|---|---|---|---|---|"]
    for name, rs in results.items():
        m, s = _ms([r["val_bpb"] for r in rs])
        steps, tok = _ms([r["steps"] for r in rs])[0], _ms([r["tok_s"] for r in rs])[0]
        bad = sum(r["status"] != "completed" for r in rs)
        lines.append(f"| {name} | {m:.4f} ± {s:.4f} | {m - base:+.4f} | {steps:.0f} | {tok:,.0f} | {len(rs)}{f' ({bad} not completed)' if bad else ''} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
