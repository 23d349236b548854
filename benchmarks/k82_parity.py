#!/usr/bin/env python
"""Parity of our `trn2` recipe with FrontierForge's K82s4, check by check, at the driver's small shape on a CPU.

K82s4 is `recipes/K82s4/train.py` of marker2601/trainium-simulator at d4c751e5 (docs/k82s4.md reads it line by line);
its file is given at run time and run through `benchmarks/k82_driver.py` (none of its code is in this repository).
Ours is `resolve("trn2-124m")` at the same shape: depth 4, width 256, heads of 64 on one K/V head, 256-token rows,
micro-batches of 8 rows, 8,192 tokens a step (4 micro-batches), fp32, the stand-in prepare.py's documents.

    python benchmarks/k82_parity.py --k82 /path/to/K82s4/train.py --out nbs/results/k82_parity.json

(a) rows: the first micro-batches of each rank (ranks 0 and 1 of 2, rank 0 of 1), inputs and targets, from K82s4's
    stream loader, from ours as a submission builds them from the kit's documents (kit `_document_batches` ->
    StreamRows -> RollingPool) and from ours as the engine builds them from the shards (`rank_loader`).
(b) forward: K82s4's initial weights copied into our GPT; one micro-batch's loss and gradients at MTP stages before,
    inside and after each fade. Gradients are compared relative to max(‖g82‖, 1e-4·‖all gradients‖): at init the
    residual and x0 scalars' gradients are ~1e-10 of noise (the blocks' output projections start at zero).
(c) update: a sequence of phase points (step 0, the EMA pre-warm, the end of the warm-up, each batch warm-up phase,
    MTP stages, cooldown levels). Before each point our model and optimizer state are set to K82s4's (the weights by
    `to_ours`, the state by `state_to_ours`); both take one step at the same point on the same micro-batches: K82s4
    through the driver's `Run`, ours through `train.train_step` (its own gradients), and once more through our
    optimizers on K82s4's gradients (isolating the optimizer). Compared: the step's scalars (k, rates, momentum,
    decay, MTP weights, per-parameter hyper-parameters), the weights (per tensor ‖Δ‖/‖w‖), the optimizer state, the
    EMA after the steps that update it; at the end the saved weights under K82s4's rule and ours (blend, pure EMA,
    a young EMA). A schedule check compares the same scalars at every step of a 300-step walk, without a model.
(d) end to end: benchmarks/k82_e2e.py's result (3 seeds × 300 steps both recipes), read from its JSON.

Every check prints a row (check, point, quantity, value, tolerance, pass/fail); all go to `--out` ("table") with a
`summary` line, K82s4's commit, the CPU capability, torch's version and the date. The exit status is 1 when any row
fails ((d) not run included).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import k82_driver as K  # noqa: E402

SHAPE = K.SMALL
# our trn2-124m preset at the driver's small shape (the recipe derives heads, MLP, value embeddings, attention source)
OUR_SETS = (f"d_model={SHAPE['width']}", f"n_layers={SHAPE['depth']}", f"seq_len={SHAPE['seq_len']}",
            f"eval_seq_len={SHAPE['seq_len']}", f"global_batch_tokens={SHAPE['total_batch']}",
            f"batch_size={SHAPE['micro_batch']}", "dtype=fp32")
ROW_CHECKS = ((0, 2), (1, 2), (0, 1))   # (rank, world)
N_ROWS = 128                            # micro-batches a rank compared: the rolling shuffle starts at 96
FORWARD_PROGRESS = ((0.0, "progress 0 (fade 1, stage 0)"), (0.1, "progress 0.1 (inside fade 1)"),
                    (0.3, "progress 0.3 (inside fade 2)"), (0.5, "progress 0.5 (after the fades)"))
# the update's phase points: (name, step, K82s4's progress read before the step, micro-batches done before it)
POINTS = (
    ("step 0", 0, 0.0, 0),
    ("step 3 (EMA pre-warm)", 3, 0.0, 12),
    ("step 19 (warm-up end)", 19, 0.04, 76),
    ("k=1 phase, step 31 (EMA)", 31, 0.05, 91),
    ("k=2 phase, step 63 (EMA)", 63, 0.15, 150),
    ("level 19, MTP fade 2", 100, 0.32, 300),
    ("level 11, MTP off (EMA)", 127, 0.6, 420),
    ("level 2, step 255 (EMA)", 255, 0.95, 1300),
)
WALK_STEPS = 300
LOSS_TOL, GRAD_TOL, WEIGHT_TOL, STATE_TOL, SCALAR_TOL = 1e-6, 1e-5, 1e-5, 1e-5, 1e-9
MATURE_EMA = 20   # EMA updates that make a blend allowed on both sides (0.99^32^20 < 0.1)
CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------------------------------
class Table:
    """Rows (check, point, quantity, value, tolerance, passed, note), each printed as it is added."""

    def __init__(self):
        self.rows: list[dict] = []
        print(f"{'check':<10} {'point':<30} {'quantity':<46} {'value':>11} {'tol':>9}  result")

    def add(self, check: str, point: str, quantity: str, value, tol, passed: bool, note: str = "") -> bool:
        """Record and print one row; returns `passed`."""
        row = dict(check=check, point=point, quantity=quantity, value=value, tolerance=tol, passed=bool(passed),
                   note=note)
        self.rows.append(row)
        shown = f"{value:.3e}" if isinstance(value, float) else str(value)
        tol_s = f"{tol:.0e}" if isinstance(tol, float) else str(tol)
        tail = f"  {note}" if note else ""
        print(f"{check:<10} {point[:30]:<30} {quantity[:46]:<46} {shown:>11} {tol_s:>9}  "
              f"{'pass' if passed else 'FAIL'}{tail}", flush=True)
        return bool(passed)

    def within(self, check: str, point: str, quantity: str, value: float, tol: float, note: str = "") -> bool:
        """A row that passes when `value` <= `tol` (NaN fails)."""
        return self.add(check, point, quantity, float(value), tol, value <= tol, note)

    def equal(self, check: str, point: str, quantity: str, ours, theirs, note: str = "") -> bool:
        """A row that passes when `ours == theirs`; the value column shows ours (and theirs when they differ)."""
        same = ours == theirs
        shown = f"{ours}" if same else f"{ours}≠{theirs}"
        return self.add(check, point, quantity, shown, "equal", same, note)

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.rows)


def rel(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0, keep: torch.Tensor | None = None) -> float:
    """‖a − b‖ / max(‖b‖, floor) in float64 (0 when both are 0); `keep`: only those elements' differences."""
    a, b = a.detach().double(), b.detach().double().reshape(a.shape)
    scale = max(float(b.norm()), floor)
    d = a - b if keep is None else (a - b) * keep.reshape(a.shape)
    diff = float(d.norm())
    return 0.0 if diff == 0 else diff / scale if scale > 0 else math.inf


def worst(ours: dict, theirs: dict, floor: float = 0.0, keep: dict | None = None) -> tuple[float, str]:
    """(largest `rel` over the tensors of two name -> tensor dicts with the same names, its name); `keep`: masks of
    the elements compared, by name (a name without one: every element)."""
    if set(ours) != set(theirs):
        raise KeyError(f"different names: {sorted(set(ours) ^ set(theirs))[:4]}")
    keep = keep or {}
    return max(((rel(ours[n], theirs[n], floor, keep.get(n)), n) for n in ours), key=lambda t: (t[0], t[1]))


# ---------------------------------------------------------------------------------------------------------------------
# our side
# ---------------------------------------------------------------------------------------------------------------------
def our_configs(world: int = 1):
    """(ModelConfig, TrainConfig) of `trn2-124m` at the small shape, with one of `world` ranks' micro-batches."""
    from neuronfrontier.engine.config import rank_batch, resolve
    mcfg, tcfg = resolve("trn2-124m", None, list(OUR_SETS))
    return mcfg, rank_batch(tcfg, mcfg.seq_len, world)


@contextlib.contextmanager
def torchrun_env(rank: int, world: int):
    """torchrun's RANK / LOCAL_RANK / WORLD_SIZE inside the block (what `submission.kit_rows` reads), restored after."""
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def our_kit_rows(tcfg, seq_len: int, rank: int, world: int, seed: int, n: int) -> list:
    """Our first `n` micro-batches as a submission makes them on the organisers' machine: the kit's tokenizer and
    `_document_batches` through `submission.kit_rows` and `batches._training_rows` (StreamRows, RollingPool)."""
    from neuronfrontier.submission import kit_prepare, entry as submission
    from neuronfrontier.data.batches import _training_rows
    tok = kit_prepare.ensure_tokenizer(build_if_missing=False)
    spec = SimpleNamespace(rows=submission.kit_rows(kit_prepare, tok))
    with torchrun_env(rank, world):
        _, rows = _training_rows(spec, None, tok.enc, tcfg, seq_len, rank, world, seed)
    return list(itertools.islice(rows, n))


def our_shard_rows(data_dir: Path, tcfg, seq_len: int, rank: int, world: int, seed: int, n: int) -> list:
    """Our first `n` micro-batches as the engine makes them from the prepared shards (`batches.rank_loader`)."""
    from neuronfrontier.data.batches import rank_loader
    from neuronfrontier.data.shards import find_shards, load_tokenizer
    paths, _ = find_shards(data_dir)
    enc, _ = load_tokenizer(data_dir / "tokenizer")
    _, rows = rank_loader(paths, enc, tcfg, seq_len, rank, world, seed)
    return list(itertools.islice(rows, n))


def set_our_state(model, opts, state: dict) -> None:
    """Write optimizer state by our names (`k82_driver.state_to_ours`'s layout) into our Muon and AdamW: Muon's
    `momentum_buffer` and NorMuon's `second_moment`, AdamW's `exp_avg`, `exp_avg_sq` and `step`."""
    from neuronfrontier.engine.optim import Muon
    params = dict(model.named_parameters())
    muon = next(o for o in opts if isinstance(o, Muon))
    adamw = next(o for o in opts if isinstance(o, torch.optim.AdamW))
    for name, st in state.items():
        p = params[name]
        if "momentum_buffer" in st:
            muon.state[p] = {"momentum_buffer": st["momentum_buffer"].clone().reshape(p.shape),
                             "second_moment": st["second_momentum_buffer"].clone()}
        else:
            adamw.state[p] = {"step": torch.tensor(float(st["step"]), dtype=torch.float32),
                              "exp_avg": st["exp_avg"].clone().reshape(p.shape),
                              "exp_avg_sq": st["exp_avg_sq"].clone().reshape(p.shape)}


def our_state(model, opts) -> dict:
    """Our optimizer state in `set_our_state`'s layout (K82s4's key for NorMuon's buffer), for comparison."""
    out = {}
    for o in opts:
        for name, p in model.named_parameters():
            st = o.state.get(p)
            if not st:
                continue
            if "momentum_buffer" in st:
                out[name] = {"momentum_buffer": st["momentum_buffer"],
                             "second_momentum_buffer": st["second_moment"]}
            else:
                out[name] = {k: st[k] for k in ("exp_avg", "exp_avg_sq", "step")}
    return out


def our_step_on(model, opts, grads: dict, tcfg, frac: float, step: int, full_batches: float) -> None:
    """One step of our optimizers on given gradients, with the schedule as `train.train_step` applies it
    (`batch_phase`'s rate into `apply_schedule`, then each optimizer's step)."""
    from neuronfrontier.engine.optim import apply_schedule
    from neuronfrontier.engine.phases import batch_phase
    _, phase_lr = batch_phase(tcfg, frac, step)
    apply_schedule(opts, tcfg, frac, phase_lr, step, full_batches)
    for name, p in model.named_parameters():
        p.grad = grads[name].detach().to(p.dtype).reshape(p.shape).clone()
    for o in opts:
        o.step()
    for o in opts:
        o.zero_grad(set_to_none=True)


def hyper(groups_of: dict) -> dict:
    """{name: {hyper-parameter: float}} from {name: param group}: lr, weight decay, momentum or betas, beta2, eps."""
    out = {}
    for name, g in groups_of.items():
        h = {"lr": g["lr"], "weight_decay": g["weight_decay"]}
        if "betas" in g:
            h |= {"beta1": g["betas"][0], "beta2": g["betas"][1], "eps": g["eps"]}
        else:
            h |= {"momentum": g["momentum"], "beta2": g["beta2"]}
        out[name] = h
    return out


def our_groups(model, opts) -> dict:
    """{our parameter name: its param group}."""
    where = {id(p): g for o in opts for g in o.param_groups for p in g["params"]}
    return {n: where[id(p)] for n, p in model.named_parameters()}


def k82_groups(mod, k82_model, optimizer, our_cfg) -> dict:
    """{our parameter name: K82s4's param group of its (first) K82s4 parameter}."""
    where = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    by_name = dict(k82_model.named_parameters())
    ve = list(our_cfg.ve_layers)
    out = {}
    for ours, theirs in K._k82_names(our_cfg.n_layers, ve).items():
        first = theirs[0] if isinstance(theirs, list) else theirs
        out[ours] = where[id(by_name[first])]
    return out


def max_hyper_diff(ours: dict, theirs: dict) -> tuple[float, str]:
    """(largest relative difference of any hyper-parameter of any parameter, 'name.key')."""
    best = (0.0, "")
    for name, h in ours.items():
        for key, v in h.items():
            t = theirs[name].get(key)
            d = math.inf if t is None else abs(v - t) / max(abs(t), 1e-30) if v != t else 0.0
            best = max(best, (d, f"{name}.{key}"))
    return best


# ---------------------------------------------------------------------------------------------------------------------
# (a) rows
# ---------------------------------------------------------------------------------------------------------------------
def compare_rows(a: list, b: list) -> tuple[int, int | None]:
    """(micro-batches equal in inputs and targets, the first that is not or None)."""
    first = None
    same = 0
    for i, ((xa, ya), (xb, yb)) in enumerate(zip(a, b)):
        if torch.equal(xa.long(), xb.long()) and torch.equal(ya.long(), yb.long()):
            same += 1
        elif first is None:
            first = i
    if len(a) != len(b) and first is None:
        first = min(len(a), len(b))
    return same, first


def check_rows(table: Table, mod, tok, data_dir: Path) -> dict:
    """(a): K82s4's stream rows against ours (kit documents and shards) for each (rank, world), `N_ROWS` each."""
    out = {}
    seed = mod.SEED
    for rank, world in ROW_CHECKS:
        mcfg, tcfg = our_configs(world)
        point = f"rank {rank} of {world}, seed {seed}"
        k82 = K.rows(mod, tok, rank, world, N_ROWS)
        bos = tok.get_bos_token_id()
        masked = sum(int((y == -1).sum()) for _, y in k82)
        bos_targets = sum(int((y == bos).sum()) for _, y in k82)
        table.equal("(a) rows", point, "K82s4: BOS targets left unmasked", bos_targets, 0,
                    note=f"{masked} targets masked (-1)")
        res = {"masked_targets": masked}
        for how, rows in (("kit documents", our_kit_rows(tcfg, mcfg.seq_len, rank, world, seed, N_ROWS)),
                          ("shards", our_shard_rows(data_dir, tcfg, mcfg.seq_len, rank, world, seed, N_ROWS))):
            same, first = compare_rows(rows, k82)
            res[how] = {"equal": same, "first_mismatch": first}
            table.equal("(a) rows", point, f"ours ({how}) = K82s4: equal micro-batches", same, N_ROWS,
                        note="" if first is None else f"first mismatch at micro-batch {first}")
        out[point] = res
    return out


# ---------------------------------------------------------------------------------------------------------------------
# (b) forward
# ---------------------------------------------------------------------------------------------------------------------
def check_forward(table: Table, mod, k82_model, ours, mcfg, tcfg, batch) -> dict:
    """(b): loss and gradients of one micro-batch at each MTP point, K82s4's initial weights in both models."""
    from neuronfrontier.engine.phases import mtp_weights_at
    x, y = batch
    out = {}
    for progress, point in FORWARD_PROGRESS:
        w82 = K.mtp_weights(mod, progress)
        w = torch.tensor(mtp_weights_at(tcfg, progress), dtype=torch.float32)
        table.equal("(b) fwd", point, "MTP weights (fp32)", w.tolist(), w82.tolist())
        l82, g82 = K.loss_and_grads(mod, k82_model, x, y, progress, our_cfg=mcfg)
        ours.zero_grad(set_to_none=True)
        loss = ours.loss(x.long(), y, mtp=w)
        loss.backward()
        loss = float(loss.detach())
        grads = {n: p.grad.detach().clone() for n, p in ours.named_parameters()}
        ours.zero_grad(set_to_none=True)
        total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in g82.values()))
        d_loss = abs(loss - l82) / abs(l82)
        g_worst, g_name = worst(grads, g82, floor=1e-4 * total)
        table.within("(b) fwd", point, f"loss (K82s4 {l82:.6f}) relative", d_loss, LOSS_TOL)
        table.within("(b) fwd", point, f"grad ‖Δ‖/max(‖g82‖,1e-4‖G‖) worst {g_name}", g_worst, GRAD_TOL)
        out[point] = {"progress": progress, "loss_k82": l82, "loss_ours": loss, "loss_rel": d_loss,
                      "grad_worst": g_worst, "grad_worst_tensor": g_name, "all_grads_norm": total}
    return out


# ---------------------------------------------------------------------------------------------------------------------
# (c) update
# ---------------------------------------------------------------------------------------------------------------------
def k82_ema_updates_after(mod, step: int) -> bool:
    """Whether K82s4's loop updates its EMA after step `step` (l.4471-4472, as k82_driver.Run replays it)."""
    return (step + 1) % mod.EMA_EVERY == 0 or bool(mod.EMA_PREWARM and step + 1 == mod.TRAIN_STARTUP_STEPS_EXCLUDED - 1)


def check_schedule_walk(table: Table, mod, tcfg) -> dict:
    """Every step of a `WALK_STEPS`-step K82s4 walk (its step clock): K82s4's rate block against our schedule at
    frac = the progress K82s4 read, step, full batches = micro-batches done / grad_accum."""
    from neuronfrontier.engine.averaging import WeightEma
    from neuronfrontier.engine.optim import apply_schedule, weight_decay_multiplier
    from neuronfrontier.engine.phases import batch_phase, mtp_weights_at
    tables = mod.mtp_weight_tensors(CPU)
    no_groups = SimpleNamespace(param_groups=[])
    dummy = torch.nn.Linear(1, 1)
    ema = WeightEma(dummy, tcfg.ema_decay, tcfg.ema_every, tcfg.ema_prewarm)
    bad = {"k": [], "lr multiplier": [], "Muon momentum": [], "Muon weight decay": [], "MTP weights": [], "EMA": []}
    worst_d = {"lr multiplier": 0.0, "Muon momentum": 0.0, "Muon weight decay": 0.0}
    for row in K.walk(mod, WALK_STEPS):
        s, frac = row["step"], row["progress_read"]
        got = K.step_settings(mod, no_groups, row, {})
        accum, phase_lr = batch_phase(tcfg, frac, s)
        mult, mom = apply_schedule([], tcfg, frac, phase_lr, s, row["accum_micro_done"] / tcfg.grad_accum)
        wd = tcfg.weight_decay * weight_decay_multiplier(frac, tcfg)
        before = ema.updates
        ema.after_step(dummy, s)
        w = torch.tensor(mtp_weights_at(tcfg, frac), dtype=torch.float32)
        if accum != row["k"]:
            bad["k"].append(s)
        for key, a, b in (("lr multiplier", mult, got["lrm"]), ("Muon momentum", mom, got["muon_mom"]),
                          ("Muon weight decay", wd, got["muon_wd"])):
            d = abs(a - b) / abs(b)
            worst_d[key] = max(worst_d[key], d)
            if d > SCALAR_TOL:
                bad[key].append(s)
        if not torch.equal(w, tables[row["mtp_stage"]]):
            bad["MTP weights"].append(s)
        if (ema.updates > before) != k82_ema_updates_after(mod, s):
            bad["EMA"].append(s)
    point = f"all {WALK_STEPS} steps of a walk"
    for key, steps in bad.items():
        note = f"first at step {steps[0]}" if steps else ""
        if key in worst_d:
            table.within("(c) sched", point, f"{key}: max relative difference", worst_d[key], SCALAR_TOL, note)
        else:
            table.equal("(c) sched", point, f"{key}: steps that differ", len(steps), 0, note)
    return {"steps": WALK_STEPS, "differ": bad, "max_rel": worst_d}


def k82_ema_state(mod, k82_run, mcfg) -> dict:
    """K82s4's EMA by our names (its checkpoint_payload with the EMA chosen)."""
    state = mod.checkpoint_payload(k82_run.model, k82_run.ema, True, {})["model_state"]
    return {k: v.float() for k, v in K.to_ours(mod, state, mcfg).items()}


def settled(state82: dict, groups: dict, margin: float = 100.0) -> dict:
    """{AdamW parameter: mask of the elements whose update is determined by its gradients}: after the step, the
    update's denominator √v̂ = √(exp_avg_sq / (1 − β2^t)) is at least `margin` × eps. Where it is not (an element
    whose gradients so far are ~1e-10 or below: AdamW's first step on the residual and x0 scalars at K82s4's init,
    whose gradients are rounding noise because the blocks' outputs start at zero; the head's rows that the loss
    barely reaches), the update g/(|g| + eps) is a ratio of rounding-level numbers, different in any two
    implementations."""
    out = {}
    for name, st in state82.items():
        if "exp_avg_sq" not in st:
            continue
        g = groups[name]
        v_hat = st["exp_avg_sq"].double() / (1 - g["betas"][1] ** float(st["step"]))
        out[name] = v_hat.sqrt() >= margin * g["eps"]
    return out


def flat_state(state: dict) -> dict:
    """{'name.key': tensor} of an optimizer state by our names, step counts left out."""
    return {f"{n}.{k}": v for n, d in state.items() for k, v in d.items() if k != "step"}


class UpdateCheck:
    """(c): K82s4's `Run` and two copies of our model and optimizers (one steps through `train_step` on its own
    gradients, one on K82s4's gradients), set to K82s4's weights and state before each phase point."""

    def __init__(self, table: Table, mod, k82_model, mcfg, tcfg):
        from neuronfrontier.engine.averaging import WeightEma
        from neuronfrontier.engine.model import GPT
        from neuronfrontier.engine.optim import build_optimizers
        self.table, self.mod, self.k82_model, self.mcfg, self.tcfg = table, mod, k82_model, mcfg, tcfg
        self.run = K.Run(mod, k82_model, WALK_STEPS)
        self.ours, self.ours_g = GPT(mcfg, kernels="torch"), GPT(mcfg, kernels="torch")
        init = K.to_ours(mod, k82_model.state_dict(), mcfg)
        for m in (self.ours, self.ours_g):
            m.load_state_dict(init)
            m.train()
        self.opts = build_optimizers(self.ours, tcfg, print_table=False, ns_dtype=torch.float32)
        self.opts_g = build_optimizers(self.ours_g, tcfg, print_table=False, ns_dtype=torch.float32)
        self.ema = WeightEma(self.ours, tcfg.ema_decay, tcfg.ema_every, tcfg.ema_prewarm)
        self.stepped, self.frac = False, 0.0

    def k82_weights(self) -> dict:
        """K82s4's weights now, by our names."""
        return K.to_ours(self.mod, self.k82_model.state_dict(), self.mcfg)

    def sync(self) -> None:
        """Both our copies: K82s4's weights, and its optimizer state once it has one (after its first step)."""
        weights = self.k82_weights()
        state = K.state_to_ours(self.mod, self.run, self.mcfg) if self.stepped else None
        for m, o in ((self.ours, self.opts), (self.ours_g, self.opts_g)):
            m.load_state_dict(weights)
            if state is not None:
                set_our_state(m, o, state)

    def point(self, name: str, step: int, progress: float, done: int, feed) -> dict:
        """One phase point: sync, one step on each side on the next k micro-batches of `feed`, every comparison."""
        from neuronfrontier.run.trainer import train_step
        t0 = time.time()
        self.sync()
        self.run.at(step, progress, done)
        micro = list(itertools.islice(feed, self.run.micro_batches_needed()))
        losses = self.run.gradients(micro)
        g82 = K.to_ours(self.mod, {n: p.grad if p.grad is not None else torch.zeros_like(p)
                                   for n, p in self.k82_model.named_parameters()}, self.mcfg, grads=True)
        got = self.run.optimizer_step()
        self.stepped, self.frac = True, progress
        full = done / self.tcfg.grad_accum
        rows = iter([(x.long(), y) for x, y in micro])
        loss = float(train_step(self.ours, self.opts, rows, self.tcfg, progress, CPU, step=step, full_batches=full))
        self.ema.after_step(self.ours, step)
        our_step_on(self.ours_g, self.opts_g, g82, self.tcfg, progress, step, full)
        rec = {"step": step, "progress": progress, "accum_micro_done": done,
               **{k: got[k] for k in ("k", "lrm", "muon_mom", "muon_wd", "mtp_stage", "applied_level")},
               **self.check_scalars(name, step, progress, got, losses, loss)}
        rec |= self.check_weights(name)
        if k82_ema_updates_after(self.mod, step):
            rec |= self.check_ema(name)
        rec["seconds"] = round(time.time() - t0, 1)
        return rec

    def check_scalars(self, name: str, step: int, frac: float, got: dict, losses: list, loss: float) -> dict:
        """The step's k, the rate block's lrm / Muon momentum / Muon decay, the MTP weights, every parameter's
        lr / decay / momentum or betas / eps, and the loss (ours × Σw: train_step returns it per unit of weight)."""
        from neuronfrontier.engine.optim import lr_multiplier
        from neuronfrontier.engine.phases import batch_phase, mtp_weights_at
        t, tcfg = self.table, self.tcfg
        accum, phase_lr = batch_phase(tcfg, frac, step)
        lrm = lr_multiplier(frac, tcfg) * phase_lr
        muon = self.opts[0].param_groups[0]
        mtp = mtp_weights_at(tcfg, frac)
        t.equal("(c) update", name, "micro-batches k", accum, got["k"])
        scal = max(abs(lrm - got["lrm"]) / got["lrm"], abs(muon["momentum"] - got["muon_mom"]),
                   abs(muon["weight_decay"] - got["muon_wd"]) / got["muon_wd"])
        t.within("(c) update", name, f"lrm {got['lrm']:.4g}, mom {got['muon_mom']:.5f}, wd: max Δ", scal, SCALAR_TOL)
        t.equal("(c) update", name, f"MTP weights (stage {got['mtp_stage']})",
                torch.tensor(mtp, dtype=torch.float32).tolist(), self.run.mtp_ws[got["mtp_stage"]].tolist())
        h_d, h_name = max_hyper_diff(hyper(our_groups(self.ours, self.opts)),
                                     hyper(k82_groups(self.mod, self.k82_model, self.run.optimizer, self.mcfg)))
        t.within("(c) update", name, f"per-parameter lr/wd/betas/eps worst {h_name}", h_d, SCALAR_TOL)
        ours_loss = loss * sum(mtp)
        l82 = sum(losses) / len(losses)
        t.within("(c) update", name, f"loss (K82s4 {l82:.5f}) relative", abs(ours_loss - l82) / abs(l82), LOSS_TOL)
        return {"k82_losses": losses, "our_loss": ours_loss}

    def check_weights(self, name: str) -> dict:
        """Weights after the step (ours on our gradients, ours on K82s4's) and our optimizer state against K82s4's.
        On our own gradients AdamW's unsettled elements (`settled`) are left out, counted in the note, and their
        difference shown in a row of its own; on K82s4's gradients every element counts."""
        t = self.table
        after = self.k82_weights()
        ours = dict(self.ours.state_dict())
        st82 = K.state_to_ours(self.mod, self.run, self.mcfg)
        st = our_state(self.ours, self.opts)
        keep = settled(st82, our_groups(self.ours, self.opts))
        left = {n: int((~m).sum()) for n, m in keep.items() if not m.all()}
        note = ("left out, unsettled AdamW elements: " + ", ".join(f"{n} {c}" for n, c in left.items())) if left else ""
        w_d, w_name = worst(ours, after, keep=keep)
        g_d, g_name = worst(dict(self.ours_g.state_dict()), after)
        t.within("(c) update", name, f"weights ‖Δ‖/‖w‖ worst {w_name}", w_d, WEIGHT_TOL, note)
        t.within("(c) update", name, f"weights, K82s4's grads: worst {g_name}", g_d, WEIGHT_TOL)
        state_keep = {f"{n}.{k}": m for n, m in keep.items() for k in ("exp_avg", "exp_avg_sq")}
        s_d, s_name = worst(flat_state(st), flat_state(st82), keep=state_keep)
        t.within("(c) update", name, f"optimizer state worst {s_name}", s_d, STATE_TOL, note)
        counts = (sorted({int(d["step"]) for d in st.values() if "step" in d}),
                  sorted({int(d["step"]) for d in st82.values() if "step" in d}))
        t.equal("(c) update", name, "AdamW step counts", *counts)
        rec = {"weights_worst": [w_d, w_name], "weights_k82_grads_worst": [g_d, g_name],
               "state_worst": [s_d, s_name], "unsettled_elements": left}
        if left:
            u_d, u_name = worst({n: ours[n] for n in left}, {n: after[n] for n in left},
                                keep={n: ~keep[n] for n in left})
            t.add("(c) update", name, f"unsettled elements only: worst {u_name}", u_d, "n/a", True,
                  "not compared: √v̂ < 100·eps, the update is a ratio of rounding-level numbers")
            rec["unsettled_worst"] = [u_d, u_name]
        return rec

    def check_ema(self, name: str) -> dict:
        """After a step that updates the EMA: the update counts and the averages."""
        e_d, e_name = worst(dict(self.ema.state["weights"]), k82_ema_state(self.mod, self.run, self.mcfg))
        self.table.equal("(c) update", name, "EMA updates so far", self.ema.updates, self.run.ema_steps)
        self.table.within("(c) update", name, f"EMA weights worst {e_name}", e_d, WEIGHT_TOL)
        return {"ema_worst": [e_d, e_name]}


def check_updates(table: Table, mod, k82_model, mcfg, tcfg, batches) -> dict:
    """(c): the phase points of `POINTS` in order, then the saved weights. Returns what each point measured."""
    check = UpdateCheck(table, mod, k82_model, mcfg, tcfg)
    feed = iter(batches)
    out = {name: check.point(name, step, progress, done, feed) for name, step, progress, done in POINTS}
    out["saved weights"] = check_saved(table, mod, check.run, check.ours, check.ema, mcfg, tcfg, check.frac)
    return out


def our_saved(ema, model, tcfg, frac: float):
    """(kind, state) our `train.finish` saves after a last step at `frac`: the EMA alone when the rate there is above
    `ema_pure_above` (finish's rule, restated), else the blend; `averaging.blend_for_save` decides the rest."""
    from neuronfrontier.engine.averaging import blend_for_save
    from neuronfrontier.engine.optim import lr_multiplier
    pure = bool(tcfg.ema_pure_above) and lr_multiplier(frac, tcfg) > tcfg.ema_pure_above
    m = copy.deepcopy(model)
    e = copy.deepcopy(ema)
    raw = blend_for_save(e, m, tcfg.ema_blend, "completed", say=lambda *a, **k: None, pure=pure)
    kind = "trained" if raw is None else "ema" if pure else f"blend:{tcfg.ema_blend:g}"
    return kind, {n: v.float() for n, v in m.state_dict().items()}


def check_saved(table: Table, mod, run, ours, ema, mcfg, tcfg, last_frac: float) -> dict:
    """The saved weights under K82s4's rule (`Run.final_weights`) and ours, after the last point: the last step at a
    cooldown level <= 3 (the blend) and above it (the pure EMA), each with a mature EMA and with the young one the
    points left (K82s4 saves the pure EMA however young it is)."""
    out = {}
    true_updates = (run.ema_steps, ema.updates)
    level_frac = {run.applied_level: last_frac, 11: 0.6}
    cases = [(lvl, n) for lvl in level_frac for n in (MATURE_EMA, true_updates[0])]
    for level, updates in cases:
        point = f"level {level}, {updates} EMA updates"
        saved_level = run.applied_level
        run.applied_level = level
        run.ema_steps = updates
        ema.state["updates"] = updates
        kind82, state82 = run.final_weights()
        kind, state = our_saved(ema, ours, tcfg, level_frac[level])
        run.applied_level = saved_level
        note = ""
        young = mod.EMA_DECAY_EFF ** updates > mod.EMA_BLEND_MAX_INIT
        if kind82 == "ema" and young:
            # declared (docs/k82s4.md): K82s4's 10% rule for its blend guards our pure EMA too, so a run cut before
            # its EMA matures saves the trained weights; compared with K82s4's trained weights
            kind82 = "trained"
            state82 = mod.checkpoint_payload(run.model, run.ema, False, {})["model_state"]
            note = "declared choice: K82s4 saves this young EMA (its 10% rule guards only the blend); ours does not"
        d, n = worst(state, {k: v.float() for k, v in K.to_ours(mod, state82, mcfg).items()})
        table.equal("(c) saved", point, "which weights", kind, kind82, note)
        table.within("(c) saved", point, f"saved weights worst {n}", d, WEIGHT_TOL)
        out[point] = {"k82": kind82, "ours": kind, "worst": [d, n], "declared": bool(note)}
    run.ema_steps, ema.state["updates"] = true_updates
    return out


# ---------------------------------------------------------------------------------------------------------------------
# (d) end to end
# ---------------------------------------------------------------------------------------------------------------------
def check_e2e(table: Table, path: Path) -> dict | None:
    """(d): k82_e2e.py's result: each seed's val_bpb both sides, the means, their difference, the pooled standard
    error; passes when |difference| < 2·SE. A missing file is a failed row ("(d) not run")."""
    if not path.exists():
        print("(d) not run")
        table.add("(d) e2e", str(path), "e2e.json", "missing", "exists", False, "(d) not run")
        return None
    res = json.loads(path.read_text())
    per_seed = {}
    for f in sorted(path.parent.glob("*-seed*.json")):
        r = json.loads(f.read_text())
        per_seed.setdefault(r["seed"], {})[r["recipe"]] = r["val_bpb"]
    for seed, v in sorted(per_seed.items()):
        shown = f"{v.get('k82s4', float('nan')):.4f}/{v.get('ours', float('nan')):.4f}"
        table.add("(d) e2e", f"seed {seed}", "val_bpb K82s4 / ours", shown, "", True)
    k, o = res["k82s4"], res["ours"]
    diff = o["mean"] - k["mean"]
    se = math.sqrt(o["sd"] ** 2 / o["n"] + k["sd"] ** 2 / k["n"])
    table.add("(d) e2e", f"{k['n']}+{o['n']} seeds × {res['steps']} steps",
              f"means K82s4 {k['mean']:.4f}, ours {o['mean']:.4f}", "", "", True)
    table.add("(d) e2e", "difference ours − K82s4", f"|diff| < 2·SE (SE {se:.4f})", diff, f"{2 * se:.2e}",
              abs(diff) < 2 * se)
    return {**res, "per_seed": per_seed, "difference": diff, "pooled_se": se, "passed": abs(diff) < 2 * se}


def summary(table: Table, e2e: dict | None, date: str) -> str:
    """The one line `calibration.parity_status` prints: how many rows pass, of which checks, and (d)'s numbers."""
    n_pass = sum(r["passed"] for r in table.rows)
    verdict = "parity shown" if n_pass == len(table.rows) else "parity NOT shown"
    checks = sorted({r["check"].split()[0] for r in table.rows if not r["passed"]})
    tail = f"; failing: {' '.join(checks)}" if checks else ""
    e = ("(d) not run" if e2e is None else
         f"(d) {e2e['ours']['n']} seeds x {e2e['steps']} steps, val_bpb ours - K82s4 {e2e['difference']:+.4f} "
         f"(2 SE {2 * e2e['pooled_se']:.4f})")
    return (f"{verdict} on CPU {date[:10]}: {n_pass}/{len(table.rows)} rows of benchmarks/k82_parity.py (rows, "
            f"forward, update, end to end) pass against K82s4 @ {K.K82_COMMIT[:8]}; {e}{tail}")


# ---------------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k82", type=Path, required=True, help="K82s4's train.py (recipes/K82s4/train.py @ d4c751e5)")
    ap.add_argument("--e2e", type=Path, default=Path("/tmp/k82_e2e/e2e.json"), help="k82_e2e.py's result")
    ap.add_argument("--out", type=Path, default=Path("nbs/results/k82_parity.json"))
    ap.add_argument("--data", type=Path, default=K.DEFAULT_DATA, help="shards + tokenizer/ (the stand-in's cache)")
    a = ap.parse_args(argv)
    os.environ["NEURON_COMPETITION_R1_CACHE_DIR"] = str(a.data)
    torch.manual_seed(0)
    t_all = time.time()
    mod = K.load(a.k82)
    tok = K.tokenizer(mod)
    mcfg, tcfg = our_configs(1)
    if tcfg.grad_accum * tcfg.batch_size * mcfg.seq_len != mod.TOTAL_BATCH_SIZE:
        raise SystemExit(f"shape mismatch: ours {tcfg.grad_accum}×{tcfg.batch_size}×{mcfg.seq_len} tokens a step, "
                         f"K82s4 {mod.TOTAL_BATCH_SIZE}")
    table = Table()
    seconds, result = {}, {}
    t = time.time()
    result["rows"] = check_rows(table, mod, tok, a.data)
    seconds["rows"] = round(time.time() - t, 1)
    batches = K.rows(mod, tok, 0, 1, 1 + sum(K.schedule_point(mod, s, p)["k"] for _, s, p, _ in POINTS))
    k82_model = K.model(mod, mod.SEED, tok)
    from neuronfrontier.engine.model import GPT
    ours = GPT(mcfg, kernels="torch")
    ours.load_state_dict(K.to_ours(mod, k82_model.state_dict(), mcfg))
    t = time.time()
    result["forward"] = check_forward(table, mod, k82_model, ours, mcfg, tcfg, batches[0])
    seconds["forward"] = round(time.time() - t, 1)
    t = time.time()
    result["schedule"] = check_schedule_walk(table, mod, tcfg)
    result["update"] = check_updates(table, mod, k82_model, mcfg, tcfg, batches[1:])
    seconds["update"] = round(time.time() - t, 1)
    seconds["a_to_c"] = round(time.time() - t_all, 1)
    result["e2e"] = check_e2e(table, a.e2e)
    failed = [r for r in table.rows if not r["passed"]]
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record = {"summary": summary(table, result["e2e"], date), "k82_commit": K.K82_COMMIT, "k82_path": str(a.k82),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "date": date, "shape": SHAPE, "our_sets": list(OUR_SETS),
              "seconds": seconds, "passed": not failed, "failed": len(failed), "table": table.rows, **result}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=1, default=str))
    print(f"{len(table.rows) - len(failed)}/{len(table.rows)} rows pass; (a)-(c) took {seconds['a_to_c']:.0f} s; "
          f"written to {a.out}")
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
