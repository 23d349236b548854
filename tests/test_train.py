"""The path users run: bf16 autocast, torch.compile, divergence, the scorer's loader, MFU on trn2, the training length."""
import json, math, os, subprocess, sys
from types import SimpleNamespace

import pytest
import torch

import neuronfrontier.run.trainer as T
from neuronfrontier import ops
from neuronfrontier.run.checkpoint import load_for_eval
from neuronfrontier.run.clock import hw_name
from neuronfrontier.engine.config import CONFIGS, resolve
from neuronfrontier.data.shards import find_shards, load_tokenizer, val_batches
from neuronfrontier.data.evaluate import evaluate_bpb
from neuronfrontier.engine.model import GPT
from conftest import cli

FAST = ["eval_tokens=8192"]


def _losses(run_dir):
    return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _trained_micro():
    "cpu-micro with every weight non-zero (at init wo and w_down are zero, so attention and MLP get no gradient)."
    torch.manual_seed(0)
    m = GPT(CONFIGS["cpu-micro"])
    with torch.no_grad():
        for p in m.parameters():
            if p.ndim == 2 and not p.any(): p.normal_(std=0.02)
        m.lm_head.weight.normal_(std=0.02)
    return m


# bf16 autocast rounds every matmul input to an 8-bit mantissa (relative error 2^-9 ≈ 0.2% per rounding) and the
# matmul outputs again; through 2 layers, attention and the loss those roundings add up to relative gradient errors of
# about 1% per tensor (measured: at most 1.0% over cpu-micro's parameters, cosine similarity 0.99995). We require < 5% per tensor, a cosine
# similarity > 0.998 with the fp32 gradient, and the loss within 0.1% of fp32's.
def test_bf16_autocast_gradients_match_fp32():
    m = _trained_micro()
    idx = torch.randint(0, 8192, (2, 512), generator=torch.Generator().manual_seed(1))
    grads = {}
    for bf16 in (False, True):
        m.zero_grad()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = m.loss(idx[:, :-1], idx[:, 1:])
        loss.backward()
        grads[bf16] = (loss.item(), {n: p.grad.clone() for n, p in m.named_parameters()})
    (l32, g32), (l16, g16) = grads[False], grads[True]
    assert abs(l16 - l32) / l32 < 1e-3, (l16, l32)
    worst = max(((g16[n] - g32[n]).norm() / g32[n].norm()).item() for n in g32)
    cos = min(torch.nn.functional.cosine_similarity(g16[n].flatten(), g32[n].flatten(), dim=0).item() for n in g32)
    print(f"bf16 vs fp32: loss {l16:.5f} vs {l32:.5f}; worst relative gradient error {worst:.2e}, min cosine {cos:.5f}")
    assert all(g32[n].any() for n in g32)
    assert worst < 5e-2 and cos > 0.998


def test_trainer_trains_in_bf16_and_evaluates_in_fp32(pydocs, tmp_path, monkeypatch):
    "dtype=bf16 autocasts the training steps (on CPU too); the final evaluation runs without autocast."
    seen = {"loss": set(), "forward": set()}
    real_loss, real_forward = GPT.loss, GPT.forward
    monkeypatch.setattr(GPT, "loss", lambda self, *a, **k: seen["loss"].add(torch.is_autocast_enabled("cpu")) or real_loss(self, *a, **k))
    monkeypatch.setattr(GPT, "forward", lambda self, *a, **k: seen["forward"].add(torch.is_autocast_enabled("cpu")) or real_forward(self, *a, **k))
    # one row a step: a CPU without native bf16 emulates these matmuls (05_precision), slowly
    r = T.train("cpu-micro", pydocs, tmp_path / "bf16", steps=6, sets=["dtype=bf16", "batch_size=1"] + FAST, verbose=False)
    assert r["status"] == "completed" and seen == {"loss": {True}, "forward": {False}}
    losses = _losses(tmp_path / "bf16")
    assert all(math.isfinite(l) for l in losses) and losses[-1] < losses[0]
    # the saved fp32 weights score the same through the scorer's loader
    enc, tb = load_tokenizer(pydocs / "tokenizer")
    vb = val_batches(find_shards(pydocs)[1], enc, 512, 8192, 8)
    assert abs(evaluate_bpb(load_for_eval(tmp_path / "bf16" / "final.pt", torch.device("cpu")), vb, tb) - r["val_bpb"]) < 1e-6


def _compile_spy(monkeypatch):
    "Count calls of whatever the trainer compiles."
    calls, real = [], torch.compile
    def spy(fn, **kw):
        compiled = real(fn, **kw)
        def run(*a, **k):
            calls.append(1)
            return compiled(*a, **k)
        return run
    monkeypatch.setattr(torch, "compile", spy)
    return calls


# Inductor fuses elementwise ops and reorders reductions, so a compiled step differs from the eager one by float
# rounding (~1e-7 relative); Muon's bf16 Newton–Schulz amplifies such differences (a 1e-7 input change moves a bf16
# NS output by up to ~1%), so after 10 steps the losses agree to about 1e-4 relative (measured: 3e-5), not bit for bit.
@pytest.mark.slow   # inductor compiles for about 30 s on a 2-core CPU without native bf16; compile is opt-in
def test_compile_runs_the_loss_path_and_matches_eager(pydocs, tmp_path, monkeypatch):
    calls = _compile_spy(monkeypatch)
    rc = T.train("cpu-micro", pydocs, tmp_path / "c", steps=10, sets=["compile=true"] + FAST, verbose=False)
    assert len(calls) == 2 + 10, calls  # two warm-up steps (compilation, recompiles) + 10 charged steps
    re_ = T.train("cpu-micro", pydocs, tmp_path / "e", steps=10, sets=FAST, verbose=False)
    lc, le = _losses(tmp_path / "c"), _losses(tmp_path / "e")
    print("compiled", lc, "\neager   ", le, f"\ncompile_s {rc['compile_s']:.1f}, warmup_s {rc['warmup_s']:.1f}, train_s {rc['train_s']:.1f}")
    assert len(lc) == len(le) == 10
    assert max(abs(a - b) / b for a, b in zip(lc, le)) < 1e-3
    assert rc["compile_s"] > rc["max_step_s"] and rc["warmup_s"] >= rc["compile_s"] and re_["compile_s"] is None
    assert rc["train_s"] < rc["warmup_s"] + rc["train_s"] - rc["compile_s"]  # compilation is not in the charged time


def test_forced_cpu_capability_compiles_into_its_own_inductor_cache():
    """Inductor's cache key misses ATEN_CPU_CAPABILITY: a graph cached under precision.AVX2_ENV and reused at the
    machine's AVX512 width aborted a later compile=true run (heap corruption). Such processes get their own cache."""
    code = ("import os, torch, neuronfrontier.run.trainer as T; T._compiled(torch.sin, torch.device('cpu')); "
            "print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'))")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}
    code = "from torch._inductor.runtime.cache_dir_utils import cache_dir; cache_dir(); " + code   # inductor set it
    out = [subprocess.run([sys.executable, "-c", code], env=env | extra, capture_output=True, text=True, check=True)
           .stdout.strip() for extra in ({}, {"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "avx2",
                                                                              "TORCHINDUCTOR_CACHE_DIR": "/tmp/mine"})]
    assert out[1] == f"{out[0]}_avx2" and out[2] == "/tmp/mine", out   # out[0]: the default, untouched


def test_the_loss_traces_to_one_graph_and_no_recompilation():
    """Dynamo alone (backend 'eager', seconds): cpu-micro's loss through the ops table is one graph with no break, and
    three calls trace it once (what inductor and the Neuron backend are handed)."""
    from torch._dynamo.utils import counters
    from neuronfrontier.engine.model import GPT
    from neuronfrontier.engine.config import CONFIGS
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    m = GPT(CONFIGS["cpu-micro"])
    x = torch.randint(0, 8192, (2, CONFIGS["cpu-micro"].seq_len))
    ops.load_kernels()   # as setup does before compiling (OpSet.load_kernels)
    f = torch.compile(m.loss, backend="eager", dynamic=False)
    for _ in range(3): f(x, x).backward()
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.slow   # inductor compiles cpu-micro for ~20-30 s on a 2-core CPU
def test_the_compiled_step_has_one_graph_and_no_recompilation(pydocs, tmp_path):
    """compile=true on cpu-micro: the loss (through the ops table's dispatch) is one graph with no break, and 6 steps
    (2 warm-up, 4 charged) compile it once: no recompilation."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    T.train("cpu-micro", pydocs, tmp_path / "c", steps=4, sets=["compile=true"] + FAST, verbose=False)
    print(dict(counters["stats"]), dict(counters["graph_break"]), dict(counters["recompiles"]))
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1 and not counters["recompiles"], dict(counters["stats"])


# Over whole runs the losses of cpu-tiny do not compare: at init the residual and x0 scalars get gradients of ~1e-10,
# pure rounding, and AdamW (eps 1e-10, the kit's) turns each into a step of about lr in the direction of its sign, so
# compiled and eager runs part after the first step (measured over 10 steps: up to 2.5e-2 relative in fp32). One step's
# loss and gradients, on weights that are all non-zero, are what compilation must reproduce.
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_compile_matches_eager_cpu_tiny(dtype):
    "The loss and every gradient of a compiled cpu-tiny step against the eager one, in fp32 and under bf16 autocast."
    mcfg, tcfg = resolve("cpu-tiny", None, [])
    torch.manual_seed(0)
    model = GPT(mcfg)
    with torch.no_grad():
        for p in model.parameters(): p.add_(0.02 * torch.randn_like(p))   # at init some weights are zero
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, mcfg.vocab_size, (2, mcfg.seq_len), generator=g) for _ in range(2))
    compiled = T._compiled(model.loss, torch.device("cpu"))
    results = []
    for fn in (model.loss, compiled):
        model.zero_grad()
        with T.autocast(torch.device("cpu"), dtype):
            loss = fn(x, y)
        loss.backward()
        results.append((loss.item(), torch.cat([p.grad.flatten().float() for p in model.parameters()])))
    (le, ge), (lc, gc) = results
    # measured (AVX512 CPU with native bf16): gradients 1.9e-5 apart in fp32; 1.1e-2 under autocast, where inductor keeps
    # fused intermediates in fp32 that eager rounds to bf16 (as far apart as bf16 is from fp32: ~1%, see above)
    tol = 1e-4 if dtype == "fp32" else 3e-2
    assert abs(lc - le) / le < tol, (lc, le)
    assert (gc - ge).norm() / ge.norm() < tol, ((gc - ge).norm() / ge.norm()).item()


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_blown_up_run_is_diverged_not_completed(pydocs, tmp_path):
    """lr=1e9 under AdamW: the softcap keeps the loss finite at ln V; that is divergence. Each time it rolls back to the
    last finite state at half the learning rate; after max_rollbacks it stops: exit 1, the last finite state saved."""
    out = tmp_path / "blow"
    r = cli("train", "--config", "cpu-micro", "--steps", "30", "--data", pydocs, "--out", out,
            "--set", "optim=adamw", "--set", "lr=1e9", "--set", "eval_tokens=8192", "--quiet")
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    res = json.loads((out / "result.json").read_text())
    assert res["status"] == "diverged" and "ln V" in res["diverged_because"] and "3 rollbacks before" in res["diverged_because"]
    assert [rb["lr_scale"] for rb in res["rollbacks"]] == [0.5, 0.25, 0.125] and res["model_saved"]
    m = load_for_eval(out / "final.pt", torch.device("cpu"))   # the last finite state, scored
    assert all(torch.isfinite(p).all() for p in m.parameters()) and 0 < res["val_bpb"] < 20


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_nan_between_log_steps_never_overwrites_good_checkpoints(pydocs, tmp_path, monkeypatch):
    out = tmp_path / "run"
    T.train("cpu-micro", pydocs, out, steps=5, sets=FAST, verbose=False)
    good = {f: (out / f).read_bytes() for f in ("final.pt", "resume.pt")}
    real_step, calls = T.train_step, []
    def poisoned(model, *a, **k):
        loss = real_step(model, *a, **k); calls.append(1)
        if len(calls) == 1 + 12:  # after the warm-up step and 12 charged steps: between the log steps 10 and 20
            with torch.no_grad(): model.blocks[0].mlp.w_up.weight[0, 0] = float("nan")
        return loss
    monkeypatch.setattr(T, "train_step", poisoned)
    r = T.train("cpu-micro", pydocs, out, budget_s=600, resume=True, sets=FAST + ["log_every=10"], verbose=False,
                callback=lambda rec: rec["step"] >= 40)
    # the NaN is seen at log step 20 (5 resumed + 15): back to the state the resumed run started from, then on to step 40
    assert r["status"] == "interrupted" and r["steps"] == 40 and len(r["rollbacks"]) == 1, r
    assert r["rollbacks"][0]["to_step"] == 5 and r["rollbacks"][0]["step"] == 20 and r["rollbacks"][0]["lr_scale"] == 0.5
    assert good["final.pt"] != (out / "final.pt").read_bytes()   # what is saved is finite, never the NaN weights
    assert torch.isfinite(load_for_eval(out / "final.pt", torch.device("cpu")).blocks[0].mlp.w_up.weight).all()


def test_nan_in_the_last_update_is_not_saved(pydocs, tmp_path, monkeypatch):
    "A NaN produced by the very last step (no loss has seen it yet) is caught before saving: the last finite state is saved."
    real_step, calls = T.train_step, []
    def poisoned(model, *a, **k):
        loss = real_step(model, *a, **k); calls.append(1)
        if len(calls) == 1 + 6: model.lm_head.weight.data[3, 3] = float("inf")
        return loss
    monkeypatch.setattr(T, "train_step", poisoned)
    r = T.train("cpu-micro", pydocs, tmp_path / "last", steps=6, sets=FAST + ["snapshot_every=5"], verbose=False)
    assert r["status"] == "completed" and r["rollbacks"][-1]["to_step"] == 5 and "at the end" in r["rollbacks"][-1]["why"]
    assert torch.isfinite(load_for_eval(tmp_path / "last" / "final.pt", torch.device("cpu")).lm_head.weight).all()


def test_no_step_at_lr_multiplier_zero(pydocs, tmp_path):
    for name, kw in (("steps", dict(steps=4)), ("budget", dict(budget_s=2))):
        T.train("cpu-micro", pydocs, tmp_path / name, sets=FAST + ["log_every=1", "warmup_frac=0.5"], verbose=False, **kw)
        lrs = [json.loads(l)["lr_mult"] for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert lrs and min(lrs) > 0, (name, lrs)


def test_charge_warmup_counts_the_warmup(pydocs, tmp_path):
    "With charge_warmup the budget starts with the warm-up already spent: only what is left of it is trained."
    budget = 3
    r = T.train("cpu-micro", pydocs, tmp_path / "cw", budget_s=budget, sets=FAST + ["charge_warmup=true"], verbose=False)
    assert r["train_s"] >= r["warmup_s"] > 0
    assert r["train_s"] - r["warmup_s"] <= max(0.0, budget - r["warmup_s"]) + r["max_step_s"]


def test_load_for_eval_pins_torch_ops_on_the_model_only(pydocs, tmp_path, monkeypatch):
    T.train("cpu-micro", pydocs, tmp_path / "r", steps=2, sets=FAST, verbose=False)
    ck = tmp_path / "r" / "final.pt"
    ops.load_kernels()
    def refuse(*a, **k): raise AssertionError("an nki-sim kernel ran")
    for op in ops.OPS: monkeypatch.setitem(ops._IMPLS[op], "nki-sim", refuse)
    idx = torch.randint(0, 8192, (1, 128))
    trained = GPT(CONFIGS["cpu-micro"], kernels="nki-sim")  # what a process with kernels selected holds
    trained_ops = trained.opset
    m = load_for_eval(ck, torch.device("cpu"))
    logits = m(idx)                                # the scorer's forward: plain PyTorch ops
    assert m.opset.asked == {op: "torch" for op in ops.OPS}
    assert trained.opset is trained_ops and trained_ops.asked == {op: "nki-sim" for op in ops.OPS}  # untouched
    assert ops.AUTO.asked == {op: "auto" for op in ops.OPS}  # and so is the op set of calls that name none
    unpinned = load_for_eval(ck, torch.device("cpu"), kernels=None)
    assert unpinned.opset.asked == {op: "auto" for op in ops.OPS}   # opting out: the model runs auto
    with pytest.raises(AssertionError, match="nki-sim kernel ran"):
        with unpinned.using(trained_ops): unpinned(idx)   # ... and whatever op set it is then handed
    with pytest.raises(AssertionError, match="nki-sim kernel ran"):
        load_for_eval(ck, torch.device("cpu"), kernels="nki-sim")(idx)  # a pin other than torch is followed
    ref = GPT(m.cfg, kernels="torch"); ref.load_state_dict(m.state_dict())  # the same logits as a model on torch
    torch.testing.assert_close(ref.eval()(idx), logits)


def test_model_pt_is_weights_only_and_resume_pt_has_the_rest(pydocs, tmp_path):
    T.train("cpu-micro", pydocs, tmp_path / "r", steps=2, sets=FAST, verbose=False)
    m = torch.load(tmp_path / "r" / "final.pt", weights_only=True)
    r = torch.load(tmp_path / "r" / "resume.pt", weights_only=True)
    assert sorted(m) == ["model", "model_config", "train_config"]
    assert {"optimizers", "state", "rng"} <= set(r) and r["state"]["step"] == 2
    assert all(torch.equal(m["model"][k], r["model"][k]) for k in m["model"])


def test_mfu_counts_the_cores_each_process_drives(monkeypatch):
    neuron = SimpleNamespace(type="neuron")
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    assert hw_name(neuron) == "trn2-lnc2"  # LNC=2 is the trn2 default
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    from neuronfrontier import hw
    lnc2 = hw.mfu(1e5, 6e8, hw_name(neuron))
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert hw_name(neuron) == "trn2-core"
    assert lnc2 == pytest.approx(hw.mfu(1e5, 6e8, hw_name(neuron)) / 2)


def test_every_preset_trains_at_least_at_its_scored_length():
    for name in CONFIGS:
        m, t = resolve(name)
        assert m.seq_len >= t.eval_seq_len, name
    assert resolve("dense-124m")[0].seq_len == resolve("dense-124m")[1].eval_seq_len == 2048
    with pytest.raises(ValueError, match="exceeds seq_len"):
        resolve("cpu-tiny", sets=["seq_len=256"])


@pytest.mark.slow   # over 30 s on the CI's 2-core machine (pytest --durations, 2026-12-06)
def test_scoring_at_the_eval_length_is_not_worse_than_at_half_of_it(pydocs, tmp_path):
    "The same targets scored in full 512-token rows and in 256-token halves: the longer context must not cost bpb."
    T.train("cpu-micro", pydocs, tmp_path / "r", steps=60, sets=FAST, verbose=False)
    m = load_for_eval(tmp_path / "r" / "final.pt", torch.device("cpu"))
    enc, tb = load_tokenizer(pydocs / "tokenizer")
    _, t = resolve("cpu-micro")
    vb = val_batches(find_shards(pydocs)[1], enc, t.eval_seq_len, 16384, 8)
    halves = [(x.reshape(-1, t.eval_seq_len // 2), y.reshape(-1, t.eval_seq_len // 2)) for x, y in vb]
    full, half = evaluate_bpb(m, vb, tb), evaluate_bpb(m, halves, tb)
    print(f"bpb on 512-token rows {full:.4f}, on the same targets in 256-token rows {half:.4f}")
    assert full <= half + 0.005


def test_competition_clock_excluded_steps_train_and_are_timed(pydocs, tmp_path):
    """budget_mode='competition': the five excluded steps are free yet real — they train with the schedule's first
    (non-zero) learning rate and the watchdog learns their duration — and the charged clock starts after them."""
    spec = T.RunSpec("cpu-micro", pydocs, tmp_path / "c", budget_s=6, budget_mode="competition", verbose=False,
                     sets=tuple(FAST + ["log_every=1", "warmup_frac=0.2"]))
    res = T.train(spec)
    recs = [json.loads(line) for line in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    lrs, times = [r["lr_mult"] for r in recs], [r["time_s"] for r in recs]
    print(res["steps"], lrs[:8], times[:8])
    assert res["budget_mode"] == "competition" and res["steps"] > 5
    assert all(lr > 0 for lr in lrs[:5]) and times[:4] == [0.0] * 4 and times[5] > 0   # steps 1-5 free (step 5 ends
    assert res["train_s"] <= 6.0 and res["overrun_s"] == 0                              # at 0 + excess: none here)
    # tokens per second over the steps' own time: the free steps' too (over the charged clock alone they were 1e12)
    toks = [r["tok_s"] for r in recs]
    assert max(toks[:5]) < 10 * max(toks[5:]) and res["tok_s"] < 10 * max(toks[5:]), (toks[:8], res["tok_s"])


class RecordingBar:
    "A tqdm stand-in that records what it is asked: its arguments, where it was moved, its postfix, whether it closed."
    made = []
    def __init__(self, **kw):
        self.kw, self.n, self.post, self.closed, self.shown = kw, 0, {}, False, []
        RecordingBar.made.append(self)
    def set_postfix(self, ordered_dict=None, **kw):
        self.post = dict(ordered_dict or {}, **kw)
        self.shown.append(self.n)
    def update(self, k): self.n += k
    def close(self): self.closed = True


def test_the_bars_end_where_training_and_evaluation_end(pydocs, tmp_path, monkeypatch, capsys):
    """On a terminal: the training bar of a budget run logged only at its first step is moved to the charged seconds
    at the end and closed (it froze at the first log step); the evaluation gets a bar of its own, moved batch by
    batch to its end and closed; the start line names each op's backend in one line, not a dict."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    RecordingBar.made = []
    res = T.train("cpu-micro", pydocs, tmp_path / "b", budget_s=3, sets=FAST + ["log_every=100000"], bar=RecordingBar)
    train_bar, eval_bar = RecordingBar.made
    assert train_bar.kw["unit"] == "s" and train_bar.closed and train_bar.n == round(res["train_s"], 1) > 0
    if res["steps"] > 1: assert train_bar.shown[-1] > train_bar.shown[0]   # past the one log step, to the end
    assert eval_bar.kw["desc"] == "eval" and eval_bar.n == eval_bar.kw["total"] == 2 and eval_bar.closed  # 8192 tokens
    assert "ops rms_norm=torch, " in capsys.readouterr().out


def test_a_steps_bar_counts_steps_and_says_how_training_ended(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    done, stopped = T._Progress(None, bar=RecordingBar, steps=20), T._Progress(300.0, bar=RecordingBar)
    done.update({"step": 19, "loss": 7.7, "tok_s": 2000.0}, 30.2)
    done.close(20, 31.6)
    stopped.update({"step": 10, "loss": 8.1, "tok_s": 2000.0}, 41.3)
    stopped.close(13, 52.9, "interrupted")
    assert (done.bar.kw["total"], done.bar.kw["unit"], done.bar.n, done.bar.closed) == (20, "step", 20, True)
    assert "status" not in done.bar.post
    assert (stopped.bar.n, stopped.bar.post["status"], stopped.bar.closed) == (52.9, "interrupted", True)


def test_evaluation_progress_is_called_per_batch_and_changes_no_sum(capsys):
    from neuronfrontier.data.evaluate import evaluate_sums, EvalProgress
    m, tb = _trained_micro(), torch.randint(1, 5, (CONFIGS["cpu-micro"].vocab_size,))
    torch.manual_seed(1)
    batches = [(x, x) for x in torch.randint(0, 8000, (3, 2, 64))]
    calls = []
    assert torch.equal(evaluate_sums(m, batches, tb, progress=lambda d, t: calls.append((d, t))),
                       evaluate_sums(m, batches, tb))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    capsys.readouterr()
    shown, quiet = EvalProgress(), EvalProgress(enabled=False)   # plain lines: the first batch and the last
    for d in (1, 2, 3): shown(d, 3), quiet(d, 3)
    assert [l.split(",")[0] for l in capsys.readouterr().out.splitlines()] == ["eval 1/3 batches", "eval 3/3 batches"]
