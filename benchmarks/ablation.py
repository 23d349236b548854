#!/usr/bin/env python
"""Recipe ablation at an equal training budget: named variants (sets of overrides) run as one `neuronfrontier sweep`.

    python benchmarks/ablation.py                                   # cpu-tiny, 300 s per run, 3 seeds, recipe variants
    python benchmarks/ablation.py --jobs 2 --threads 1              # two runs at once, one pinned core each
    python benchmarks/ablation.py --variants frontier "frontier + relu2" "frontier + normuon" --reference frontier

Every run trains the same preset on the same prepared data for the same charged budget and is scored on the
same validation tokens; the sweep machinery (`neuronfrontier.research.sweep`) runs them, resumes an interrupted ablation
(run the same command again) and writes results.jsonl, table.csv/table.md and the plots into --out. Printed:
val_bpb mean ± sd over seeds, Δ to the reference variant, tokens/s, steps. Numbers are measured on whatever
machine runs the script (label them so when you quote them).

With --json PATH it also writes the results file the notebooks and the dashboard's judge tour read
(nbs/results/*.json): {"meta": {command, config, budget_s or steps, seeds, variants, reference, sets, threads, jobs,
device, machine, label, date, commit}, "rows": [one per run: setting, overrides, seed, val_bpb, steps, tokens, tok_s,
train_s, status], "summary": [one per variant: sweep.summarize's row]}. --machine says what the runs were measured on
(default: this machine's CPU model and CPU count); the label reads "measured on CPU (<machine>)" for CPU runs.

    python benchmarks/ablation.py --steps 460 --variants kit "kit + momentum ramp 100" --reference kit \\
        --json nbs/results/speedrun_ramp_fixed_steps.json --machine "this project's 2-core CPU, shared with other work"
"""
import argparse, json, math, os, platform, shlex, subprocess, sys, time
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
    "kit + cooldown 0.7": ["recipe=kit", "cooldown_frac=0.7"],               # the warm-down over 70% of the run
    "kit + full attention": ["recipe=kit", "window_pattern=L"],              # no sliding windows (no saving on a CPU)
    "kit + cooldown 0.3": ["recipe=kit", "cooldown_frac=0.3"],               # the warm-down over the last 30%
    "kit + muon lr 0.06": ["recipe=kit", "muon_lr=0.06"],                    # Muon's rate × 1.5
    # FrontierForge's K82s4 as the trn2 recipe (the default of trn2-124m), at the preset's width and depth
    "trn2": ["recipe=trn2"],
}
RECIPE_VARIANTS = ["baseline", "frontier", "frontier - muon (adamw)", "frontier - qk_norm", "frontier - wsd (cosine)"]


def describe_machine() -> str:
    "This machine's CPU model and the CPUs this process may use, e.g. 'AMD EPYC 7B13, 2 CPUs'."
    try:
        with open("/proc/cpuinfo") as f:
            model = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration): model = platform.processor() or platform.machine()
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {n} CPUs"


def _git_commit() -> str | None:
    try: out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError): return None
    return out.stdout.strip() or None


def _finite(v): return None if isinstance(v, float) and not math.isfinite(v) else v


def results_json(rows: list[dict], settings: dict, reference: str, meta: dict) -> dict:
    """The results file of an ablation: `meta`, one row per finished run (the sweep's rows without their run
    directory) and one summary row per variant (val_bpb mean and sd, Δ to `reference`, tok/s, steps); NaN as null."""
    from neuronfrontier.research.sweep import summarize
    runs = [{k: _finite(v) for k, v in r.items() if k != "run_dir"} for r in rows]
    summary = [{k: _finite(v) for k, v in s.items()} for s in summarize(rows, list(settings), reference)]
    return {"meta": meta, "rows": runs, "summary": summary}


def run_devices(rows: list[dict]) -> list[str]:
    "The devices the runs trained on, as their result.json records them."
    devs = set()
    for r in rows:
        try: devs.add(json.loads((Path(r["run_dir"]) / "result.json").read_text()).get("device") or "?")
        except (OSError, ValueError, KeyError): devs.add("?")
    return sorted(devs)


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
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write the results file (meta, rows, summary) the notebooks and the dashboard read")
    ap.add_argument("--machine", default=None, help="what the runs are measured on, for --json (default: this CPU)")
    a = ap.parse_args(argv)
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown: ap.error(f"unknown variant(s) {', '.join(map(repr, unknown))}; choose from: {', '.join(VARIANTS)}")
    from neuronfrontier.data.shards import prepare
    from neuronfrontier.research.sweep import run_sweep
    data = prepare(Path(a.data), log=lambda *x: None)
    settings = {v: VARIANTS[v] for v in a.variants}
    command = f"python benchmarks/ablation.py {shlex.join(argv if argv is not None else sys.argv[1:])}"
    print(f"`{command}` — measured on this machine's CPU", flush=True)
    reference = a.reference or a.variants[0]
    rows, failures = run_sweep(a.config, settings, a.seeds, a.out, data, None if a.steps else a.budget, a.steps, None,
                               a.sets, a.jobs, a.threads, a.device, reference, log=lambda m: print(m, flush=True))
    if a.json:
        from neuronfrontier.research.sweep import available_cpus
        devices, machine = run_devices(rows), a.machine or describe_machine()
        on = "CPU" if devices == ["cpu"] else ", ".join(devices)
        meta = dict(command=command, config=a.config, **({"steps": a.steps} if a.steps else {"budget_s": a.budget}),
                    seeds=a.seeds, variants=a.variants, reference=reference, sets=a.sets,
                    threads=a.threads or max(1, len(available_cpus()) // a.jobs), jobs=a.jobs,
                    device=", ".join(devices),
                    machine=machine, label=f"measured on {on} ({machine})", date=time.strftime("%Y-%m-%d"),
                    commit=_git_commit())
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        doc = results_json(rows, settings, reference, meta)
        Path(a.json).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        print(f"results file: {a.json}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
