"The MoE layer against a plain per-token reference (a loop over tokens and their top-k experts), forward and backward."
import datetime, math
from dataclasses import replace
import pytest
import torch
import torch.nn.functional as F
from neuronfrontier.engine.config import ModelConfig
from neuronfrontier.engine.moe import MoE
from neuronfrontier.chip.testing import rel_err


def reference_moe(x, layer: MoE, capacity: int | None):
    "y[n] = Σ_j w[n, j] · SwiGLU_{e(n, j)}(x[n]) over the kept assignments; drops in slot-major priority order."
    cfg = layer.cfg
    logits = x @ layer.router.weight.t()
    scores = logits.softmax(-1) if cfg.router == "softmax" else logits.sigmoid()
    N = x.shape[0]
    y = [torch.zeros_like(x[0]) for _ in range(N)]
    taken = [0] * cfg.n_experts
    choices = []
    for n in range(N):
        pick = scores[n] + (layer.router.bias if cfg.balance == "bias" else 0)
        e = sorted(range(cfg.n_experts), key=lambda i: -float(pick[i].detach()))[:cfg.top_k]
        w = torch.stack([scores[n, i] for i in e])
        if cfg.top_k > 1 or cfg.router == "sigmoid": w = w / w.sum()
        choices.append((e, w))
    for j in range(cfg.top_k):                      # every token's first choice before any second choice
        for n in range(N):
            e, w = choices[n][0][j], choices[n][1][j]
            if capacity is not None and taken[e] >= capacity: continue
            taken[e] += 1
            h = F.silu(x[n] @ layer.w_gate[e]) * (x[n] @ layer.w_up[e])
            y[n] = y[n] + w * (h @ layer.w_down[e])
    return torch.stack(y)


@pytest.fixture(autouse=True)
def one_thread():
    "Hundreds of tiny per-token matmuls: threads only add overhead (and the CI machine has 2 cores)."
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _layer(seed=0, **kw):
    cfg = replace(ModelConfig(d_model=128, n_layers=1, n_heads=2, d_head=64, d_mlp=256, seq_len=128),
                  n_experts=6, top_k=3, d_expert=256, **kw).validate()
    torch.manual_seed(seed)
    m = MoE(cfg)
    with torch.no_grad(): m.w_down.normal_(0, 256 ** -0.5)     # nonzero so every weight gets a gradient
    return m


@pytest.mark.parametrize("kw", [dict(capacity_factor=None), dict(capacity_factor=0.5),
                                dict(capacity_factor=0.8, router="sigmoid", balance="bias")])
def test_moe_matches_per_token_reference(kw):
    m = _layer(**kw).train()
    if kw.get("balance") == "bias": m.router.bias.copy_(torch.linspace(-0.05, 0.05, 6))
    N = 300                                                     # not a multiple of 128; > 128 per expert
    x = torch.randn(N, 128, requires_grad=True)
    y = m(x)
    cap = None if kw["capacity_factor"] is None else math.ceil(kw["capacity_factor"] * N * 3 / 6 / 128) * 128
    if cap is not None:
        assert m.stats["dropped"] > 0, "the capacity case must actually drop assignments"
    xr = x.detach().clone().requires_grad_(True)
    yr = reference_moe(xr, m, cap)
    assert rel_err(y, yr) < 1e-6, rel_err(y, yr)
    g = torch.randn_like(y)
    params = [m.router.weight, m.w_gate, m.w_up, m.w_down]
    gy = torch.autograd.grad(y, [x] + params, g)
    gr = torch.autograd.grad(yr, [xr] + params, g)
    for name, a, b in zip(["x", "router", "w_gate", "w_up", "w_down"], gy, gr):
        assert rel_err(a, b) < 1e-5, (name, rel_err(a, b))


def test_eval_is_dropless_and_batch_independent():
    "At evaluation no capacity applies: a token's output does not depend on the other tokens of the batch."
    m = _layer(capacity_factor=0.25).eval()
    x = torch.randn(256, 128)
    with torch.no_grad():
        torch.testing.assert_close(m(x)[:10], m(x[:10]), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(m(x), reference_moe(x, m, None), rtol=1e-5, atol=1e-5)


# ---- expert parallelism: 2 gloo processes with EP=2 against one process on the whole batch ----
import os, subprocess, sys, tempfile
from pathlib import Path


def _ep_model():
    "cpu-micro with 4 experts in both layers; no drops possible (capacity ≥ a rank's tokens), balance terms linear in the batch."
    from neuronfrontier.engine.config import CONFIGS
    from neuronfrontier.engine.model import GPT
    cfg = replace(CONFIGS["cpu-micro"], n_experts=4, top_k=2, d_expert=128, capacity_factor=2.0, balance="none",
                  z_loss_coef=1e-3)
    torch.manual_seed(0)
    m = GPT(cfg)
    with torch.no_grad():
        for mo in m.moe_layers: mo.w_down.normal_(0, 0.05)
        for b in m.blocks: b.attn.wo.weight.normal_(0, 0.05)
    return m.train()


def _ep_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 8192, (4, 129), generator=g)


def _grads(m):
    return {k: p.grad.detach().clone() for k, p in m.named_parameters()}


def _ep_optimizers(m, **kw):
    from neuronfrontier.engine.config import resolve
    from neuronfrontier.engine.optim import build_optimizers
    return build_optimizers(m, resolve("cpu-micro", None, [])[1], print_table=False, **kw)


def _ep_main(out):
    "Entry point under torchrun: each rank its half of the batch, experts sharded, gradients synchronised."
    import torch.distributed as dist
    from neuronfrontier.engine.moe import expert_parallel, ep_sync_grads, gather_experts, ep_consolidated, ep_shard_optimizer_states
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))  # a collective mismatch fails, never hangs
    try:
        rank = dist.get_rank()
        m = _ep_model()
        assert expert_parallel(m) == 2 and m.moe_layers[0].w_gate.shape[0] == 2
        b = _ep_batch()[2 * rank:2 * rank + 2]
        logits = m(b[:, :-1])
        m.loss(b[:, :-1], b[:, 1:]).backward()
        ep_sync_grads(m)
        grads = _grads(m)
        opts = _ep_optimizers(m, distributed=False)   # Muon on this rank's own experts, as train does with --ep
        for o in opts: o.step()
        sd, opt_states = ep_consolidated(m, opts)     # what a checkpoint holds: as one process would
        for o, back in zip(opts, ep_shard_optimizer_states(m, opts, opt_states)):   # cut back: this rank's own state again
            for i, st in o.state_dict()["state"].items():
                for k, v in st.items():
                    if torch.is_tensor(v): assert torch.equal(v, back["state"][i][k]), (rank, i, k)
        gather_experts(m)
        torch.save(dict(logits=logits.detach(), grads=grads, w=m.moe_layers[1].w_up.detach().clone(), sd=sd, opt_states=opt_states),
                   f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


# two torchrun ranks: 10 s on a quiet 2-core CPU, 131-231 s at nice 19 under load 8 (measured on CPU)
def test_expert_parallel_two_ranks_match_one_process():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ep")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__, out]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        ranks = [torch.load(f"{out}.{i}") for i in range(2)]
    m = _ep_model()
    b = _ep_batch()
    logits = m(b[:, :-1])
    m.loss(b[:, :-1], b[:, 1:]).backward()
    ref = _grads(m)
    assert rel_err(torch.cat([ranks[0]["logits"], ranks[1]["logits"]]), logits) < 1e-5
    for k, g in ref.items():
        if k.endswith(("mlp.w_gate", "mlp.w_up", "mlp.w_down")):           # each rank holds its 2 of the 4 experts
            got = torch.cat([ranks[0]["grads"][k], ranks[1]["grads"][k]])
        else:
            assert torch.equal(ranks[0]["grads"][k], ranks[1]["grads"][k]), k
            got = ranks[0]["grads"][k]
        assert rel_err(got, g) < 1e-5, (k, rel_err(got, g))
    assert torch.equal(ranks[0]["w"], ranks[0]["sd"]["blocks.1.mlp.w_up"])   # gather_experts: the whole stack again
    # after one optimiser step, the consolidated checkpoint state of the EP ranks is one process's state
    opts = _ep_optimizers(m)
    for o in opts: o.step()
    sd, ref_states = m.state_dict(), [o.state_dict() for o in opts]
    for k, v in sd.items():   # weights after a Muon step: bf16 Newton–Schulz of gradients equal to 1e-5 agree to ~1e-3
        assert torch.equal(ranks[0]["sd"][k], ranks[1]["sd"][k]) and rel_err(ranks[0]["sd"][k], v) < 2e-3, (k, rel_err(ranks[0]["sd"][k], v))
    n_tensors = 0
    for got, ref in zip(ranks[0]["opt_states"], ref_states):
        assert got["state"].keys() == ref["state"].keys()
        for i, st in ref["state"].items():
            for k, v in st.items():
                if torch.is_tensor(v) and v.dim(): n_tensors += 1; assert rel_err(got["state"][i][k], v) < 1e-4, (i, k, rel_err(got["state"][i][k], v))
    assert n_tensors >= 6


if __name__ == "__main__":  # run by torchrun from test_expert_parallel_two_ranks_match_one_process
    _ep_main(sys.argv[1])
