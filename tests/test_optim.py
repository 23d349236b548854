"""Tests for `neuronfrontier.engine.optim` that do not fit a notebook: the 2-rank gloo run against a single process."""
import math, os, socket, subprocess, sys, tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from neuronfrontier.engine.config import TrainConfig
from neuronfrontier.engine.optim import Muon, build_optimizers, lr_multiplier, apply_schedule, zeropower_via_newtonschulz5


# A stand-in with the project GPT's parameter names (wte, blocks[i].attn.wq/wk/wv/wo/q_norm/k_norm,
# blocks[i].mlp.w_gate/w_up/w_down, norm1/norm2, norm_f, lm_head).
class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, 1e-6)


class Attn(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h, self.dh = h, d // h
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.q_norm, self.k_norm = RMSNorm(self.dh), RMSNorm(self.dh)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (w(x).view(B, T, self.h, self.dh).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(self.q_norm(q), self.k_norm(k), v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, d, h, f):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = RMSNorm(d), Attn(d, h), RMSNorm(d), MLP(d, f)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, V=64, d=32, h=2, f=96, L=3, tie=False):
        super().__init__()
        self.wte, self.blocks = nn.Embedding(V, d), nn.ModuleList(Block(d, h, f) for _ in range(L))
        self.norm_f, self.lm_head = RMSNorm(d), nn.Linear(d, V, bias=False)
        if tie: self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx)
        for b in self.blocks: x = b(x)
        return F.cross_entropy(self.lm_head(self.norm_f(x)).flatten(0, 1), targets.flatten())


RECIPE = TrainConfig(optim="muon", muon_lr=0.03, lr=3e-3, embed_lr=1e-2, head_lr=5e-3, scalar_lr=4e-3,
                     weight_decay=0.1, warmup_frac=0.2, cooldown_frac=0.5, muon_momentum_start=0.8, muon_momentum_warmup=0.5)
STEPS, GLOBAL_B, T = 6, 8, 16


def _data(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(64, (GLOBAL_B, T + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def _train(rank=0, world=1, ns_dtype=torch.float32):
    "STEPS steps of the trainer's protocol; with world > 1 each rank takes its slice of the global batch and grads are averaged."
    torch.manual_seed(0)
    model = TinyGPT()
    opts = build_optimizers(model, RECIPE, print_table=False, ns_dtype=ns_dtype)
    for s in range(STEPS):
        apply_schedule(opts, RECIPE, (s + 0.5) / STEPS)  # what the trainer's planned step sets, in one call
        x, y = _data(s)
        per = GLOBAL_B // world
        loss = model(x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per])
        for o in opts: o.zero_grad()
        loss.backward()
        if world > 1:  # what DDP does: average the gradients over ranks
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(world)
        for o in opts: o.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _torchrun_main(out, dtype_name):
    "Entry point under `torchrun`: rank/world/master come from the environment torchrun sets."
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        from neuronfrontier.engine.optim import _dist_info
        rank, world = dist.get_rank(), dist.get_world_size()
        assert _dist_info(None) == (rank, world)
        torch.save(_train(rank, world, getattr(torch, dtype_name)), f"{out}.{rank}")
        dist.barrier()  # neither rank tears gloo down while the other still talks to it (that aborted ~1 run in 4)
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# fp32 NS: the runs differ only by the order of the gradient reduction (float rounding), so they agree to ~1e-7.
# bf16 NS: those rounding-level differences flip roundings of the bf16 cast (measured on CPU: a 1e-7 relative input
# perturbation changes a 96x32 NS output by ~0.7% relative; batched vs per-matrix NS is bit-identical), and they
# compound over the steps, so we bound the difference relative to how far each parameter moved (measured: 2.2%).
@pytest.mark.parametrize("dtype_name,rel", [("float32", 1e-4), ("bfloat16", 5e-2)])
def test_distributed_matches_single_process(dtype_name, rel):
    "torchrun --nproc_per_node 2 (gloo, CPU) ends with the parameters of one process on the same global batch."
    world = 2
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "state")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), __file__, out, dtype_name]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        states = [torch.load(f"{out}.{r}") for r in range(world)]
    ref = _train(ns_dtype=getattr(torch, dtype_name))
    torch.manual_seed(0)
    init = TinyGPT().state_dict()
    worst_abs, worst_rel = 0.0, 0.0
    for k, v in ref.items():
        assert torch.equal(states[0][k], states[1][k]), k  # the ranks agree bit for bit
        moved = (v - init[k]).norm().item()
        assert moved > 1e-3, k  # every parameter actually trained
        diff = (states[0][k] - v).norm().item()
        worst_abs, worst_rel = max(worst_abs, (states[0][k] - v).abs().max().item()), max(worst_rel, diff / moved)
    print(f"{dtype_name}: max |2 ranks - 1 process| = {worst_abs:.2e}, max ‖diff‖/‖movement‖ = {worst_rel:.2e}")
    assert worst_rel < rel


def test_batched_equals_per_matrix():
    G = torch.randn(5, 24, 40)
    for coeffs in ("quintic", "polar_express"):
        B = zeropower_via_newtonschulz5(G, coeffs=coeffs, dtype=torch.float32)
        for i in range(5):
            torch.testing.assert_close(B[i], zeropower_via_newtonschulz5(G[i], coeffs=coeffs, dtype=torch.float32), atol=1e-6, rtol=0)
        torch.testing.assert_close(zeropower_via_newtonschulz5(G.mT, coeffs=coeffs, dtype=torch.float32), B.mT, atol=1e-6, rtol=0)


def test_muon_flattens_conv_weights_and_skips_missing_grads():
    w, unused = nn.Parameter(torch.randn(8, 3, 2, 2)), nn.Parameter(torch.randn(4, 4))
    w.grad = torch.randn_like(w)
    w0, before = w.detach().clone(), unused.detach().clone()
    Muon([w, unused], lr=0.1, ns_dtype=torch.float32).step()
    assert torch.equal(unused.detach(), before)
    expected = w0 - 0.1 * zeropower_via_newtonschulz5(w.grad.reshape(8, 12), dtype=torch.float32).reshape(w.shape)
    torch.testing.assert_close(w.detach(), expected, atol=1e-6, rtol=0)


def test_tied_embedding_counted_once_and_lr_scaling():
    model = TinyGPT(tie=True)
    opts = build_optimizers(model, RECIPE, print_table=False)
    ids = [id(p) for o in opts for g in o.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    for o in opts:
        for g in o.param_groups: g["lr"] = g["initial_lr"] * lr_multiplier(0.9, RECIPE)
    lrs = sorted({g["lr"] for o in opts for g in o.param_groups})
    mult = lr_multiplier(0.9, RECIPE)
    assert math.isclose(mult, 0.2) and lrs == sorted({v * mult for v in (0.03, 1e-2, 4e-3)})


def test_the_trainer_warms_up_the_muon_momentum(pydocs, tmp_path, monkeypatch):
    "The momentum each Muon step uses, as the trainer runs it: start → end over the warm-up fraction, then constant."
    from neuronfrontier.run.trainer import train
    seen, real = [], Muon.step
    def spy(self, *a, **k):
        seen.append([g["momentum"] for g in self.param_groups]); return real(self, *a, **k)
    monkeypatch.setattr(Muon, "step", spy)
    train("cpu-micro", pydocs, tmp_path / "r", steps=4, verbose=False,
          sets=["muon_momentum_start=0.5", "muon_momentum=0.9", "muon_momentum_warmup=0.5", "eval_tokens=4096"])
    # the warm-up step (undone) at fraction 0, then steps at the middle of each quarter: 1/8, 3/8, 5/8, 7/8
    expected = [0.5] + [0.5 + 0.4 * min(f / 0.5, 1.0) for f in (0.125, 0.375, 0.625, 0.875)]
    assert [m for (m,) in seen] == pytest.approx(expected), seen


def test_ns_coeffs_reach_the_optimizer():
    for name in ("quintic", "polar_express"):
        opts = build_optimizers(TinyGPT(L=1), TrainConfig(optim="muon", ns_coeffs=name), print_table=False)
        assert opts[0].param_groups[0]["coeffs"] == name


def test_print_table(capsys):
    build_optimizers(TinyGPT(L=1), RECIPE)
    out = capsys.readouterr().out
    assert "blocks.0.mlp.w_gate.weight" in out and "muon" in out and "lm_head.weight" in out


if __name__ == "__main__":  # run by torchrun from test_distributed_matches_single_process
    _torchrun_main(sys.argv[1], sys.argv[2])


def _per_matrix_muon(params, grads_seq, lr=0.02, mu=0.95, wd=0.1, nesterov=True, ema=False, cautious=False):
    "Muon written one matrix at a time (the form before the foreach updates), for the equality below."
    bufs = [torch.zeros_like(p) for p in params]
    for grads in grads_seq:
        for p, g, b in zip(params, grads, bufs):
            if ema:
                b.lerp_(g, 1 - mu)
                u = g.lerp(b, mu) if nesterov else b
            else:
                b.mul_(mu).add_(g)
                u = g.add(b, alpha=mu) if nesterov else b
            o = zeropower_via_newtonschulz5(u[None], 5, "quintic", torch.float32)[0]
            scale = Muon.shape_scale(p.shape)
            if cautious: p.sub_(p * (o * p >= 0), alpha=lr * scale * wd)
            else: p.mul_(1 - lr * wd)
            p.add_(o, alpha=-lr * scale)


@pytest.mark.parametrize("ema,nesterov,cautious", [(False, True, False), (True, True, True), (False, False, True)])
def test_foreach_muon_equals_the_per_matrix_form(ema, nesterov, cautious):
    "The foreach momentum and update give the per-matrix optimizer's weights exactly, in both momentum forms."
    torch.manual_seed(0)
    shapes = [(32, 16), (16, 32), (32, 16), (24, 24)]
    ref = [torch.randn(s) for s in shapes]
    params = [nn.Parameter(p.clone()) for p in ref]
    grads_seq = [[torch.randn(s) for s in shapes] for _ in range(3)]
    opt = Muon(params, lr=0.02, momentum=0.95, weight_decay=0.1, nesterov=nesterov, ema=ema, cautious_wd=cautious,
               ns_dtype=torch.float32, distributed=False)
    for grads in grads_seq:
        for p, g in zip(params, grads): p.grad = g.clone()
        opt.step()
    _per_matrix_muon(ref, grads_seq, nesterov=nesterov, ema=ema, cautious=cautious)
    for p, r in zip(params, ref): assert torch.equal(p.detach(), r)


def _elementwise_calls(n_matrices):
    "aten elementwise arithmetic calls (not foreach) of one Muon step over `n_matrices` matrices of one shape."
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name.rstrip("_") in ("mul", "add", "sub", "lerp"): Count.calls += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(16, 16)) for _ in range(n_matrices)]
    for p in params: p.grad = torch.randn(16, 16)
    opt = Muon(params, weight_decay=0.1, ns_dtype=torch.float32, distributed=False)
    opt.step()   # creates the buffers
    with Count(): opt.step()
    return Count.calls


def test_muon_elementwise_steps_do_not_grow_with_the_matrix_count():
    """The momentum, decay and update run as foreach calls over a group (a bucket): doubling the matrices adds no
    per-matrix elementwise launches (one per matrix and step each, five a matrix, before)."""
    assert _elementwise_calls(8) == _elementwise_calls(4)


def test_adamw_runs_foreach():
    "AdamW's update is foreach on every device (PyTorch picks it itself only on the devices it knows)."
    model = TinyGPT()
    opts = build_optimizers(model, TrainConfig(), print_table=False)
    assert opts[-1].defaults["foreach"] is True
