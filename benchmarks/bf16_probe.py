#!/usr/bin/env python
"""fp32 against bf16 matmul time at cpu-tiny's shapes on this CPU: the table behind `dtype=auto` (notebook
05_precision), and the probe's own decision.

    python benchmarks/bf16_probe.py                 # this CPU as PyTorch dispatches for it
    python benchmarks/bf16_probe.py --avx2          # also in an interpreter dispatching as an AVX2 CPU, side by side
    python benchmarks/bf16_probe.py --json out.json

Each row is one matmul a cpu-tiny step makes (8 × 512 tokens, d_model 256, the kit's MLP of 1,024 and heads of
128, vocabulary 8,192), timed as the fastest of `--repeats` calls after an untimed one; a bf16 call taking over
20 s is timed once. `--avx2` runs the same rows under ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 and
MKL_ENABLE_INSTRUCTIONS=AVX2, as a CPU without native bf16 would (`precision.AVX2_ENV`). Measured on the CPU the
script runs on: its capability report, thread count and load average are printed with the numbers.
"""
import argparse, json, os, subprocess, sys, time
from pathlib import Path

ROWS = [  # (M, K, N, what)
    (4096, 256, 256, "q, k or v projection"),
    (4096, 256, 1024, "MLP up-projection"),
    (4096, 1024, 256, "MLP down-projection"),
    (4096, 256, 8192, "the head (the loss's logits)"),
    (256, 1024, 256, "Newton-Schulz Gram matrix of a 256 x 1024 weight"),
    (256, 256, 1024, "the probe's matmul (precision.PROBE_SHAPE)"),
]


def _best_ms(a, b, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, (time.perf_counter() - t0) * 1e3)
        if best > 20_000: break   # an emulated bf16 head matmul: once is enough
    return best


def measure(repeats: int) -> dict:
    import torch
    from neuronfrontier.engine.precision import cpu_report, probe_cpu_bf16
    g = torch.Generator().manual_seed(0)
    rows = []
    for M, K, N, what in ROWS:
        a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
        a16, b16 = a.bfloat16(), b.bfloat16()
        a[:8] @ b, a16[:8] @ b16
        f, h = _best_ms(a, b, repeats), _best_ms(a16, b16, repeats)
        rows.append({"shape": [M, K, N], "what": what, "fp32_ms": round(f, 3), "bf16_ms": round(h, 3),
                     "ratio": round(h / f, 3)})
    return {"cpu": cpu_report(), "probe": probe_cpu_bf16(), "threads": torch.get_num_threads(),
            "load": round(os.getloadavg()[0], 2), "torch": torch.__version__, "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--avx2", action="store_true", help="also measure as an AVX2 CPU would (side by side)")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)   # the --avx2 child: JSON on stdout
    a = ap.parse_args(argv)
    if a.raw:
        print(json.dumps(measure(a.repeats)))
        return
    runs = {"as dispatched": measure(a.repeats)}
    if a.avx2:
        from neuronfrontier.engine.precision import AVX2_ENV
        r = subprocess.run([sys.executable, __file__, "--raw", "--repeats", str(a.repeats)], capture_output=True,
                           text=True, check=True, env=os.environ | AVX2_ENV)
        runs["as AVX2"] = json.loads(r.stdout)
    for name, m in runs.items():
        p = m["probe"]
        print(f"{name}: {m['cpu']}, {m['threads']} threads, load {m['load']}, torch {m['torch']}; the probe: "
              f"bf16 {'native' if p['native'] else 'not native'} ({p['ratio']}x fp32) -> dtype=auto trains in "
              f"{'bf16' if p['native'] else 'fp32'}")
    head = "| matmul (M x K x N) | what | " + " | ".join(f"fp32 ms, bf16 ms, bf16/fp32 ({n})" for n in runs) + " |"
    print("\n" + head + "\n|" + "---|" * (2 + len(runs)))
    for i, (M, K, N, what) in enumerate(ROWS):
        cells = [f"{m['rows'][i]['fp32_ms']:.3g}, {m['rows'][i]['bf16_ms']:.3g}, {m['rows'][i]['ratio']:.3g}x"
                 for m in runs.values()]
        print(f"| {M} x {K} x {N} | {what} | " + " | ".join(cells) + " |")
    if a.json: Path(a.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
