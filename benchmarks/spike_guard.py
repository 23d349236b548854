#!/usr/bin/env python
"""False alarms of the warm-up spike guard (nbs/36_spikes.ipynb) on this machine: each seed's first steps, judged.

    python benchmarks/spike_guard.py                        # cpu-tiny, trn2 recipe, seeds 0-9, 10 steps, rise 0.2
    python benchmarks/spike_guard.py --recipe kit --seeds 0 1 2

Each seed trains one step with `spike_guard_steps` set and no re-draw (`spike_guard_tries=0`), so result.json holds
the first steps' losses from the seed's own initialisation and whether the criterion fired. A CPU model at this scale
is not known to take FrontierForge's spike path, so every firing here counts as a false alarm. Numbers are measured
on whatever machine runs the script."""
import argparse, json, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-tiny")
    ap.add_argument("--recipe", default="trn2")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--steps", type=int, default=10, help="spike_guard_steps: the first steps judged")
    ap.add_argument("--rise", type=float, default=0.2, help="spike_guard_rise")
    ap.add_argument("--data", default=str(ROOT / "data/cache/pydocs"))
    a = ap.parse_args()
    fired = 0
    for seed in a.seeds:
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "neuronfrontier.cli", "train", "--config", a.config, "--recipe", a.recipe,
                   "--seed", str(seed), "--steps", "1", "--device", "cpu", "--data", a.data, "--out", out, "--quiet",
                   "--set", f"spike_guard_steps={a.steps}", "--set", f"spike_guard_rise={a.rise}",
                   "--set", "spike_guard_tries=0", "--set", "eval_tokens=4096"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode: sys.exit(f"seed {seed}: {r.stderr.strip().splitlines()[-1]}")
            g = json.loads((Path(out) / "result.json").read_text())["spike_guard"][0]
        fired += g["spiked"]
        rise = max(x - min(g["losses"][:i]) for i, x in enumerate(g["losses"]) if i > 3)
        print(f"seed {seed:2d}: {'SPIKE' if g['spiked'] else 'calm '}  largest rise {rise:+.3f}  losses "
              + " ".join(f"{x:.3f}" for x in g["losses"]), flush=True)
    print(f"{a.config} {a.recipe}: the criterion (rise {a.rise}, {a.steps} steps) fired on {fired} of {len(a.seeds)} "
          f"seeds")


if __name__ == "__main__":
    main()
