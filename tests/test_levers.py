"""Issue 37's levers, each against a direct computation: a test fails without the lever."""
import pytest
import torch
import torch.nn.functional as F
from neuronfrontier import ops
from neuronfrontier.engine.config import ModelConfig, resolve
from neuronfrontier.engine.model import GPT


def test_leaky_relu2_forward_and_backward():
    "ops.relu2_mlp with leak α is (max(z, αz))² W_downᵀ, forward and backward; α = 0 is ReLU² exactly."
    torch.manual_seed(0)
    x = torch.randn(3, 5, 128, requires_grad=True)
    w = (torch.randn(256, 128) / 11).requires_grad_()
    wd = (torch.randn(128, 256) / 16).requires_grad_()
    y = ops.relu2_mlp(x, w, wd, leak=0.35)
    z = x @ w.T
    ref = (torch.where(z > 0, z, 0.35 * z) ** 2) @ wd.T
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w, wd), g)
    want = torch.autograd.grad(ref, (x, w, wd), g)
    for a, b in zip(got, want): torch.testing.assert_close(a, b)
    torch.testing.assert_close(ops.relu2_mlp(x, w, wd), F.relu(z) ** 2 @ wd.T, rtol=0, atol=0)


def test_mlp_leak_reaches_the_model_and_is_checked():
    m, _ = resolve("cpu-micro", "kit", ["mlp_leak=0.35"])
    assert m.mlp_leak == 0.35 and m.arch.mlp_leak == 0.35
    mlp = GPT(m).blocks[0].mlp
    x = torch.randn(2, 4, m.d_model)
    z = x @ mlp.w_up.weight.T
    torch.testing.assert_close(mlp(x), mlp.w_down(torch.where(z > 0, z, 0.35 * z) ** 2))
    with pytest.raises(ValueError, match=r"mlp_leak=-0.1 must lie in \[0, 1\)"):
        ModelConfig(mlp="relu2", mlp_leak=-0.1).validate()


def test_a_resume_checkpoint_from_before_a_new_setting_still_loads(tmp_path):
    "resume.pt written before `mlp_leak` existed (no such key): the default fills it; a different value is refused."
    from neuronfrontier.run.checkpoint import load_resume
    m, _ = resolve("cpu-micro", "kit")
    old = {k: v for k, v in m.flat().items() if k != "mlp_leak"}
    ck = {"model": {}, "model_config": old, "optimizers": [], "state": {}, "rng": {}}
    torch.save(ck, tmp_path / "resume.pt")
    assert load_resume(tmp_path / "resume.pt", m)["model_config"] == old
    with pytest.raises(ValueError, match="different model config"):
        load_resume(tmp_path / "resume.pt", ModelConfig(**{**m.flat(), "mlp_leak": 0.35}))


def test_value_embeddings_on_chosen_layers():
    "ve_layers lists the layers with a value embedding: the model has those tables and gates, n_params counts them."
    m, _ = resolve("cpu-micro", "kit", ["n_layers=4", "ve_layers=0,3"])
    assert [m.has_ve(i) for i in range(4)] == [True, False, False, True]
    g = GPT(m)
    assert sorted(g.value_embeds) == ["0", "3"]
    assert [b.attn.ve_gate is not None for b in g.blocks] == [True, False, False, True]
    assert m.n_params() == sum(p.numel() for p in g.parameters())
    with pytest.raises(ValueError, match=r"ve_layers='1,9' selects no layer or one outside 0..3"):
        resolve("cpu-micro", "kit", ["n_layers=4", "ve_layers=1,9"])


def _attention_pair(**kw):
    "(a GQA model, an MHA model with the same weights, K/V rows repeated per query head)."
    cfg = ModelConfig(vocab_size=300, d_model=256, n_layers=2, n_heads=4, d_head=64, d_mlp=256, seq_len=128, **kw)
    torch.manual_seed(0)
    g = GPT(cfg)
    for b in g.blocks: torch.nn.init.normal_(b.attn.wo.weight, std=0.05)
    r = cfg.n_heads // cfg.kv_heads
    sd = {}
    for k, v in g.state_dict().items():
        if k.endswith(("wk.weight", "wv.weight")):
            v = v.view(cfg.kv_heads, cfg.d_head, -1).repeat_interleave(r, 0).reshape(cfg.d_attn, -1)
        sd[k] = v
    from dataclasses import replace
    mha = GPT(replace(cfg, n_kv_heads=0))
    mha.load_state_dict(sd)
    return g, mha


@pytest.mark.parametrize("kv", [1, 2])
def test_gqa_equals_mha_with_repeated_kv_heads(kv):
    g, mha = _attention_pair(n_kv_heads=kv, value_embeds=True, ve_layers="1")
    idx = torch.randint(0, 300, (2, 128))
    torch.testing.assert_close(g(idx)[..., :300], mha(idx)[..., :300], rtol=1e-4, atol=1e-4)
    assert tuple(g.blocks[0].attn.wk.weight.shape) == (kv * 64, 256)
    assert g.cfg.n_params() == sum(p.numel() for p in g.parameters())
    assert g.cfg.n_params() < mha.cfg.n_params()


def _repeating_forward(self, x, cos, sin, ve=None):
    "Attention.forward as it was when the model repeated K and V per query head before ops.attention: the reference."
    from neuronfrontier.engine.model import apply_rope, offset_keys
    B, T, _ = x.shape
    q = self.wq(x).view(B, T, self.n_heads, self.d_head)
    k, v = (w(x).view(B, T, self.n_kv_heads, self.d_head) for w in (self.wk, self.wv))
    if self.q_norm is not None: q, k = self.q_norm(q), self.k_norm(k)
    if self.qk_gain != 1: q = q * self.qk_gain
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if self.slow_from is not None: k = offset_keys(k, self.slow_from)
    if self.n_kv_heads < self.n_heads:
        k, v = (t.repeat_interleave(self.n_heads // self.n_kv_heads, dim=2) for t in (k, v))
    if ve is not None and self.ve_mix is not None: v = self.ve_mix[0] * v + self.ve_mix[1] * ve.view_as(v)
    elif ve is not None:
        v = v + 2 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate.in_features]))[..., None] * ve.view_as(v)
    y = ops.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, window=self.window,
                      opset=self.opset)
    return self.wo(y.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("recipe,sets", [
    ("trn2", ["n_layers=3", "window_pattern=SL", "d_model=256", "d_head=256", "d_mlp=256", "seq_len=128", "eval_seq_len=128",
              "vocab_size=256"]),                                  # heads of 256 on one K/V head; VE mixed by scalars
    ("kit", ["n_layers=2", "n_heads=4", "n_kv_heads=2", "d_head=64", "d_model=256", "d_mlp=256", "ve_layers=1",
             "seq_len=128", "eval_seq_len=128", "vocab_size=256"]),  # two K/V heads; VE gated
])
def test_gqa_attention_gets_unrepeated_kv_and_the_same_bits(recipe, sets):
    """GQA layers hand ops.attention K with its own heads, and V too where no value embedding mixes in (there V is
    repeated per query head first); the torch backend repeats them itself: loss and gradients bit for bit those of the
    model that repeated K and V, in fp32 and under bf16 autocast."""
    import types
    cfg, _ = resolve("trn2-124m", recipe, sets)
    assert cfg.kv_heads < cfg.n_heads
    idx = torch.randint(0, cfg.vocab_size, (1, cfg.seq_len + 1), generator=torch.Generator().manual_seed(1))
    for autocast in (False, True):
        runs, heads = [], []
        for repeating in (True, False):
            torch.manual_seed(0)
            g = GPT(cfg)
            if repeating:
                for b in g.blocks: b.attn.forward = types.MethodType(_repeating_forward, b.attn)
            record = lambda op, args, kw: heads.append((args[1].shape[1], args[2].shape[1])) if not repeating else None
            with g.using(ops.OpSet("torch")), ops.watched(["attention"], record), \
                    torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = g.loss(idx[:, :-1], idx[:, 1:])
            loss.backward()
            runs.append([loss.detach()] + [p.grad for p in g.parameters() if p.grad is not None])
        assert all(torch.equal(a, b) for a, b in zip(*runs)), autocast
        ve = [cfg.has_ve(i) for i in range(cfg.n_layers)]
        assert heads == [(cfg.kv_heads, cfg.n_heads if v else cfg.kv_heads) for v in ve], heads


def test_head_width_256_runs_and_the_kernel_shapes_are_refused_by_name():
    cfg = ModelConfig(vocab_size=300, d_model=256, n_layers=1, n_heads=1, d_head=256, d_mlp=256, seq_len=128)
    g = GPT(cfg.validate())
    assert g(torch.randint(0, 300, (1, 128))).shape == (1, 128, 384)
    with pytest.raises(ValueError, match="d_head=96 is not supported; use 64, 128 or 256"):
        ModelConfig(n_heads=4, d_head=96).validate()


def test_key_offset_touches_only_the_slow_channels():
    "Keys with the offset: slow pairs (both halves) come from t-1, the rest and position 0 unchanged."
    from neuronfrontier.engine.model import offset_keys, slow_pairs_from
    first = slow_pairs_from(256, 1e5, 1024, 0.3)
    assert first == 91   # pairs 91..127: 37 of 128, as FrontierForge's K82s4 at radius 0.3
    k = torch.randn(2, 10, 1, 256)
    ko = offset_keys(k, first)
    slow = list(range(first, 128)) + list(range(128 + first, 256))
    fast = [c for c in range(256) if c not in slow]
    torch.testing.assert_close(ko[:, 1:, :, slow], k[:, :-1, :, slow])
    torch.testing.assert_close(ko[:, :, :, fast], k[:, :, :, fast])
    torch.testing.assert_close(ko[:, 0], k[:, 0])
    g, _ = _attention_pair(key_offset=0.3)
    off = GPT(replace_cfg(g.cfg, key_offset=0.0))
    off.load_state_dict(g.state_dict())
    idx = torch.randint(0, 300, (1, 128))
    assert not torch.allclose(g(idx), off(idx))   # the model reads it
    torch.testing.assert_close(g(idx)[:, 0], off(idx)[:, 0])   # position 0 keeps its own keys


def replace_cfg(cfg, **kw):
    from dataclasses import replace
    return replace(cfg, **kw)


def test_attention_source_reuse_reads_the_source_blocks_stream():
    "With attn_source '0:1', block 1's attention reads norm1(output of block 0)... which is its own input: equal;"
    " with '0:2' block 2 reads block 0's output instead of block 1's, as a direct computation gives."
    cfg = ModelConfig(vocab_size=300, d_model=256, n_layers=3, n_heads=4, d_head=64, d_mlp=256, seq_len=128)
    torch.manual_seed(0)
    plain = GPT(cfg)
    for b in plain.blocks: torch.nn.init.normal_(b.attn.wo.weight, std=0.05)
    for b in plain.blocks: torch.nn.init.normal_(b.mlp.w_down.weight, std=0.05)
    reuse = GPT(replace_cfg(cfg, attn_source="0:2"))
    reuse.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 300, (2, 64))
    cos, sin = plain.rope(64, "cpu")
    x0 = plain.wte(idx)
    h0 = plain.blocks[0](x0, cos, sin)
    h1 = plain.blocks[1](h0, cos, sin)
    b2 = plain.blocks[2]
    x = h1 + b2.attn(b2.norm1(h0), cos, sin)   # attention from block 0's output, residual on its own stream
    want = x + b2.mlp(b2.norm2(x))
    torch.testing.assert_close(reuse.hidden(idx), plain.norm_f(want))
    assert not torch.allclose(reuse.hidden(idx), plain.hidden(idx))
    with pytest.raises(ValueError, match="readers must come after block j"):
        replace_cfg(cfg, attn_source="2:1").validate()


def test_mtp_loss_equals_a_direct_computation_and_fades_in_stages():
    "model.loss with MTP weights = Σ_j w_j CE(logits_t, y_{t+j}) / next-token count; the weights fade as K82s4's."
    from neuronfrontier.engine.config import TrainConfig
    from neuronfrontier.engine.phases import mtp_weights_at
    m, _ = resolve("cpu-micro", "kit")
    torch.manual_seed(0)
    g = GPT(m)
    torch.nn.init.normal_(g.lm_head.weight, std=0.05)
    x, y = torch.randint(0, m.vocab_size, (2, 64)), torch.randint(0, m.vocab_size, (2, 64))
    w = torch.tensor([1.0, 0.5, 0.25])
    logits = g(x)[..., :m.vocab_size].float()
    direct = 0
    for j, wj in enumerate(w):
        tj = torch.full_like(y, -1)
        tj[:, :64 - j] = y[:, j:]
        direct = direct + wj * F.cross_entropy(logits.flatten(0, 1), tj.flatten(), ignore_index=-1, reduction="sum")
    direct = direct / y.numel()
    torch.testing.assert_close(g.loss(x, y, mtp=w), direct, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g.loss(x, y, mtp=torch.tensor([1.0, 0.0, 0.0])), g.loss(x, y), rtol=1e-6, atol=1e-6)
    t = TrainConfig(mtp_weights="1,0.5,0.25", mtp_fade="0.2,0.45", mtp_stages=4)
    stages = [mtp_weights_at(t, f) for f in (0.0, 0.06, 0.11, 0.16, 0.2, 0.27, 0.33, 0.4, 0.45, 0.99)]
    assert [s[2] for s in stages[:4]] == [0.21875, 0.15625, 0.09375, 0.03125]   # w3 over [0, 0.2)
    assert [s[1] for s in stages[:4]] == [0.5] * 4
    assert [s[1] for s in stages[4:8]] == [0.4375, 0.3125, 0.1875, 0.0625]      # w2 over [0.2, 0.45)
    assert stages[8] == stages[9] == (1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="mtp_fade='0.2' needs 2 rising fractions"):
        resolve("cpu-micro", "kit", ["mtp_weights=1,0.5,0.25", "mtp_fade=0.2"])


def test_mtp_loss_and_gainless_norms_run_through_the_kernels():
    """The trn2 recipe at cpu-micro (MTP weights, no norm gains) under the simulated kernels: GPT.loss(..., mtp=) calls
    the cross-entropy kernel with the k = 3 targets and the weights (not PyTorch's chunked loss), every RMSNorm the
    kernel with no gain; loss and gradients equal the model's under PyTorch. Gainless norms hold nothing, so a state
    dict without norm entries (all a checkpoint ever held of them) loads strictly."""
    m, _ = resolve("cpu-micro", "trn2")
    torch.manual_seed(0)
    g = GPT(m)
    torch.nn.init.normal_(g.lm_head.weight, std=0.05)
    assert all(n.weight is None for n in g.modules() if type(n).__name__ == "RMSNorm")
    assert not any("norm" in k for k in g.state_dict())
    g.load_state_dict({k: v.clone() for k, v in g.state_dict().items()}, strict=True)
    x, y = torch.randint(0, m.vocab_size, (2, 64)), torch.randint(0, m.vocab_size, (2, 64))
    w = torch.tensor([1.0, 0.5, 0.25])
    seen = []
    ops.load_kernels()
    real = {op: ops.implementations(op)["nki-sim"] for op in ("cross_entropy", "rms_norm")}
    spy = lambda op: lambda *a, **kw: (seen.append((op, tuple(a[2].shape) if op == "cross_entropy" else a[1], kw)),
                                       real[op](*a, **kw))[1]
    out = {}
    for be in ("torch", "cross_entropy=nki-sim,rms_norm=nki-sim"):
        g.use_ops(ops.OpSet(be))
        g.zero_grad()
        with ops.replaced({op: spy(op) for op in ("cross_entropy", "rms_norm")}, backend="nki-sim"):
            l = g.loss(x, y, mtp=w)
            l.backward()
        out[be] = (l.detach(), {n: p.grad.clone() for n, p in g.named_parameters() if p.grad is not None})
    ce = [c for c in seen if c[0] == "cross_entropy"]
    assert len(ce) == 1 and ce[0][1] == (128, 3) and torch.equal(ce[0][2]["weights"], w)
    assert {c[1] for c in seen if c[0] == "rms_norm"} == {None}
    (l0, g0), (l1, g1) = out.values()
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    for n in g0: torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-6, msg=n)   # λ grads ~3e-7: cancellation


def test_batch_phases_change_accumulation_and_rate_at_the_stated_fractions():
    "train_step takes share × grad_accum micro-batches at the phase's rate, then the whole step at the schedule's."
    from neuronfrontier.engine.optim import build_optimizers, lr_multiplier
    from neuronfrontier.run.trainer import train_step
    m, t = resolve("cpu-micro", "kit", ["grad_accum=4", "batch_size=1", "seq_len=128", "eval_seq_len=128",
                                         "warmup_steps=2", "batch_warmup=0.06:0.25:0.35,0.2:0.5:0.6"])
    g = GPT(m)
    opts = build_optimizers(g, t)
    taken = []
    def batches():
        while True:
            taken.append(1)
            yield torch.randint(0, m.vocab_size, (1, 128)), torch.randint(0, m.vocab_size, (1, 128))
    it = batches()
    def step(frac, i):
        taken.clear()
        train_step(g, opts, it, t, frac, torch.device("cpu"), step=i)
        lr = opts[0].param_groups[0]["lr"] / opts[0].param_groups[0]["initial_lr"]
        return len(taken), round(lr / lr_multiplier(frac, t), 6)
    assert step(0.0, 0) == (4, 0.5)        # warm-up step 1 of 2: whole batch, (0+1)/2 of the rate
    assert step(0.03, 5) == (1, 0.35)
    assert step(0.059, 6) == (1, 0.35)
    assert step(0.061, 7) == (2, 0.6)
    assert step(0.19, 8) == (2, 0.6)
    assert step(0.2, 9) == (4, 1.0)
    with pytest.raises(ValueError, match="batch_warmup='0.2:0.5' is not 'until:share:lr"):
        resolve("cpu-micro", "kit", ["batch_warmup=0.2:0.5"])


def test_shared_value_embedding_table_mixed_by_two_scalars():
    "ve_shared: one table for layers 0 and 2; ve_mix='scalars': v ← a·v + b·ve with a = b = 0.5 at init, no gate."
    m, _ = resolve("cpu-micro", "kit", ["n_layers=3", "ve_layers=0,2", "ve_shared=true", "ve_mix=scalars"])
    g = GPT(m)
    assert list(g.value_embeds) == ["0"] and m.n_ve_tables == 1
    a = g.blocks[2].attn
    assert a.ve_gate is None and a.ve_mix.tolist() == [0.5, 0.5] and g.blocks[1].attn.ve_mix is None
    assert m.n_params() == sum(p.numel() for p in g.parameters())
    x = torch.randn(2, 8, m.d_model)
    ve = torch.randn(2, 8, m.d_attn)
    cos, sin = g.rope(8, "cpu")
    with torch.no_grad():
        a.ve_mix.copy_(torch.tensor([0.3, 2.0]))
        got = a(x, cos, sin, ve)
        a.wv.weight.mul_(0.3)
        want = a(x, cos, sin, None) + a.wo((2.0 * ve).view(2, 8, -1))   # attention is linear in v; causal rows sum to 1
    torch.testing.assert_close(got[:, :1], want[:, :1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="ve_mix='sum' is unknown"):
        resolve("cpu-micro", "kit", ["ve_mix=sum"])


def test_the_spike_guard_redraws_the_initialisation_while_the_criterion_fires(tmp_path):
    "spike_guard_rise below any change fires every trial: 1 + tries records, each re-draw a new initialisation."
    import json, subprocess, sys
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "neuronfrontier.cli", "train", "--config", "cpu-micro", "--steps", "1",
                        "--device", "cpu", "--out", str(out), "--quiet", "--set", "spike_guard_steps=6",
                        "--set", "spike_guard_rise=-100", "--set", "spike_guard_tries=1", "--set", "seq_len=128",
                        "--set", "eval_seq_len=128", "--set", "eval_tokens=1024"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    guard = json.loads((out / "result.json").read_text())["spike_guard"]
    assert [g["init"] for g in guard] == [0, 1] and all(g["spiked"] and len(g["losses"]) == 6 for g in guard)
    assert guard[0]["losses"][0] != guard[1]["losses"][0]   # another initialisation, the same first rows
    with pytest.raises(ValueError, match="spike_guard_steps=3 is too few: the criterion reads steps after 3"):
        resolve("cpu-micro", "kit", ["spike_guard_steps=3"])


def test_adamw_betas_and_decay_by_role():
    "adam_groups sets each named role's AdamW betas and decay (K82s4's), the others keep beta1/beta2 and no decay."
    from neuronfrontier.engine.optim import build_optimizers
    m, t = resolve("cpu-micro", "trn2")
    adam = build_optimizers(GPT(m), t, print_table=False)[-1]
    by = {g["role"]: (g["betas"] if "betas" in g else adam.defaults["betas"], g["weight_decay"])
          for g in adam.param_groups}
    assert by["embed"] == ((0.8, 0.995), 0.001) and by["head"] == ((0.8, 0.96), 0.01)
    # K82s4's one scalar group: residual, x0 and value-embedding mix at one rate, betas (0.9, 0.95), no decay
    assert by["scalar"] == by["resid"] == by["x0"] == ((0.9, 0.95), 0.0)
    assert len({g["lr"] for g in adam.param_groups if g["role"] in ("scalar", "resid", "x0")}) == 1
    k, tk = resolve("cpu-micro", "kit")
    kit = {g["role"]: g.get("betas", (tk.beta1, tk.beta2)) for g in build_optimizers(GPT(k), tk, False)[-1].param_groups}
    assert kit["resid"] == (0.8, 0.95)   # a role adam_groups does not name: beta1, beta2
    with pytest.raises(ValueError, match="adam_groups='embed:0.8' has 'embed:0.8', not 'role:beta1:beta2:decay'"):
        resolve("cpu-micro", "kit", ["adam_groups=embed:0.8"])
