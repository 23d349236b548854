#!/usr/bin/env python
"""Recipe ablation at an equal training budget: baseline vs frontier vs frontier-minus-each-choice.

    python benchmarks/ablation.py                        # cpu-tiny, 300 s per run, 3 seeds, one run at a time (≈ 80 min)
    python benchmarks/ablation.py --jobs 2 --threads 1   # two runs at once, one core each (≈ 40 min on 2 cores)
    python benchmarks/ablation.py --budget 60 --seeds 0 1 2 --out runs/ablation

Every run trains the same preset on the same prepared data for the same charged budget and is scored on the
same validation tokens. Prints a table: mean ± sd val_bpb over seeds, steps, tokens/s and the difference to
baseline. Numbers are measured on whatever machine runs the script (label them so when you quote them).
"""
import argparse, json, os, statistics as st, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
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
    ap.add_argument("--jobs", type=int, default=1, help="runs at the same time (each a separate process)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    a = ap.parse_args(argv)
    from neuronfrontier.data import prepare
    data = prepare(Path(a.data), log=lambda *x: None)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "neuronfrontier"
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)} if a.threads else {}))
    t0 = time.time()

    def run(job):
        name, seed = job
        recipe, extra = VARIANTS[name]
        rd = out / f"{name.replace(' ', '').replace('(', '_').replace(')', '')}-s{seed}"
        cmd = [str(exe), "train", "--config", a.config, "--budget", str(a.budget), "--seed", str(seed), "--data", str(data),
               "--out", str(rd), "--recipe", recipe, "--quiet"] + [x for kv in extra + a.sets for x in ("--set", kv)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if not (rd / "result.json").exists(): raise RuntimeError(f"{name} seed {seed} failed: {p.stderr.strip()[-500:]}")
        r = json.loads((rd / "result.json").read_text())
        print(f"[{time.time() - t0:6.0f}s] {name:26s} seed {seed}: val_bpb {r['val_bpb'] if r['val_bpb'] is None else round(r['val_bpb'], 4)}"
              f" steps {r['steps']} status {r['status']}", flush=True)
        return name, r

    jobs = [(n, s) for s in a.seeds for n in a.variants]  # seed-major: every variant sees the same machine conditions
    results = {n: [] for n in a.variants}
    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        for name, r in ex.map(run, jobs): results[name].append(r)
    (out / "results.json").write_text(json.dumps({k: [{kk: r[kk] for kk in ("seed", "val_bpb", "steps", "tok_s", "status")} for r in v]
                                                  for k, v in results.items()}, indent=1))
    print(table(results, a))


def _ms(xs):
    xs = [x for x in xs if x is not None]
    if not xs: return float("nan"), float("nan")
    return st.mean(xs), (st.stdev(xs) if len(xs) > 1 else 0.0)


def table(results, a):
    base = _ms([r["val_bpb"] for r in results.get("baseline", [])])[0]
    cmd = f"python benchmarks/ablation.py --config {a.config} --budget {a.budget:g} --seeds {' '.join(map(str, a.seeds))}"
    cmd += f" --jobs {a.jobs}" + (f" --threads {a.threads}" if a.threads else "") + "".join(f" --set {x}" for x in a.sets)
    lines = [f"`{cmd}` — measured on this machine's CPU",
             "", "| recipe | val_bpb (mean ± sd) | Δ vs baseline | steps | tok/s | runs |", "|---|---|---|---|---|---|"]
    for name, rs in results.items():
        m, s = _ms([r["val_bpb"] for r in rs])
        steps, tok = _ms([r["steps"] for r in rs])[0], _ms([r["tok_s"] for r in rs])[0]
        bad = sum(r["status"] != "completed" for r in rs)
        lines.append(f"| {name} | {m:.4f} ± {s:.4f} | {m - base:+.4f} | {steps:.0f} | {tok:,.0f} | {len(rs)}{f' ({bad} not completed)' if bad else ''} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
