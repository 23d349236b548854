#!/usr/bin/env python
"""Naive vs chunked cross-entropy: forward + backward wall time and peak memory, printed side by side.

    python benchmarks/cross_entropy.py --n 8192 --d 768 --vocab 50304 8192 --repeats 3
    python benchmarks/cross_entropy.py --quick          # seconds-long smoke test

Each (variant, vocab) runs in a fresh subprocess. Time: median over `--repeats` forward+backward passes after one
warm-up pass. Peak memory: the growth of `ru_maxrss` (the process's resident-set high-water mark) over a baseline,
the current resident set (/proc/self/statm) read after the inputs h [N, d], W [V, d] and targets are allocated
(block by block, so no full-size temporary raises the high-water mark before the measurement) and after both
variants ran once on a small problem (so code pages and thread pools that torch maps in on first use are in the
baseline). torch's CPU allocator is plain malloc/mmap, so every intermediate tensor shows up in resident memory; a
fresh process per variant keeps one variant's high-water mark from hiding the other's. Both variants also allocate
h.grad and W.grad (included).
The numbers are measured on the CPU this script runs on.
"""
import argparse, json, os, resource, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _maxrss_mb():
    "High-water mark of this process's resident set, MiB."
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


def _rss_mb():
    "Current resident set, MiB."
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _randn(rows, cols, dtype, scale, g, block=256):
    "Random [rows, cols] tensor filled block by block, so no full-size temporary raises the high-water mark."
    import torch
    out = torch.empty(rows, cols, dtype=dtype)
    for i in range(0, rows, block): out[i:i + block] = torch.randn(min(block, rows - i), cols, generator=g) * scale
    return out


def worker(a):
    import torch
    from neuronfrontier.engine.loss import naive_cross_entropy, chunked_cross_entropy, auto_chunk_size
    if a.threads: torch.set_num_threads(a.threads)
    f = dict(naive=naive_cross_entropy, chunked=chunked_cross_entropy)[a.variant]
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[a.dtype]
    g = torch.Generator().manual_seed(0)
    vocab_size = a.vocab_size or a.vocab
    h = _randn(a.n, a.d, dtype, 1.0, g).requires_grad_()
    w = _randn(a.vocab, a.d, dtype, a.d ** -0.5, g).requires_grad_()
    t = torch.randint(0, vocab_size, (a.n,), generator=g)
    softcap = a.softcap or None
    # Touch both code paths on a small problem first, so the baseline already holds the code pages and thread
    # pools torch maps in on first use (otherwise they would be charged to whichever variant runs first).
    hs, ws = torch.randn(256, a.d, requires_grad=True), torch.randn(1024, a.d, requires_grad=True)
    for fn in (naive_cross_entropy, chunked_cross_entropy):
        fn(hs.to(dtype), ws.to(dtype), torch.randint(0, 1000, (256,)), softcap=softcap, vocab_size=1000, chunk_size=64).backward()
    del hs, ws
    base, base_hwm = _rss_mb(), _maxrss_mb()   # current RSS; the high-water mark so far should be close to it
    times = []
    for i in range(a.repeats + 1):
        h.grad = w.grad = None
        t0 = time.perf_counter()
        loss = f(h, w, t, softcap=softcap, vocab_size=vocab_size, chunk_size=a.chunk_size)
        loss.backward()
        dt = time.perf_counter() - t0
        if i: times.append(dt)
        del loss
    chunk = a.chunk_size or auto_chunk_size(a.n, vocab_size)
    print(json.dumps(dict(time_s=statistics.median(times), times=times, peak_mb=_maxrss_mb() - base, base_mb=base, base_hwm_mb=base_hwm,
                          chunk=chunk if a.variant == "chunked" else None, threads=torch.get_num_threads())))


def run_one(a, variant, vocab):
    cmd = [sys.executable, __file__, "--worker", variant, "--n", str(a.n), "--d", str(a.d), "--vocab", str(vocab),
           "--repeats", str(a.repeats), "--softcap", str(a.softcap), "--dtype", a.dtype, "--threads", str(a.threads)]
    if a.chunk_size: cmd += ["--chunk-size", str(a.chunk_size)]
    if vocab == 50304: cmd += ["--vocab-size", "50257"]       # GPT-2 padded head: the 47 padding rows are masked
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode: sys.exit(f"{variant} V={vocab} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=8192, help="tokens per micro-batch")
    ap.add_argument("--d", type=int, default=768, help="model width")
    ap.add_argument("--vocab", type=int, nargs="+", default=[50304, 8192], help="head rows (50304 = GPT-2 padded; vocab_size 50257 is masked)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--softcap", type=float, default=0.0, help="logit softcap c (0 = off)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--chunk-size", type=int, default=None, help="tokens per chunk (default: auto_chunk_size)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--quick", action="store_true", help="small smoke test: N=512, d=128, V=4096 and 1024, 1 repeat")
    ap.add_argument("--worker", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    ap.add_argument("--vocab-size", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        a.variant, a.vocab = a.worker, a.vocab[0]
        return worker(a)
    if a.quick: a.n, a.d, a.vocab, a.repeats = 512, 128, [4096, 1024], 1
    print(f"cross-entropy forward+backward, N={a.n}, d={a.d}, {a.dtype}, softcap={a.softcap or 'off'}, "
          f"median of {a.repeats} after 1 warm-up; measured on CPU (this machine: {os.cpu_count()} cores)")
    hdr = f"{'V':>7} {'chunk':>6} | {'naive s':>8} {'chunked s':>9} {'time ratio':>10} | {'naive MB':>9} {'chunked MB':>10} {'mem ratio':>9}"
    print(hdr); print("-" * len(hdr))
    for vocab in a.vocab:
        nv, ch = run_one(a, "naive", vocab), run_one(a, "chunked", vocab)
        for name, r in (("naive", nv), ("chunked", ch)):
            if r["base_hwm_mb"] - r["base_mb"] > 16:
                print(f"warning: {name} V={vocab}: high-water mark was already {r['base_hwm_mb'] - r['base_mb']:.0f} MB "
                      "above the baseline; its peak may be understated")
        print(f"{vocab:>7} {ch['chunk']:>6} | {nv['time_s']:>8.2f} {ch['time_s']:>9.2f} {ch['time_s'] / nv['time_s']:>9.2f}x |"
              f" {nv['peak_mb']:>9.0f} {ch['peak_mb']:>10.0f} {ch['peak_mb'] / nv['peak_mb']:>8.1%}", flush=True)
    print("time ratio = chunked/naive wall time; mem ratio = chunked/naive peak RSS growth over the inputs "
          "(includes h.grad and W.grad)")


if __name__ == "__main__": main()
