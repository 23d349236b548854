"""Training state per rank, data parallel against `--fsdp` (FSDP2), side by side: the bytes of the parameters, gradients
and optimizer state each rank holds after one training step of a preset (counted on CPU; activations aside).

    python benchmarks/fsdp_memory.py [--config dense-124m] [--nproc 2 4] [--seq-len 128]

Each world size runs twice under torchrun with gloo (one process per rank, one thread each): plain data parallel and
sharded. What is counted is each rank's own storage (a DTensor's local shard), so the ratio is what sharding saves in
HBM on a chip too; the step itself runs at a short row (`--seq-len`), which changes no state size.
"""
import argparse, json, os, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RANK = r"""
import json, sys, torch, torch.distributed as dist
from neuronfrontier.engine.config import resolve
from neuronfrontier.engine.model import GPT
from neuronfrontier.run.distributed import parallelize
from neuronfrontier.engine.optim import build_optimizers, local_shard
config, seq_len, fsdp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo")
mcfg, tcfg = resolve(config, None, [f"seq_len={seq_len}", f"eval_seq_len={seq_len}"])
torch.manual_seed(0)
model = GPT(mcfg)
parallel = parallelize(model, dist.get_world_size(), fsdp=fsdp)
opts = build_optimizers(model, tcfg, print_table=False)
x = torch.randint(0, mcfg.vocab_size, (1, seq_len))
with torch.autocast("cpu", torch.bfloat16): loss = model.loss(x, x)
loss.backward()
parallel.sync_grads(model)
for o in opts: o.step()
nbytes = lambda ts: sum(local_shard(t).numel() * local_shard(t).element_size() for t in ts)
row = {"params": nbytes(model.parameters()), "grads": nbytes(p.grad for p in model.parameters() if p.grad is not None),
       "optimizer": nbytes(v for o in opts for st in o.state.values() for v in st.values()
                           if isinstance(v, torch.Tensor) and v.ndim > 0)}
rows = [None] * dist.get_world_size()
dist.all_gather_object(rows, row)
if dist.get_rank() == 0: json.dump(rows, open(out, "w"))
dist.destroy_process_group()
"""


def measure(config: str, nproc: int, seq_len: int, fsdp: bool) -> list[dict]:
    "Per-rank byte counts of one step of `config` on `nproc` gloo ranks."
    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "rank.py", Path(tmp) / "rows.json"
        script.write_text(RANK)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                        str(script), config, str(seq_len), "1" if fsdp else "0", str(out)], check=True, env=env,
                       cwd=ROOT, capture_output=True, text=True)
        return json.loads(out.read_text())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="dense-124m")
    ap.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--seq-len", type=int, default=128)
    a = ap.parse_args(argv)
    gib = lambda b: f"{b / 2**30:.3f}"
    print(f"{a.config}: training state per rank after one step, GiB (counted on CPU; activations aside)")
    print(f"{'ranks':>5}  {'data parallel':>14}  {'--fsdp (max rank)':>18}  {'ratio':>6}  "
          "fsdp: params / grads / optimizer")
    for n in a.nproc:
        dp, fs = measure(a.config, n, a.seq_len, False), measure(a.config, n, a.seq_len, True)
        total = lambda r: r["params"] + r["grads"] + r["optimizer"]
        d, f = max(map(total, dp)), max(map(total, fs))
        big = max(fs, key=total)
        print(f"{n:>5}  {gib(d):>14}  {gib(f):>18}  {f / d:>6.3f}  "
              f"{gib(big['params'])} / {gib(big['grads'])} / {gib(big['optimizer'])}")


if __name__ == "__main__":
    main()
