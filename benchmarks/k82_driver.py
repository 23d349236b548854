#!/usr/bin/env python
"""Drive FrontierForge's K82s4 `train.py` on a CPU at a small shape, for the parity benchmark (k82_parity.py).

K82s4 is `recipes/K82s4/train.py` of marker2601/trainium-simulator at commit d4c751e5f5f8fee915ab70c88d0d05701a3f0727
(252,013 characters; docs/k82s4.md reads it line by line, "l.N" below is a line of that file). None of its code is in
this repository: `load` reads the file from a path given at run time, applies the few textual patches in `PATCHES`
(each must match exactly once) to the text in memory, and runs it as a module whose `prepare` is our stand-in
`neuronfrontier.submission.kit_prepare`. Everything else calls K82s4's own functions and classes.

    python benchmarks/k82_driver.py /path/to/K82s4/train.py --steps 40 --out /tmp/k82run   # `train`, then scores it

The small shape (`SMALL`): depth 4, width 256 (4 query heads of 64 on one K/V head), MLP 4·d, 256-token rows,
8 rows a micro-batch, 8,192 tokens a step (4 micro-batches, the chip's k = 4), attention source "2:3", fp32 on the
CPU, no compile, the sharded optimisers off, one process. K82s4 puts its one value-embedding table into blocks 0 and
n_layer − 1 (l.1800–1805: min(FF_VALUE_EMBED = 1, n_layer // 2) tables, table j into blocks j and
n_layer − n_ve + j), so blocks 0 and 3 here, as our `trn2` shape's ve_layers "0,L-1".
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
K82_COMMIT = "d4c751e5f5f8fee915ab70c88d0d05701a3f0727"
K82_CHARS = 252_013
K82_MARKERS = (
    "FrontierForge training script",
    "def make_stream_dataloader(tokenizer, batch_size: int, seq_len: int, device):",
    "def cooldown_level(progress: float) -> int:",
    "class MuonAdamW(torch.optim.Optimizer):",
    'ATTN_SRC_RAW = os.environ.get("FF_ATTN_SRC", "5:6,7,8")',
    'ACCUM_SCHED_RAW = os.environ.get("FF_ACCUM_SCHED", "1:0.06,2:0.2,4").strip()',
)
SMALL = dict(depth=4, width=256, head_dim=64, seq_len=256, micro_batch=8, total_batch=8192, attn_src="2:3", seed=73)
DEFAULT_DATA = ROOT / "data" / "cache" / "pydocs"
MODULE_NAME = "k82s4_train"


# ---------------------------------------------------------------------------------------------------------------------
# Patches to K82s4's text. Each: (name, anchor, replacement, why). The anchor must occur exactly once.
# The step-clock patches are inert unless the driver sets `_K82_STEPS` > 0 in the module (only `train` does).
# ---------------------------------------------------------------------------------------------------------------------
def _patches(seq_len: int) -> list[tuple[str, str, str, str]]:
    """The textual patches `load` applies, in order (all line-count preserving, so tracebacks keep K82s4's l.N)."""
    return [
        ("seq_len", "\nSEQ_LEN = 1024\n", f"\nSEQ_LEN = {int(seq_len)}\n",
         "SEQ_LEN is a constant (l.84) and FF_TRAIN_SEQ is a diagnostic probe that refuses to save (l.1203-1240); "
         "the small shape needs 256-token rows, RoPE tables and evaluation"),
        ("step clock", "        charged = time.monotonic() - budget_started\n",
         "        charged = _k82_charged(step) if _K82_STEPS else time.monotonic() - budget_started\n",
         "the schedule clock (l.4551): progress = charged steps / charged steps of the run, read where main() reads "
         "its charged seconds, as ffsim/gpu/make_train_gpu.py's P25 replaces the same line with its virtual clock"),
        ("no time stop", "                reached_min_steps\n                and (\n"
                         "                    charged >= TIME_TARGET_SECONDS\n",
         "                reached_min_steps and not _K82_STEPS\n                and (\n"
         "                    charged >= TIME_TARGET_SECONDS\n",
         "with the step clock the run stops at --num-steps only (l.4555-4563), as make_train_gpu.py's P26 pins it"),
    ]


# Where main() sets a step's rates (l.4393-4463) and where it ends: `step_settings` runs that text.
_SETTINGS_FROM = ('        if SCHEDULE == "time":\n'
                  "            lrm = (step + 1) / WARMUP_STEPS if step < WARMUP_STEPS else (\n")
_SETTINGS_TO = "        if HOST_TIMES:\n            _t_opt = time.monotonic()\n"
_SETTINGS_ARGS = ("step, next_level, next_level_a, step_k, grad_accum_steps, accum_micro_done, lr_cache, device, "
                  "optimizer")


class K82Error(RuntimeError):
    """A file that is not K82s4's, or a patch whose anchor moved."""


def check_source(text: str, path) -> None:
    """Fail in one line unless `text` looks like K82s4's train.py (its size and a few of its definitions)."""
    missing = [m for m in K82_MARKERS if m not in text]
    if missing:
        raise K82Error(f"{path}: not K82s4's train.py (missing {missing[0]!r})")
    if len(text) != K82_CHARS:
        raise K82Error(f"{path}: {len(text):,} characters, K82s4's train.py @ {K82_COMMIT[:8]} has {K82_CHARS:,}")


def patched_source(text: str, seq_len: int) -> str:
    """K82s4's text with `_patches` applied, and main()'s rate block appended as a function (`_k82_step_settings`)."""
    for name, anchor, new, _why in _patches(seq_len):
        n = text.count(anchor)
        if n != 1:
            raise K82Error(f"patch {name!r}: its anchor occurs {n} times in K82s4's text, expected once")
        text = text.replace(anchor, new)
    a, b = text.find(_SETTINGS_FROM), text.find(_SETTINGS_TO)
    if a < 0 or b < a:
        raise K82Error("main()'s per-step rate block (l.4393-4463) was not found")
    body = "".join("    " + line[8:] + "\n" for line in text[a:b].splitlines())
    ret = ("    return dict(lrm=lrm, lrm_a=lrm_a, applied_level=applied_level, muon_wd=muon_wd, muon_mom=muon_mom,\n"
           "                accum_lr=accum_lr, lr_t=lr_t, lr_t_a=lr_t_a)\n")
    return text + f"\n\ndef _k82_step_settings({_SETTINGS_ARGS}):\n" + body + ret


# ---------------------------------------------------------------------------------------------------------------------
# prepare: our stand-in, with the kit's private _document_batches where the stand-in lacks it
# ---------------------------------------------------------------------------------------------------------------------
def document_batches(split: str, rank: int, world: int, tokenizer_batch_size: int = 128):
    """(texts, epoch): this rank's share of the split's row groups (every world-th, as the stand-in's `_documents`
    takes them), each row group's texts in chunks of `tokenizer_batch_size`; training cycles, epochs from 0."""
    import pyarrow.parquet as pq
    from neuronfrontier.submission import kit_prepare
    groups = [(p, g) for p in kit_prepare._shards(split) for g in range(pq.ParquetFile(p).num_row_groups)]
    epoch = 0
    while True:
        for k, (p, g) in enumerate(groups):
            if k % world != rank and len(groups) >= world:
                continue
            texts = pq.ParquetFile(p).read_row_group(g, columns=["text"]).column("text").to_pylist()
            for i in range(0, len(texts), tokenizer_batch_size):
                yield texts[i:i + tokenizer_batch_size], epoch
        if split != "train":
            return
        epoch += 1


def prepare_module() -> types.ModuleType:
    """A module named `prepare` holding the stand-in's names; its own `_document_batches` when it has one."""
    from neuronfrontier.submission import kit_prepare
    mod = types.ModuleType("prepare")
    mod.__dict__.update({k: v for k, v in vars(kit_prepare).items() if not k.startswith("__")})
    mod.__file__ = kit_prepare.__file__
    if not hasattr(kit_prepare, "_document_batches"):
        mod._document_batches = document_batches
    return mod


# ---------------------------------------------------------------------------------------------------------------------
# 1. load
# ---------------------------------------------------------------------------------------------------------------------
def shape_env(depth=4, width=256, head_dim=64, seq_len=256, micro_batch=8, total_batch=8192, attn_src="2:3",
              seed=73) -> dict:
    """The FF_* environment for one CPU process at a shape (docs/k82s4.md "Running K82s4 on a CPU")."""
    if width % depth or width % head_dim:
        raise ValueError(f"width {width} must be a multiple of depth {depth} and head_dim {head_dim}")
    return {"FF_DEPTH": str(depth), "FF_ASPECT_RATIO": str(width // depth), "FF_HEAD_DIM": str(head_dim),
            "FF_ATTN_SRC": attn_src, "FF_MB": str(micro_batch), "FF_TOTAL_BATCH": str(total_batch),
            "FF_SEED": str(seed), "FF_MUON_ZERO": "0", "FF_MUON_ZERO2": "0", "FF_ADAMW_ZERO": "0",
            "FF_ACC_IN_GRAPH": "0", "NEURON_COMPETITION_R1_COMPILE": "0",
            "NEURON_COMPETITION_R1_CACHE_DIR": os.environ.get("NEURON_COMPETITION_R1_CACHE_DIR", str(DEFAULT_DATA))}


def load(path, **shape) -> types.ModuleType:
    """K82s4's train.py at `path`, imported as a module at `shape` (SMALL's keys; SMALL by default) for the CPU:
    FF_* set, SEQ_LEN patched, `prepare` our stand-in, its compute dtype fp32 (as main() sets it for a CPU, l.4070).
    Module-level settings are read at import, so each shape needs its own `load`."""
    shape = {**SMALL, **shape}
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    check_source(text, path)
    os.environ.update(shape_env(**shape))
    sys.modules["prepare"] = prepare_module()
    mod = types.ModuleType(MODULE_NAME)
    mod.__file__ = str(path)
    mod._K82_STEPS = 0
    mod._k82_charged = None
    sys.modules[MODULE_NAME] = mod
    exec(compile(patched_source(text, shape["seq_len"]), str(path), "exec"), mod.__dict__)
    mod.COMPUTE_DTYPE = torch.float32
    mod._k82_shape = shape
    return mod


@contextlib.contextmanager
def as_rank(mod, rank: int, world: int):
    """K82s4's get_dist_info (its module global, from prepare) reports `rank` of `world` inside the block."""
    saved = mod.get_dist_info
    mod.get_dist_info = lambda: (world > 1, rank, rank, world)
    try:
        yield
    finally:
        mod.get_dist_info = saved


def tokenizer(mod):
    """K82s4's tokenizer: prepare.ensure_tokenizer, as main() gets it (l.4085)."""
    return mod.ensure_tokenizer(build_if_missing=False)


# ---------------------------------------------------------------------------------------------------------------------
# 2. rows
# ---------------------------------------------------------------------------------------------------------------------
def rows(mod, tok, rank: int = 0, world: int = 1, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first `n` micro-batches (x int32, y int64 with BOS targets -1) that K82s4's make_stream_dataloader
    (l.3664-3735) yields to `rank` of `world`: 8 streams, the rolling row shuffle from yield 96, its defaults."""
    out = []
    with as_rank(mod, rank, world):
        loader = mod.make_stream_dataloader(tok, mod.DEVICE_BATCH_SIZE, mod.TRAIN_SEQ, torch.device("cpu"))
        for _ in range(n):
            x, y, _state = next(loader)
            out.append((x.clone(), y.clone()))   # the loader reuses one pair of tensors
    return out


# ---------------------------------------------------------------------------------------------------------------------
# 3. model, to_ours, from_ours
# ---------------------------------------------------------------------------------------------------------------------
def model(mod, seed: int | None = None, tok=None):
    """K82s4's GPT as main() makes it (l.4070-4130): torch.manual_seed(seed) (init_runtime, l.166), build_config()
    with the tokenizer's BOS, GPT(config) (whose nn layers draw from the RNG too), init_weights(); fp32 on the CPU."""
    seed = mod.SEED if seed is None else seed
    torch.manual_seed(seed)
    config = mod.build_config()
    config.bos_id = (tok or tokenizer(mod)).get_bos_token_id()
    m = mod.GPT(config)
    m.init_weights()
    return m


def our_config(**sets):
    """Our trn2 model at the small shape: resolve("cpu-tiny", recipe="trn2") with d_model 256, 4 layers, T 256."""
    from neuronfrontier.engine.config import resolve
    base = dict(d_model=256, n_layers=4, seq_len=256, eval_seq_len=256) | sets
    return resolve("cpu-tiny", recipe="trn2", sets=[f"{k}={v}" for k, v in base.items()])[0]


def _flip_rope(w: torch.Tensor, d_head: int) -> torch.Tensor:
    """Negate the second half of every head's rows: K82s4 rotates by −θ (l.1565-1570), we by +θ."""
    w = w.clone()
    h = w.view(-1, d_head, *w.shape[1:])
    h[:, d_head // 2:] *= -1
    return w


def _k82_names(n_layer: int, ve_layers) -> dict:
    """{our name: K82s4's name or list of names} for the per-tensor parameters."""
    names = {"wte.weight": "transformer.wte.weight", "lm_head.weight": "lm_head.weight",
             "value_embeds.0.weight": "value_embeds.0.weight",
             "resid_lambdas": [f"transformer.h.{i}.resid_lambda" for i in range(n_layer)],
             "x0_lambdas": [f"transformer.h.{i}.x0_lambda" for i in range(n_layer)]}
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        b = f"blocks.{i}."
        names |= {b + "attn.wq.weight": h + "attn.c_q.weight", b + "attn.wk.weight": h + "attn.c_k.weight",
                  b + "attn.wv.weight": h + "attn.c_v.weight", b + "attn.wo.weight": h + "attn.c_proj.weight",
                  b + "mlp.w_up.weight": h + "mlp.c_fc.weight", b + "mlp.w_down.weight": h + "mlp.c_proj.weight"}
    for i in ve_layers:
        names[f"blocks.{i}.attn.ve_mix"] = [f"transformer.h.{i}.attn.ve_a", f"transformer.h.{i}.attn.ve_b"]
    return names


def _ours_meta(our_cfg) -> dict:
    """Our model's state_dict (name -> tensor on the meta device): names, shapes and dtypes."""
    from neuronfrontier.engine.model import GPT
    with torch.device("meta"):
        return GPT(our_cfg).state_dict()


def to_ours(mod, k82_state: dict, our_cfg, grads: bool = False) -> dict:
    """K82s4's state_dict (or gradients by its names) -> our model's names, shapes and dtypes: the RoPE flip on wq/wk,
    per-block resid/x0 scalars stacked, ve_a/ve_b into ve_mix. Fails if a name on either side is left over."""
    ours = _ours_meta(our_cfg)
    n_layer = our_cfg.n_layers
    ve = sorted({int(k.split(".")[1]) for k in ours if k.endswith("attn.ve_mix")})
    names = _k82_names(n_layer, ve)
    d_head = k82_state["transformer.h.0.attn.c_q.weight"].shape[0] // (our_cfg.d_model // our_cfg.d_head)
    out, used = {}, set()
    for ours_name, meta in ours.items():
        src = names.get(ours_name)
        if src is None:
            raise K82Error(f"to_ours: our {ours_name} has no K82s4 counterpart")
        srcs = src if isinstance(src, list) else [src]
        t = torch.stack([k82_state[s].reshape(()) for s in srcs]) if isinstance(src, list) else k82_state[src]
        used.update(srcs)
        if ours_name.endswith(("attn.wq.weight", "attn.wk.weight")):
            t = _flip_rope(t, d_head)
        if tuple(t.shape) != tuple(meta.shape):
            raise K82Error(f"to_ours: {ours_name} {tuple(meta.shape)} <- {src} {tuple(t.shape)}")
        out[ours_name] = t.detach().to(torch.float32 if grads else meta.dtype).clone()
    left = sorted(set(k82_state) - used)
    if left:
        raise K82Error(f"to_ours: K82s4's {left[:3]} has no name of ours")
    return out


def from_ours(mod, our_state: dict, k82_model) -> dict:
    """Our state_dict -> K82s4's (fp32, its shapes), the inverse of `to_ours` (the RoPE flip is its own inverse)."""
    ref = k82_model.state_dict()
    d_head = k82_model.config.n_embd // k82_model.config.n_head
    out = {}
    for ours_name, t in our_state.items():
        src = _k82_names(k82_model.config.n_layer, range(k82_model.config.n_layer)).get(ours_name)
        if ours_name.endswith(("attn.wq.weight", "attn.wk.weight")):
            t = _flip_rope(t, d_head)
        if isinstance(src, list):
            for j, s in enumerate(src):
                out[s] = t[j].detach().float().reshape(ref[s].shape).clone()
        else:
            out[src] = t.detach().float().reshape(ref[src].shape).clone()
    missing = sorted(set(ref) - set(out))
    if missing:
        raise K82Error(f"from_ours: K82s4's {missing[:3]} got no value")
    return out


def load_into(k82_model, state: dict) -> None:
    """Copy a K82s4 state_dict into the model in place (keeps the optimizer's view buffers, l.2937-2968)."""
    with torch.no_grad():
        for name, p in k82_model.state_dict(keep_vars=True).items():
            p.copy_(state[name].reshape(p.shape))


# ---------------------------------------------------------------------------------------------------------------------
# 4. loss_and_grads
# ---------------------------------------------------------------------------------------------------------------------
def mtp_weights(mod, progress: float, excluded_reached: bool = True) -> torch.Tensor:
    """The fp32 [3] MTP weights K82s4 trains with after a clock reading of `progress` (l.4581, 4604-4611):
    mtp_weight_tensors()[mtp_stage_of(progress)], stage 0 before the kit's excluded steps."""
    stage = mod.mtp_stage_of(progress) if (mod.MTP and excluded_reached) else 0
    return mod.mtp_weight_tensors(torch.device("cpu"))[stage]


def loss_and_grads(mod, k82_model, x, y, progress: float = 0.0, our_cfg=None, seed_scale: float = 1.0):
    """(loss, grads) of one micro-batch at a schedule point: loss = model(x, y, mtp_w=...) as the loop calls it
    (l.4349), the fused MTP head's Σ_k w_k·CE_k over valid targets ÷ valid next-token targets; grads of every
    parameter from loss.backward(seed) with seed = ones·seed_scale (the loop uses 1/k, l.4360: pass 1/k for its
    bits). Grads by K82s4's names, or ours (RoPE flip on wq/wk) when `our_cfg` is given."""
    k82_model.zero_grad(set_to_none=True)
    loss = k82_model(x, y, mtp_w=mtp_weights(mod, progress))
    loss.backward(gradient=torch.full_like(loss, seed_scale) if seed_scale != 1.0 else None)
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in k82_model.named_parameters()}
    k82_model.zero_grad(set_to_none=True)
    if our_cfg is not None:
        grads = to_ours(mod, grads, our_cfg, grads=True)
    return float(loss.detach()), grads


# ---------------------------------------------------------------------------------------------------------------------
# 5. the schedule, one optimizer step, the EMA
# ---------------------------------------------------------------------------------------------------------------------
def step_progress(mod, step: int, steps: int) -> float:
    """The step clock after (0-based) step `step` of a `steps`-step run, as charged / TIME_TARGET_SECONDS:
    charged steps (those from the kit's TRAIN_STARTUP_STEPS_EXCLUDED on, like the charged seconds, l.4540-4551)
    over the run's charged steps, so the last step ends at 1."""
    return step_charged(mod, step, steps) / mod.TIME_TARGET_SECONDS


def step_charged(mod, step: int, steps: int) -> float:
    """The charged seconds the step clock reports after step `step` (what the patched l.4551 reads)."""
    e = mod.TRAIN_STARTUP_STEPS_EXCLUDED
    return mod.TIME_TARGET_SECONDS * max(0, step + 1 - e) / max(1, steps - e)


def walk(mod, steps: int, progress=None) -> list[dict]:
    """Every step's schedule in a `steps`-step run, replaying main()'s bookkeeping (l.4316-4317, 4549-4647) with
    K82s4's own cooldown_level / mtp_stage_of / accum_phase_of / accum_k_of. `progress(step)` is the clock after
    a step (default: the step clock). A reading after step s takes effect at step s + 1 (the control tensor)."""
    progress = progress or (lambda s: step_progress(mod, s, steps))
    k_final = mod.TOTAL_BATCH_SIZE // (mod.DEVICE_BATCH_SIZE * mod.TRAIN_SEQ)
    phase = mod.accum_phase_of(0, 0.0) if mod.ACCUM_ON else 0
    k, level, stage, done, read = mod.accum_k_of(phase, k_final), 20, 0, 0, 0.0
    out = []
    for s in range(steps):
        out.append(dict(step=s, progress_read=read, next_level=level, mtp_stage=stage, accum_phase=phase, k=k,
                        accum_micro_done=done, grad_accum_steps=k_final))
        reached = s + 1 >= mod.TRAIN_STARTUP_STEPS_EXCLUDED
        read = progress(s) if reached else 0.0
        level = mod.cooldown_level(read) if reached else 20
        stage = mod.mtp_stage_of(read) if (mod.MTP and reached) else 0
        new_phase = mod.accum_phase_of(s + 1, read) if mod.ACCUM_ON else 0
        if mod.ACCUM_ON and new_phase > phase:
            phase, k = new_phase, mod.accum_k_of(new_phase, k_final)
        done += out[-1]["k"]
    return out


def schedule_point(mod, step: int, progress: float, accum_micro_done: int | None = None) -> dict:
    """One schedule row without a walk: step `step` after a clock reading of `progress` (the reading after step
    − 1, which is 0 inside the kit's excluded steps); accum_micro_done defaults to `step` full batches."""
    k_final = mod.TOTAL_BATCH_SIZE // (mod.DEVICE_BATCH_SIZE * mod.TRAIN_SEQ)
    reached = step >= mod.TRAIN_STARTUP_STEPS_EXCLUDED
    read = progress if reached else 0.0
    phase = mod.accum_phase_of(step, read) if mod.ACCUM_ON else 0
    return dict(step=step, progress_read=read, next_level=mod.cooldown_level(read) if reached else 20,
                mtp_stage=mod.mtp_stage_of(read) if (mod.MTP and reached) else 0, accum_phase=phase,
                k=mod.accum_k_of(phase, k_final), grad_accum_steps=k_final,
                accum_micro_done=step * k_final if accum_micro_done is None else accum_micro_done)


def _assumed_defaults(mod) -> None:
    """The flags whose defaults `optimizer_step` and `Run` rely on (the loop's other branches are not replayed)."""
    off = dict(ASYNC_LOOP=mod.ASYNC_LOOP, COMPILE_OPT=mod.COMPILE_OPT, M17_ON=mod.M17_ON, LATE_K=mod.LATE_K,
               ADAMW_WU=mod.ADAMW_WU, LIT=mod.LIT, MOM_CD_LEVELS=mod.MOM_CD_LEVELS, LATE_FETCH=mod.LATE_FETCH,
               GRAD_CLIP=mod.GRAD_CLIP, MUON_ZERO=mod.MUON_ZERO, ADAMW_ZERO=mod.ADAMW_ZERO,
               STAGE_LOADER=mod.STAGE_LOADER)
    on = [k for k, v in off.items() if v]
    if on:
        raise K82Error(f"the driver replays K82s4's loop at its defaults; these are set: {on}")


def step_settings(mod, optimizer, sched: dict, lr_cache: dict | None = None) -> dict:
    """Run main()'s rate block (l.4393-4463, K82s4's text) for one schedule row of `walk`: sets every param group's
    lr / lr_t / momentum / weight_decay and returns lrm (warm-up (s+1)/20, then level/20; × FF_ACCUM_LR in a
    small-batch phase), applied_level, muon_wd, muon_mom, accum_lr."""
    return mod._k82_step_settings(sched["step"], sched["next_level"], sched["next_level"], sched["k"],
                                  sched["grad_accum_steps"], sched["accum_micro_done"],
                                  {} if lr_cache is None else lr_cache, torch.device("cpu"), optimizer)


class Run:
    """K82s4's training state between optimizer steps as main() keeps it: the model, MuonAdamW from
    setup_optimizer (l.4250), the EMA (l.4265-4273), the lr tensor cache, the step count; `walk`'s schedule.

    What a step depends on besides the weights and the gradients: Muon's momentum_buffer and
    second_momentum_buffer (per group, stacked); AdamW's exp_avg / exp_avg_sq and step count (per parameter, or
    per fused group, or the scalar group's stacked moments and stack_step); the step's lrm, momentum and k from the
    schedule (which reads accum_micro_done, the micro-batches of all earlier steps). `optimizer_state` reads them
    and `set_optimizer_state` writes them, by our names."""

    def __init__(self, mod, k82_model, steps: int, progress=None):
        _assumed_defaults(mod)
        self.mod, self.model, self.steps = mod, k82_model, steps
        self.optimizer = k82_model.setup_optimizer()
        self.live = list(k82_model.parameters())
        self.ema_state: dict = {}
        if mod.USE_EMA and mod.OPT_FUSE:
            self.ema = mod.ema_fuse_build(self.live, self.optimizer, self.ema_state)
        else:
            self.ema = [q.detach().clone().float() for q in self.live] if mod.USE_EMA else None
        self.ema_steps, self.step, self.lr_cache = 0, 0, {}
        self.schedule = walk(mod, steps, progress)
        self.mtp_ws = mod.mtp_weight_tensors(torch.device("cpu"))
        self.applied_level = 20
        self.point = None

    def at(self, step: int, progress: float, accum_micro_done: int | None = None) -> None:
        """Make the next step step `step` at a given phase point (`schedule_point`) instead of the walk's row."""
        self.step = step
        self.point = schedule_point(self.mod, step, progress, accum_micro_done)

    def row(self) -> dict:
        """The next step's schedule row: the `at` point if one is set, else the walk's."""
        return self.point if self.point is not None else self.schedule[self.step]

    def micro_batches_needed(self) -> int:
        """How many micro-batches the next step takes (its k)."""
        return self.row()["k"]

    def gradients(self, batches) -> list[float]:
        """The loop's micro-batch loop (l.4339-4368): zero_grad, then per micro-batch loss = model(x, y, mtp_w)
        and loss.backward(gradient=loss_seed(loss, k)), k this step's micro-batch count. Returns the losses."""
        sched = self.row()
        if len(batches) != sched["k"]:
            raise ValueError(f"step {self.step} takes {sched['k']} micro-batches, got {len(batches)}")
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for x, y in batches:
            loss = self.model(x, y, mtp_w=self.mtp_ws[sched["mtp_stage"]])
            loss.backward(gradient=self.mod.loss_seed(loss, sched["k"]))
            losses.append(float(loss.detach()))
        return losses

    def set_gradients(self, grads: dict, our_cfg=None) -> None:
        """p.grad = the given (already 1/k-averaged) gradients, by K82s4's names or ours (with `our_cfg`)."""
        if our_cfg is not None:
            grads = from_ours(self.mod, grads, self.model)
        for name, p in self.model.named_parameters():
            p.grad = grads[name].detach().to(p.dtype).reshape(p.shape).clone()

    def optimizer_step(self) -> dict:
        """One optimizer step on the gradients in p.grad: the rate block, optimizer.step(), the EMA update after
        steps 3, 31, 63, ... (l.4471-4473: (step+1) % 32 == 0, or the pre-warm at step + 1 == 5 - 1)."""
        mod, sched = self.mod, self.row()
        got = step_settings(mod, self.optimizer, sched, self.lr_cache)
        self.optimizer.step()
        s = self.step
        if self.ema is not None and ((s + 1) % mod.EMA_EVERY == 0
                                     or (mod.EMA_PREWARM and s + 1 == mod.TRAIN_STARTUP_STEPS_EXCLUDED - 1)):
            mod.ema_update(self.ema, self.live, self.ema_state)
            self.ema_steps += 1
        self.applied_level = got["applied_level"]
        self.step += 1
        self.point = None
        return {**sched, **{k: v for k, v in got.items() if not k.startswith("lr_t")}}

    def train_step(self, batches) -> dict:
        """`gradients` then `optimizer_step`; returns the step's schedule and settings with the micro losses."""
        losses = self.gradients(batches)
        return {**self.optimizer_step(), "losses": losses}

    def final_weights(self) -> tuple[str, dict]:
        """What main() saves (l.4702-4733): the pure EMA when the last applied level > EMA_SAVE_MAX_LEVEL (3);
        else the FF_EMA_BLEND 0.6 blend trained + 0.6·(EMA − trained), on the host in fp32 (ema_blend_host), unless
        0.99^32 to the EMA updates still exceeds 0.1 (then the trained weights). Returns (kind, K82s4 state)."""
        mod = self.mod
        use_ema = self.ema is not None and self.applied_level > mod.EMA_SAVE_MAX_LEVEL
        payload = mod.checkpoint_payload(self.model, self.ema, use_ema, {})
        if use_ema:
            return "ema", payload["model_state"]
        young = mod.EMA_DECAY_EFF ** self.ema_steps > mod.EMA_BLEND_MAX_INIT
        blend = bool(mod.EMA_BLEND) and self.ema is not None and not young
        if not blend:
            return "trained", payload["model_state"]
        state = dict(payload["model_state"])
        state.update(mod.ema_blend_host(self.model, self.ema, mod.EMA_BLEND, mod.EMA_BLEND_SKIP_EMB,
                                        trained=payload["model_state"]))
        return f"blend:{mod.EMA_BLEND:g}", state

    # ---- optimizer state by our names ----
    def _slots(self):
        """(param name, kind, getter) for every parameter: where its optimizer state lives (after one step)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        opt, out = self.optimizer, []
        fused = opt.__dict__.get("_fuse_moments", {})
        for group in opt.param_groups:
            params = group["params"]
            if not params:
                continue
            st0 = opt.state[params[0]]
            for i, p in enumerate(params):
                n = names[id(p)]
                if group["kind"] == "muon":
                    out.append((n, "muon", lambda st0=st0, i=i: {
                        "momentum_buffer": st0["momentum_buffer"][i],
                        "second_momentum_buffer": st0["second_momentum_buffer"][i]}))
                elif "stack_exp_avg" in st0:
                    out.append((n, "adamw", lambda st0=st0, i=i: {"exp_avg": st0["stack_exp_avg"][i],
                                                                  "exp_avg_sq": st0["stack_exp_avg_sq"][i],
                                                                  "step": st0["stack_step"]}))
                else:
                    out.append((n, "adamw", lambda p=p: {"exp_avg": opt.state[p]["exp_avg"],
                                                         "exp_avg_sq": opt.state[p]["exp_avg_sq"],
                                                         "step": opt.state[p]["step"]}))
        return out, fused

    def optimizer_state(self) -> dict:
        """{K82s4 param name: {momentum_buffer, second_momentum_buffer} (Muon) or {exp_avg, exp_avg_sq, step}} —
        copies, available after the first optimizer step (the state is made lazily)."""
        slots, _ = self._slots()
        return {n: {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in get().items()}
                for n, _kind, get in slots}

    def set_optimizer_state(self, state: dict) -> None:
        """Write `optimizer_state`-shaped values (K82s4's names) into the live state, in place. Needs the state to
        exist: take one step first (e.g. with zero lr), or use a Run that has stepped."""
        slots, _ = self._slots()
        with torch.no_grad():
            for n, _kind, get in slots:
                live = get()
                for k, v in state[n].items():
                    if torch.is_tensor(live[k]):
                        live[k].copy_(v.reshape(live[k].shape))
            for group in self.optimizer.param_groups:
                params = group["params"]
                st0 = self.optimizer.state[params[0]] if params else {}
                if "stack_step" in st0:
                    st0["stack_step"] = state[_name_of(self.model, params[0])]["step"]
                elif group["kind"] == "adamw":
                    for p in params:
                        self.optimizer.state[p]["step"] = state[_name_of(self.model, p)]["step"]


def state_to_ours(mod, run: Run, our_cfg) -> dict:
    """`run.optimizer_state()` by our parameter names: per-block scalars stacked (their Adam step counts must
    agree), the RoPE flip on wq/wk's Muon momentum (a linear image of the gradients); second moments are squares
    and need none."""
    k82 = run.optimizer_state()
    ours = _ours_meta(our_cfg)
    names = _k82_names(our_cfg.n_layers, range(our_cfg.n_layers))
    out = {}
    for name in ours:
        src = names[name]
        parts = [k82[n] for n in (src if isinstance(src, list) else [src])]
        st = {}
        for key, v in parts[0].items():
            if not torch.is_tensor(v):
                if any(q[key] != v for q in parts):
                    raise K82Error(f"state_to_ours: {name}'s parts have different {key}")
                st[key] = v
                continue
            t = torch.stack([q[key].reshape(()) for q in parts]) if isinstance(src, list) else v
            if key == "momentum_buffer" and name.endswith(("attn.wq.weight", "attn.wk.weight")):
                t = _flip_rope(t, our_cfg.d_head)
            st[key] = t.clone()
        out[name] = st
    return out


def _name_of(k82_model, p) -> str:
    """The parameter's name in the model."""
    return next(n for n, q in k82_model.named_parameters() if q is p)


def optimizer_step(mod, run: Run, batches=None, grads=None, our_cfg=None, step=None, progress=None,
                   accum_micro_done=None) -> dict:
    """One K82s4 optimizer step of `run` at its next schedule row, or at (`step`, `progress`) when given
    (`Run.at`): gradients from `batches` (k micro-batches, the loop's own forward/backward) or `grads` (averaged,
    by K82s4's names or ours with `our_cfg`); then the rate block, optimizer.step() and the EMA. Returns the step's
    schedule and settings; the weights are run.model's (`to_ours(mod, run.model.state_dict(), cfg)`)."""
    if (batches is None) == (grads is None):
        raise ValueError("optimizer_step: give batches or grads")
    if step is not None:
        run.at(step, 0.0 if progress is None else progress, accum_micro_done)
    if batches is not None:
        return run.train_step(batches)
    run.set_gradients(grads, our_cfg)
    return run.optimizer_step()


# ---------------------------------------------------------------------------------------------------------------------
# 6. train (K82s4's own main() in a subprocess), load_for_eval
# ---------------------------------------------------------------------------------------------------------------------
def train(path, seed: int = 73, steps: int = 40, out_dir="/tmp/k82run", timeout: float = 7200, **shape) -> dict:
    """Run K82s4's main() end to end in a subprocess on the CPU for `steps` optimizer steps at `shape`, its schedule
    on the step clock, no time stop, its final checkpoint in out_dir/final.pt. Returns its ff_summary plus
    seconds_per_step (wall, steps 3.. as K82s4's median_step_seconds) and the log's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = {**SMALL, **shape, "seed": seed}
    cmd = [sys.executable, str(Path(__file__).resolve()), "_main", str(Path(path).resolve()), "--steps", str(steps),
           "--out", str(out), "--shape", json.dumps(shape)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FF_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env["PYTHONUNBUFFERED"] = "1"
    t0 = time.time()
    with open(out / "train.log", "w") as log:
        p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=out)
    text = (out / "train.log").read_text()
    if p.returncode:
        tail = text.strip().splitlines()[-1:] or ["no output"]
        raise K82Error(f"K82s4's main() failed (exit {p.returncode}): {tail[0][:300]}; log {out / 'train.log'}")
    summary = json.loads(re.findall(r"^ff_summary: (.*)$", text, re.M)[-1])
    summary["wall_seconds"] = round(time.time() - t0, 1)
    summary["seconds_per_step"] = summary.get("median_step_seconds")
    summary["log"] = str(out / "train.log")
    return summary


def _run_main(path: str, steps: int, out: str, shape: dict) -> None:
    """In the subprocess: load K82s4 with the step clock on and call its main() for `steps` steps on the CPU."""
    mod = load(path, **shape)
    mod._K82_STEPS = steps
    mod._k82_charged = lambda step: step_charged(mod, step, steps)
    sys.argv = ["train.py", "--device-type", "cpu", "--num-steps", str(steps), "--out-dir", out]
    mod.main()


def load_for_eval(mod, checkpoint, device="cpu"):
    """K82s4's own load_for_eval (l.3854-3875: strict load, fp32 parameters) of a checkpoint it wrote; the model
    takes `model(x)` -> logits, which our stand-in's evaluate_bpb(model, tokenizer, B, T, device, ...) expects."""
    return mod.load_for_eval(str(checkpoint), torch.device(device))


def main(argv=None) -> int:
    """`train` a K82s4 file and score its checkpoint with our stand-in's evaluate_bpb."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_main"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("path")
        ap.add_argument("--steps", type=int)
        ap.add_argument("--out")
        ap.add_argument("--shape")
        a = ap.parse_args(argv[1:])
        _run_main(a.path, a.steps, a.out, json.loads(a.shape))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", help="K82s4's train.py")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=73)
    ap.add_argument("--out", default="/tmp/k82run")
    ap.add_argument("--eval-tokens", type=int, default=65536)
    a = ap.parse_args(argv)
    summary = train(a.path, a.seed, a.steps, a.out)
    mod = load(a.path, seed=a.seed)
    m = load_for_eval(mod, Path(a.out) / "final.pt")
    from neuronfrontier.submission import kit_prepare
    bpb = kit_prepare.evaluate_bpb(m, tokenizer(mod), 8, mod.SEQ_LEN, torch.device("cpu"), max_tokens=a.eval_tokens)
    print(json.dumps({"steps": summary["steps"], "seconds_per_step": summary["seconds_per_step"],
                      "saved_weights": summary["saved_weights"], "val_bpb": bpb["val_bpb"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
