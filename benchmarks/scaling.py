#!/usr/bin/env python
"""The scaling grid behind `neuronfrontier plan`: small CPU runs at several widths and step counts, one held-out run.

    nice -n 5 python benchmarks/scaling.py grid       # widths 128 256 384 x 40 80 160 steps, seed 0, one thread
    python benchmarks/scaling.py predict              # fit the grid, record the held-out run's predicted val_bpb
    nice -n 5 python benchmarks/scaling.py holdout    # train the held-out run (512 wide, 120 steps), record it

Every run is `cpu-tiny` with its default recipe (the kit's: heads of 128 and an MLP of 4·d follow the width, 4
layers, 512-token rows, 8 rows a step = 4,096 tokens), `--steps N` (each step count is a run of its own, with its
own warm-down), seed 0, the embedded corpus (`data/cache/pydocs`, prepared when missing), scored on the same
32,768 validation tokens (`eval_tokens=32768`: the default 131,072 would cost a minute of evaluation per run on one
core). One `neuronfrontier sweep` per step count under `--out` (`neuronfrontier.research.sweep.run_sweep`), one run at a
time on one thread: run the same command again to resume.

The results file (`--results`, default `nbs/results/scaling_fit.json`, read by notebook `93_plan`) holds `meta`
(command, date, machine label, commit, what N means), `rows` (one per grid run: width, steps, N, D, C, val_bpb,
tok/s) and `holdout`: `predict` writes the prediction (the fit's val_bpb and its error bar, with the fit it came
from) before `holdout` trains the run and adds the measurement; `holdout` refuses to run without a prediction.
Numbers are measured on whatever machine runs the script: label them so when you quote them.
"""
import argparse, json, os, shlex, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ablation   # noqa: E402  (the machine and commit description the results files share)

ROOT = Path(__file__).resolve().parents[1]
WIDTHS, STEPS = (128, 256, 384), (40, 80, 160)
HOLDOUT = {"width": 512, "steps": 120}   # wider than every grid run (N outside the grid), D inside the grid
SETS = ["eval_tokens=32768"]
CONFIG = "cpu-tiny"


def describe_machine() -> str:
    "This machine's CPU model and the CPUs this process may use, as the grid's runs use them."
    return f"{ablation.describe_machine()}, shared with other work; one thread per run"


def git_commit() -> str | None: return ablation._git_commit()


def run_row(width: int, steps: int, run: dict) -> dict:
    "One results row: the shape's parameter counts and FLOPs (the engine's own counts) and the run's measurement."
    from neuronfrontier.engine.config import resolve
    m, t = resolve(CONFIG, None, [f"d_model={width}"])
    tokens = run["tokens"]
    fpt = m.flops_per_token()
    return dict(width=width, n_layers=m.n_layers, n_heads=m.n_heads, d_head=m.d_head, d_mlp=m.d_mlp,
                seq_len=m.seq_len, steps=run["steps"], N=m.n_params(embedding=False),
                N_total=m.n_params(), D=tokens, flops_per_token=fpt, C=fpt * tokens,
                val_bpb=run["val_bpb"], tok_s=round(run["tok_s"], 1), train_s=round(run["train_s"], 1),
                status=run["status"])


def sweep(widths, steps: int, out: Path, data) -> list[dict]:
    "One `run_sweep` over `widths` at `steps` (resumable); its finished runs as results rows."
    from neuronfrontier.research.sweep import run_sweep
    settings = {f"d{w}": [f"d_model={w}"] for w in widths}
    runs, failures = run_sweep(CONFIG, settings, [0], out / f"steps{steps}", data, None, steps, None, SETS, 1, 1,
                               "cpu", None, plots=False, log=lambda m: print(m, flush=True))
    if failures: print("failed:", *failures, sep="\n  ", flush=True)
    return [run_row(int(r["setting"][1:]), steps, r) for r in runs if r["val_bpb"] is not None]


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def save(path: Path, doc: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"results file: {path}", flush=True)


def meta(command: str) -> dict:
    machine = describe_machine()
    return dict(command=command, config=CONFIG, recipe="kit (cpu-tiny's default)", sets=SETS, seed=0, threads=1,
                widths=list(WIDTHS), steps=list(STEPS), tokens_per_step=4096, device="cpu", machine=machine,
                label=f"measured on CPU ({machine})", date=time.strftime("%Y-%m-%d"), commit=git_commit(),
                N="non-embedding parameters as the engine counts them, ModelConfig.n_params(embedding=False): every "
                  "matrix of the blocks and the head (8,192 x d), norms and scalars; not the token or value-embedding "
                  "tables",
                D="training tokens (steps x 4,096)",
                C="training FLOPs: the engine's flops_per_token (6 x matmul parameters + causal attention) x D")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("phase", choices=("grid", "predict", "holdout"), nargs="?", default="grid")
    ap.add_argument("--data", default=str(ROOT / "data" / "cache" / "pydocs"))
    ap.add_argument("--out", default=str(ROOT / "runs" / "scaling"))
    ap.add_argument("--results", default=str(ROOT / "nbs" / "results" / "scaling_fit.json"))
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    command = f"python benchmarks/scaling.py {shlex.join(argv if argv is not None else sys.argv[1:])}".strip()
    path, out = Path(a.results), Path(a.out)
    doc = load(path)
    if a.phase == "grid":
        from neuronfrontier.data.shards import prepare
        data = prepare(Path(a.data), log=lambda *x: None)
        rows = [row for s in STEPS for row in sweep(WIDTHS, s, out, data)]
        doc.update(meta=meta(command), rows=sorted(rows, key=lambda r: (r["width"], r["steps"])))
        save(path, doc)
        for r in doc["rows"]:
            print(f"d={r['width']:4d} steps={r['steps']:4d} N={r['N']:>10,} D={r['D']:>9,} val_bpb={r['val_bpb']:.4f}")
        return 0
    if not doc.get("rows"): sys.exit(f"{path}: no grid rows yet; run `python benchmarks/scaling.py grid` first")
    from neuronfrontier.engine.config import resolve
    from neuronfrontier.research.plan import fit_scaling, predict
    m, _ = resolve(CONFIG, None, [f"d_model={HOLDOUT['width']}"])
    N, D = m.n_params(embedding=False), HOLDOUT["steps"] * 4096
    if a.phase == "predict":
        if doc.get("holdout", {}).get("measurement"):
            sys.exit("the held-out run is already measured: a prediction made now would not be a prediction")
        fit = fit_scaling(doc["rows"])
        doc["holdout"] = dict(width=HOLDOUT["width"], steps=HOLDOUT["steps"], N=N, D=D, prediction=dict(
            val_bpb=round(predict(fit, N, D), 4), error=round(2 * fit["loo_rmse"], 4),
            error_means="2 x the fit's leave-one-out RMSE over the grid", fit=fit, command=command,
            date=time.strftime("%Y-%m-%d %H:%M"), commit=git_commit()))
        save(path, doc)
        p = doc["holdout"]["prediction"]
        print(f"predicted val_bpb of d={HOLDOUT['width']}, {HOLDOUT['steps']} steps: "
              f"{p['val_bpb']:.4f} ± {p['error']}")
        return 0
    if not doc.get("holdout", {}).get("prediction"):
        sys.exit("no prediction recorded: run `python benchmarks/scaling.py predict` before the held-out run")
    from neuronfrontier.data.shards import prepare
    data = prepare(Path(a.data), log=lambda *x: None)
    (row,) = sweep([HOLDOUT["width"]], HOLDOUT["steps"], out / "holdout", data)
    doc["holdout"]["measurement"] = dict(row, command=command, date=time.strftime("%Y-%m-%d %H:%M"),
                                         label=f"measured on CPU ({describe_machine()})")
    save(path, doc)
    p = doc["holdout"]["prediction"]
    print(f"held-out d={HOLDOUT['width']}, {HOLDOUT['steps']} steps: predicted {p['val_bpb']:.4f} ± {p['error']}, "
          f"measured {row['val_bpb']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
