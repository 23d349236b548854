#!/usr/bin/env python
"""End to end against K82s4 (part (d) of benchmarks/k82_parity.py): both recipes trained on this CPU from the same
documents, each seed for the same number of steps, both scored by our stand-in's `evaluate_bpb` on the same
validation stream rows.

K82s4 runs as its own `main()` (through `k82_driver.train`: its schedule on a step clock, no time stop); ours is
`neuronfrontier train --config trn2-124m` at the same shape, its default recipe. Each finished run leaves its score in
OUT/<recipe>-seed<S>.json, and a run already scored is not run again, so the benchmark can be stopped and resumed.

    python benchmarks/k82_e2e.py --k82 PATH --seeds 0 1 2 --steps 300 --out /tmp/k82_e2e
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import k82_driver as K  # noqa: E402

# the end-to-end shape: SMALL's model (depth 4, width 256, heads of 64 on one K/V head) on 128-token rows, 4
# micro-batches of 8 rows a step (4,096 tokens; half SMALL's step): 3 seeds x 2 recipes x 300 steps take about an
# hour here
E2E_SHAPE = dict(seq_len=128, total_batch=4096)
EVAL_TOKENS = 131_072


def our_sets(shape: dict) -> list[str]:
    "Our `--set`s for K82s4's small shape (the `trn2` recipe derives heads, MLP, value embeddings, attention source)."
    return [f"d_model={shape['width']}", f"n_layers={shape['depth']}", f"seq_len={shape['seq_len']}",
            f"eval_seq_len={shape['seq_len']}", f"global_batch_tokens={shape['total_batch']}",
            f"batch_size={shape['micro_batch']}", "eval_tokens=8192"]


def run_ours(seed: int, steps: int, out: Path, shape: dict, data: Path) -> dict:
    "Our trn2 recipe for `steps` steps from `seed`; its final.pt."
    cmd = [sys.executable, "-m", "neuronfrontier.cli", "train", "--config", "trn2-124m", "--device", "cpu",
           "--steps", str(steps), "--seed", str(seed), "--data", str(data), "--out", str(out), "--quiet"]
    for s in our_sets(shape): cmd += ["--set", s]
    t0 = time.time()
    with open(out.parent / f"{out.name}.log", "w") as log:
        p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if p.returncode: raise RuntimeError(f"our run failed (exit {p.returncode}); log {out.parent / (out.name + '.log')}")
    res = json.loads((out / "result.json").read_text())
    return {"wall_seconds": round(time.time() - t0, 1), "steps": res.get("steps"), "checkpoint": str(out / "final.pt")}


def score(model, tok, seq_len: int, tokens: int) -> float:
    "val_bpb of `model` by our stand-in's evaluate_bpb on the first `tokens` tokens of validation stream rows."
    from neuronfrontier.submission import kit_prepare
    with torch.no_grad():
        scored = kit_prepare.evaluate_bpb(model, tok, 8, seq_len, torch.device("cpu"), max_tokens=tokens)
        return float(scored["val_bpb"])


def one(recipe: str, seed: int, a, mod, tok, shape: dict) -> dict:
    "Train and score one (recipe, seed), or read the score a previous call left."
    done = a.out / f"{recipe}-seed{seed}.json"
    if done.exists(): return json.loads(done.read_text())
    run_dir = a.out / f"{recipe}-seed{seed}"
    if recipe == "k82s4":
        info = K.train(a.k82, seed, a.steps, run_dir, **{k: v for k, v in shape.items() if k != "seed"})
        model = K.load_for_eval(mod, run_dir / "final.pt")
    else:
        from neuronfrontier.run.checkpoint import load_for_eval
        info = run_ours(seed, a.steps, run_dir, shape, a.data)
        model = load_for_eval(str(run_dir / "final.pt"), torch.device("cpu"))
    rec = {"recipe": recipe, "seed": seed, "steps": a.steps, "val_bpb": score(model, tok, shape["seq_len"], a.tokens),
           "eval_tokens": a.tokens, **{k: info.get(k) for k in ("wall_seconds", "seconds_per_step", "saved_weights")}}
    done.write_text(json.dumps(rec, indent=1))
    print(json.dumps(rec), flush=True)
    return rec


def compare(recs: list[dict]) -> dict:
    """Means of the two recipes, their difference and its pooled standard error sqrt(s1²/n1 + s2²/n2); passes when the
    difference is under twice the error."""
    out = {}
    for r in ("k82s4", "ours"):
        v = [x["val_bpb"] for x in recs if x["recipe"] == r]
        m = sum(v) / len(v)
        sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else float("nan")
        out[r] = {"n": len(v), "mean": m, "sd": sd, "runs": v}
    diff = out["ours"]["mean"] - out["k82s4"]["mean"]
    se = math.sqrt(out["ours"]["sd"] ** 2 / out["ours"]["n"] + out["k82s4"]["sd"] ** 2 / out["k82s4"]["n"])
    return {**out, "difference": diff, "pooled_se": se, "passed": abs(diff) < 2 * se}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k82", type=Path, required=True, help="K82s4's train.py (recipes/K82s4/train.py @ d4c751e5)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=EVAL_TOKENS, help="validation tokens scored")
    ap.add_argument("--data", type=Path, default=K.DEFAULT_DATA, help="shards + tokenizer/ (the stand-in's cache)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/k82_e2e"))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ["NEURON_COMPETITION_R1_CACHE_DIR"] = str(a.data)
    shape = {**K.SMALL, **E2E_SHAPE}
    mod = K.load(a.k82, **shape)
    tok = K.tokenizer(mod)
    recs = [one(r, s, a, mod, tok, shape) for s in a.seeds for r in ("k82s4", "ours")]
    res = {"shape": shape, "steps": a.steps, "eval_tokens": a.tokens, "cpu": torch.backends.cpu.get_cpu_capability(),
           **compare(recs)}
    (a.out / "e2e.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("difference", "pooled_se", "passed")}))
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
