"""A step planned once (issue 52): `Schedule.plan` decides a step's micro-batches, rates, momentum, multi-token weights
and weight-average update; the trainer's step applies that plan and metrics.jsonl writes it as is."""
import json

import pytest
import torch

import neuronfrontier.engine.phases as P
import neuronfrontier.run.trainer as T
from neuronfrontier.engine.config import resolve
from neuronfrontier.engine.optim import apply_schedule, build_optimizers
from neuronfrontier.engine.model import GPT

# a batch warm-up (one micro-batch of two at half the rate until f = 0.5), a fading second token, an average
SETS = ["eval_tokens=8192", "log_every=1", "grad_accum=2", "batch_warmup=0.5:0.5:0.5", "mtp_weights=1,0.5",
        "mtp_fade=0.6", "ema_every=2"]


def test_the_log_writes_each_steps_plan(pydocs, tmp_path):
    T.train("cpu-micro", pydocs, tmp_path / "r", steps=6, sets=SETS, verbose=False)
    recs = [json.loads(l) for l in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    tcfg = resolve("cpu-micro", None, SETS)[1]
    assert [r["index"] for r in recs] == list(range(6)) and [r["step"] for r in recs] == list(range(1, 7))
    for r in recs:   # what the log says is what the schedule planned for that step
        plan = P.Schedule(tcfg).plan(r["index"], r["frac"])
        assert (r["micro_batches"], r["phase"], r["ema_update"]) == (plan.micro_batches, plan.phase, plan.ema_update)
        assert r["lr_mult"] == pytest.approx(plan.lr_mult) and r["mtp"] == list(plan.mtp)
    assert [r["micro_batches"] for r in recs] == [1, 1, 1, 2, 2, 2] and "batch warm-up" in {r["phase"] for r in recs}
    assert [r["ema_update"] for r in recs] == [False, True] * 3
    # the tokens count the micro-batches each step took
    grew = [b["tokens"] - a["tokens"] for a, b in zip([{"tokens": 0}] + recs, recs)]
    assert grew == [grew[0] * r["micro_batches"] for r in recs]

def test_a_step_asks_the_schedule_once(pydocs, tmp_path, monkeypatch):
    "batch_phase ran three times a loop step (the step, the token count, the log); the plan asks it once."
    calls = []
    real = P.batch_phase
    monkeypatch.setattr(P, "batch_phase", lambda *a, **k: calls.append(a) or real(*a, **k))
    T.train("cpu-micro", pydocs, tmp_path / "r", steps=4, sets=SETS, verbose=False)
    assert [c[2] for c in calls if c[2] is not None] == [0, 1, 2, 3]   # (the warm-up before the clock: no index)


def test_a_planned_step_sets_what_apply_schedule_sets():
    "The plan's rates and momentum are apply_schedule's, to the bit, for a rollback scale and a batch warm-up rate."
    mc, tc = resolve("cpu-micro", "trn2", ["batch_warmup=0.5:0.5:0.35"])
    torch.manual_seed(0)
    a, b = build_optimizers(GPT(mc), tc, print_table=False), build_optimizers(GPT(mc), tc, print_table=False)
    for index, frac, scale in ((0, 0.01, 1.0), (30, 0.2, 0.5), (200, 0.9, 0.25)):
        plan = P.Schedule(tc).plan(index, frac, scale, full_batches=index / 2)
        _, phase_lr = P.batch_phase(tc, frac, index)
        apply_schedule(a, tc, frac, scale * phase_lr, index, index / 2)
        T.set_groups(b, plan.lr_mult, plan.wd_mult, plan.momentum)
        assert [[(g["lr"], g.get("momentum"), g["weight_decay"]) for g in o.param_groups] for o in a] == \
               [[(g["lr"], g.get("momentum"), g["weight_decay"]) for g in o.param_groups] for o in b]
