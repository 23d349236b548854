#!/usr/bin/env python
"""Minor page faults and system time per training step, with glibc's allocator defaults and after
`train.reuse_freed_memory` (the trainer calls it for CPU runs): a measurement of this machine, not a test.

    python benchmarks/allocator.py                  # cpu-tiny (frontier recipe), batch 16 × 256, 5 repeats
    python benchmarks/allocator.py --repeats 3 --set dtype=fp32

Each repeat runs both settings, each in a fresh process (the allocator's state is per process, as in a real run):
two warm-up steps, then the faults and system time of four steps (`getrusage`), per step. The ratio column is the
tuned count over the default's. Page faults depend on the machine's load and memory pressure, which is why this is
a benchmark: the CPU's capability report and the load average are printed beside the numbers.
"""
import argparse, json, os, subprocess, sys

STEP = """
import json, resource, sys, torch
from neuronfrontier.engine.config import resolve
from neuronfrontier.engine.model import GPT
from neuronfrontier.engine.optim import build_optimizers
from neuronfrontier.run.trainer import train_step, reuse_freed_memory
if sys.argv[1] == "1": reuse_freed_memory()
torch.set_num_threads(1)
torch.manual_seed(0)
mc, tc = resolve("cpu-tiny", "frontier", json.loads(sys.argv[2]))
m = GPT(mc)
opts = build_optimizers(m, tc, print_table=False)
batches = iter(lambda: (torch.randint(0, 8192, (16, 256)),) * 2, None)
for _ in range(2): train_step(m, opts, batches, tc, 1.0, torch.device("cpu"))
r0 = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(4): train_step(m, opts, batches, tc, 1.0, torch.device("cpu"))
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"faults": (r1.ru_minflt - r0.ru_minflt) / 4, "sys_ms": (r1.ru_stime - r0.ru_stime) / 4 * 1e3}))
"""


def one(tuned: bool, sets: list) -> dict:
    r = subprocess.run([sys.executable, "-c", STEP, "1" if tuned else "0", json.dumps(sets)], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    a = ap.parse_args(argv)
    import torch
    from neuronfrontier.engine.precision import cpu_report
    print(f"CPU: {cpu_report()}, load average {os.getloadavg()[0]:.2f}, torch {torch.__version__}")
    print(f"{'repeat':>6} {'default faults':>15} {'tuned faults':>13} {'ratio':>6} {'default sys ms':>15} "
          f"{'tuned sys ms':>13}")
    ratios = []
    for i in range(a.repeats):
        d, t = one(False, a.sets), one(True, a.sets)
        ratios.append(t["faults"] / max(d["faults"], 1))
        print(f"{i:>6} {d['faults']:>15,.0f} {t['faults']:>13,.0f} {ratios[-1]:>6.2f} {d['sys_ms']:>15.0f} "
              f"{t['sys_ms']:>13.0f}")
    print(f"tuned/default faults: {min(ratios):.2f}-{max(ratios):.2f} over {a.repeats} repeats "
          f"(load average now {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
