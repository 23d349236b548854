# SCRATCH placeholder (uncommitted) until the optim branch merges.
import math, torch
def lr_multiplier(frac, recipe):
    frac = min(max(frac, 0.0), 1.0); w, c, f = recipe.warmup_frac, recipe.cooldown_frac, recipe.final_lr_frac
    if w > 0 and frac < w: return frac / w
    if recipe.schedule == "cosine":
        p = (frac - w) / max(1e-9, 1 - w); return f + (1 - f) * 0.5 * (1 + math.cos(math.pi * p))
    if frac < 1 - c: return 1.0
    return 1 - (1 - f) * (frac - (1 - c)) / max(c, 1e-9)
def build_optimizers(model, recipe, print_table=True):
    groups = []
    for n, p in model.named_parameters():
        lr = recipe.embed_lr if n.startswith("wte") else recipe.head_lr if n.startswith("lm_head") else recipe.lr if p.ndim == 2 else recipe.scalar_lr
        groups.append(dict(params=[p], lr=lr, initial_lr=lr, weight_decay=recipe.weight_decay if p.ndim == 2 else 0.0))
    return [torch.optim.AdamW(groups, betas=(recipe.beta1, recipe.beta2), eps=1e-8)]
