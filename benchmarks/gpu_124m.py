#!/usr/bin/env python
"""dense-124m on a CUDA GPU: the default recipe, `--recipe kit` and `--recipe frontier`, side by side.

    python benchmarks/gpu_124m.py                     # 150 s of training per recipe, the embedded corpus
    python benchmarks/gpu_124m.py --budget 60 --recipes kit frontier

Each recipe trains `dense-124m` (one process, `--device cuda`, bf16 autocast) for the same charged budget on the
embedded corpus (`neuronfrontier prepare`), is scored on the same validation tokens, and the script prints
tokens/s, MFU (against the GPU's dense bf16 peak in `neuronfrontier.hw`) and val_bpb for each. Where the default
recipe is one of the others (`config.DEFAULT_RECIPE`), it runs once and the table says so. The whole command fits
in 10 minutes on an H200 at the default budget (3 runs × (150 s + start-up + evaluation)).

Without a CUDA device it prints that nothing was measured and exits 0 (CI and CPU machines). Numbers it prints are
measured on the GPU that ran it: label them with its name when you quote them.
"""
import argparse, json, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(recipe: str | None, budget: float, data: Path, out: Path, sets) -> dict:
    "One `neuronfrontier train` of dense-124m on cuda; its result.json."
    exe = Path(sys.executable).parent / "neuronfrontier"
    cmd = [str(exe), "train", "--config", "dense-124m", "--device", "cuda", "--budget", str(budget), "--data", str(data),
           "--out", str(out), "--quiet"] + (["--recipe", recipe] if recipe else [])
    cmd += [x for kv in sets for x in ("--set", kv)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or ["no output"]
        return {"status": f"failed (exit {p.returncode}): {tail[0][:200]}", "wall_s": time.time() - t0}
    return json.loads((out / "result.json").read_text()) | {"wall_s": time.time() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=150.0, help="charged training seconds per recipe")
    ap.add_argument("--recipes", nargs="+", default=["default", "kit", "frontier"],
                    help="recipes to run ('default': the preset's own)")
    ap.add_argument("--data", default=str(ROOT / "data" / "cache" / "pydocs"))
    ap.add_argument("--out", default="runs/gpu_124m")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra overrides for every run")
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("gpu_124m: no CUDA device on this machine; nothing measured (run it where a GPU is lent)")
        return 0
    sys.path.insert(0, str(ROOT))
    from neuronfrontier.engine.config import DEFAULT_RECIPE
    from neuronfrontier.data.shards import prepare
    data = Path(a.data)
    if not (data / "tokenizer").exists(): prepare(data, source="embedded")
    gpu = torch.cuda.get_device_name(0)
    default = DEFAULT_RECIPE.get("dense-124m")
    runs, rows = {}, []
    for r in a.recipes:
        name = default if r == "default" else r
        label = f"default ({name})" if r == "default" else r
        if name in runs:   # the default is one of the named recipes: one run serves both rows
            rows.append((label, runs[name], f"same run as {name}"))
            continue
        print(f"training dense-124m --recipe {name or '(none)'} for {a.budget:.0f} s on {gpu} ...", flush=True)
        runs[name] = run(name, a.budget, data, Path(a.out) / (name or "none"), a.sets)
        rows.append((label, runs[name], ""))
    print(f"\ndense-124m, {a.budget:.0f} s charged per recipe, embedded corpus, measured on {gpu}:")
    print(f"{'recipe':>20} | {'tok/s':>9} | {'MFU':>6} | {'val_bpb':>7} | {'steps':>6} | note")
    for label, res, note in rows:
        if res.get("val_bpb") is None:
            print(f"{label:>20} | {res.get('status', 'no result')}")
            continue
        print(f"{label:>20} | {res['tok_s']:>9,.0f} | {res['mfu']:>6.1%} | {res['val_bpb']:>7.4f} | {res['steps']:>6} | {note}")
    return 0 if all(res.get("val_bpb") is not None for _, res, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
