"""The competition kit's training step (karpathy/autoresearch `train.py`), re-implemented for the CPU from reading it.

Only what a step computes is kept: the model (ReLU² MLP, value embeddings with their gate, per-layer residual and
x0 scalars, RMSNorm without gains, QK-norm after RoPE, softcap 15, the SSSL window pattern), its optimizer (AdamW
groups and Muon with Polar Express, NorMuon and cautious weight decay) and its schedules. Replaced for the CPU:
FlashAttention-3 by SDPA with the same window mask (FA3's `window_size=(W, 0)`: query i sees keys i-W … i),
`torch.compile` by plain calls. `bf16_tables=False` keeps the embedding tables in fp32 (the kit casts them to bf16)
so the step can be compared in fp32 without autocast.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

POLAR_EXPRESS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
GATE_CHANNELS = 32


def rms(x):
    return F.rms_norm(x, (x.size(-1),))


def layer_has_ve(i, n_layer):
    return i % 2 == (n_layer - 1) % 2


def rotate(x, cos, sin):
    "The kit's rotary embedding: channel pairs (j, j + D/2) turned by −θ."
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


def rotary(seq_len, head_dim):
    "fp32 cos and sin tables [1, T, 1, head_dim/2] (base 10000)."
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]


def window_mask(T, window, device=None):
    "Boolean [T, T]: query i may look at key j when 0 ≤ i − j ≤ window."
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    return (j <= i) & (i - j <= window)


class KitBlock(nn.Module):
    def __init__(self, d, n_head, layer, n_layer):
        super().__init__()
        self.n_head, self.head_dim = n_head, d // n_head
        self.c_q = nn.Linear(d, d, bias=False)
        self.c_k = nn.Linear(d, d, bias=False)
        self.c_v = nn.Linear(d, d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.ve_gate = nn.Linear(GATE_CHANNELS, n_head, bias=False) if layer_has_ve(layer, n_layer) else None
        self.c_fc = nn.Linear(d, 4 * d, bias=False)
        self.mlp_proj = nn.Linear(4 * d, d, bias=False)

    def attend(self, x, ve, cos, sin, window):
        B, T, _ = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim)
        if ve is not None:
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., :GATE_CHANNELS]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_head, self.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k = rms(q), rms(k)
        mask = window_mask(T, window, x.device)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))

    def forward(self, x, ve, cos, sin, window):
        x = x + self.attend(rms(x), ve, cos, sin, window)
        return x + self.mlp_proj(F.relu(self.c_fc(rms(x))).square())


class KitGPT(nn.Module):
    def __init__(self, vocab, d, n_layer, n_head, seq_len, pattern="SSSL", bf16_tables=True):
        super().__init__()
        self.n_layer, self.head_dim = n_layer, d // n_head
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList(KitBlock(d, n_head, i, n_layer) for i in range(n_layer))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.resid_lambdas = nn.Parameter(torch.ones(n_layer))
        self.x0_lambdas = nn.Parameter(torch.full((n_layer,), 0.1))
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(vocab, d)
                                           for i in range(n_layer) if layer_has_ve(i, n_layer)})
        windows = [seq_len if pattern[i % len(pattern)] == "L" else seq_len // 2 for i in range(n_layer)]
        windows[-1] = seq_len
        self.windows = windows
        cos, sin = rotary(seq_len, self.head_dim)
        self.cos, self.sin = cos.bfloat16(), sin.bfloat16()   # the kit keeps its rotary tables in bf16
        if bf16_tables:
            self.wte.to(torch.bfloat16)
            for table in self.value_embeds.values():
                table.to(torch.bfloat16)

    def forward(self, idx, targets, reduction="mean"):
        T = idx.shape[1]
        cos, sin = self.cos[:, :T], self.sin[:, :T]
        x = x0 = rms(self.wte(idx))
        for i, block in enumerate(self.h):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, ve, cos, sin, self.windows[i])
        logits = self.lm_head(rms(x)).float()
        logits = 15 * torch.tanh(logits / 15)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1, reduction=reduction)


def adamw_update(p, grad, state, lr, betas, eps, wd):
    if not state:
        state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
    state["step"] += 1
    p.mul_(1 - lr * wd)
    state["m"].lerp_(grad, 1 - betas[0])
    state["v"].lerp_(grad.square(), 1 - betas[1])
    bias1 = 1 - betas[0] ** state["step"]
    bias2 = 1 - betas[1] ** state["step"]
    p.add_(state["m"] / ((state["v"] / bias2).sqrt() + eps), alpha=-lr / bias1)


def mm_bf16(a, b):
    """`a @ b` of bf16 matrices as a bf16 GEMM computes it (bf16 operands, fp32 accumulation, a bf16 result), through
    fp32: on a CPU without native bf16 the bf16 matmul itself is emulated, about a hundred times slower."""
    return (a.float() @ b.float()).bfloat16()


def muon_update(params, state, lr, momentum, wd, beta2=0.95, ns_steps=5):
    "One kit Muon step of a group of same-shape matrices, stacked."
    shape = params[0].shape
    grads = torch.stack([p.grad for p in params])
    weights = torch.stack([p.detach() for p in params])
    if not state:
        state["buf"] = torch.zeros_like(grads)
        second_shape = (len(params), shape[-2], 1) if shape[-2] >= shape[-1] else (len(params), 1, shape[-1])
        state["second"] = torch.zeros(second_shape, dtype=grads.dtype)
    red_dim = -1 if shape[-2] >= shape[-1] else -2
    state["buf"].lerp_(grads, 1 - momentum)              # Nesterov, in the kit's lerp form
    g = grads.lerp_(state["buf"], momentum)
    X = g.bfloat16()
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)
    for a, b, c in POLAR_EXPRESS[:ns_steps]:
        if g.size(-2) > g.size(-1):
            A = mm_bf16(X.mT, X)
            X = a * X + mm_bf16(X, b * A + c * mm_bf16(A, A))
        else:
            A = mm_bf16(X, X.mT)
            X = a * X + mm_bf16(b * A + c * mm_bf16(A, A), X)
    g = X
    v_mean = g.float().square().mean(dim=red_dim, keepdim=True)           # NorMuon
    n = g.size(red_dim)
    v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * n).sqrt()
    state["second"].lerp_(v_mean.to(state["second"].dtype), 1 - beta2)
    step_size = state["second"].clamp_min(1e-10).rsqrt()
    v_norm_new = ((v_mean * n) * step_size.float().square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    g = g * (step_size * (v_norm / v_norm_new.clamp_min(1e-10))).to(g.dtype)
    lr_t = torch.tensor(lr * max(1.0, shape[-2] / shape[-1]) ** 0.5).to(g.dtype)
    wd_t = torch.tensor(wd).to(g.dtype)
    mask = (g * weights) >= 0                                             # cautious weight decay
    weights.sub_(lr_t * g + lr_t * wd_t * weights * mask)
    for p, w in zip(params, weights.unbind(0)):
        p.data.copy_(w)


class KitOptimizer:
    "The kit's groups and rates (`setup_optimizer`) and its schedules (`get_lr_multiplier`, momentum, weight decay)."
    def __init__(self, model, d, embedding_lr=0.6, unembedding_lr=0.004, matrix_lr=0.04, scalar_lr=0.5,
                 weight_decay=0.2, betas=(0.8, 0.95), warmdown=0.5):
        scale = (d / 768) ** -0.5
        self.adam = [([model.lm_head.weight], unembedding_lr * scale, betas),
                     ([model.wte.weight], embedding_lr * scale, betas),
                     ([t.weight for t in model.value_embeds.values()], embedding_lr * scale, betas),
                     ([model.resid_lambdas], scalar_lr * 0.01, betas),
                     ([model.x0_lambdas], scalar_lr, (0.96, 0.95))]
        matrices = list(model.h.parameters())
        self.muon = [[p for p in matrices if p.shape == s] for s in sorted({p.shape for p in matrices})]
        self.matrix_lr, self.weight_decay, self.warmdown = matrix_lr, weight_decay, warmdown
        self.state = {}

    def lr_multiplier(self, progress):
        if progress < 1 - self.warmdown:
            return 1.0
        return (1 - progress) / self.warmdown

    @torch.no_grad()
    def step(self, step, progress):
        lrm = self.lr_multiplier(progress)
        momentum = 0.85 + 0.10 * min(step / 300, 1)
        wd = self.weight_decay * (1 - progress)
        for params, lr, betas in self.adam:
            for p in params:
                adamw_update(p, p.grad, self.state.setdefault(id(p), {}), lr * lrm, betas, 1e-10, 0.0)
        for group in self.muon:
            muon_update(group, self.state.setdefault(id(group[0]), {}), self.matrix_lr * lrm, momentum, wd)

    def zero_grad(self, model):
        for p in model.parameters():
            p.grad = None
