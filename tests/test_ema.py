"""Issue 37's end of K82s4: the weight average (EMA) blended into the saved weights, and the MLP output projections'
learning-rate scale; each against a direct computation, so each fails without its lever."""
import io, json
import pytest
import torch
from torch import nn
import neuronfrontier.run.trainer as T
from neuronfrontier.engine.averaging import WeightEma, ema_for, blend_for_save
from neuronfrontier.engine.config import CONFIGS, TrainConfig, resolve
from neuronfrontier.engine.model import GPT
from neuronfrontier.engine.optim import apply_schedule, build_optimizers
from conftest import cli

FAST = ["eval_tokens=8192"]


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3))


def _nudge(net):
    "A stand-in optimizer step: every weight moves."
    with torch.no_grad():
        for p in net.parameters(): p.add_(torch.randn_like(p))


def test_the_average_after_k_updates_is_the_lerp_formula_and_updates_come_every_ema_every_steps():
    net, d, every = _net(), 0.97, 3
    ema = WeightEma(net, d, every, prewarm=1)
    ref = {n: p.detach().clone() for n, p in net.named_parameters()}
    for step in range(11):
        _nudge(net)
        before = {n: w.clone() for n, w in ema.state_dict()["weights"].items()}
        ema.after_step(net, step)
        if (step + 1) % every and step != 0:   # no update: the average is untouched
            assert all(torch.equal(before[n], w) for n, w in ema.state_dict()["weights"].items()), step
            continue
        for n, p in net.named_parameters(): ref[n] = d ** every * ref[n] + (1 - d ** every) * p.detach()
    assert ema.updates == 4   # after steps 0 (the prewarm), 2, 5, 8: K82s4's 3, 31, 63, ... at every 32
    for n, w in ema.state_dict()["weights"].items(): torch.testing.assert_close(w, ref[n])


def test_the_blend_is_blend_times_the_average_plus_the_rest_times_the_weights():
    net = _net()
    ema = WeightEma(net, 0.4, 1)
    for step in range(3):   # 0.4^3 = 6.4% of the initial weights left in the average: under K82s4's 10%, blended
        _nudge(net)
        ema.after_step(net, step)
    avg = {n: w.clone() for n, w in ema.state_dict()["weights"].items()}
    trained = {n: p.detach().clone() for n, p in net.named_parameters()}
    raw = blend_for_save(ema, net, 0.6, "completed", say=lambda *a: None)
    for n, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), 0.6 * avg[n] + 0.4 * trained[n])
        assert torch.equal(raw[n], trained[n])   # what resume.pt keeps: the weights as trained


def test_a_resumed_average_goes_on_as_the_same_average():
    "The average's state through torch.save/load (as resume.pt keeps it) continues exactly as the uninterrupted one."
    net = _net()
    a = ema_for(net, TrainConfig(ema_every=2, ema_decay=0.95))
    for step in range(5):
        _nudge(net)
        a.after_step(net, step)
    buf = io.BytesIO()
    torch.save({"ema": a.state_dict()}, buf)   # resume.pt's "state"
    buf.seek(0)
    b = ema_for(net, TrainConfig(ema_every=2, ema_decay=0.95), torch.load(buf, weights_only=True)["ema"])
    assert b.updates == a.updates == 2   # after steps 1 and 3
    for step in range(5, 9):
        _nudge(net)
        a.after_step(net, step)
        b.after_step(net, step)
    for n, w in a.state_dict()["weights"].items(): assert torch.equal(w, b.state_dict()["weights"][n])


@pytest.mark.parametrize("sets, msg", [
    (["ema_every=-1"], "ema_every=-1 must be >= 0"),
    (["ema_decay=1"], r"ema_decay=1.0 must lie in \(0, 1\)"),
    (["ema_blend=1.5"], r"ema_blend=1.5 must lie in \[0, 1\]"),
    (["ema_every=32", "fsdp=true"], "averages replicated weights: not with fsdp"),
    (["ema_every=32", "ep=2"], "averages replicated weights: not with ep=2"),
    (["mlp_out_lr_scale=0"], "mlp_out_lr_scale=0.0 must be > 0"),
])
def test_bad_settings_are_one_line_errors(sets, msg):
    with pytest.raises(ValueError, match=msg) as e: resolve("cpu-micro", None, sets)
    assert "\n" not in str(e.value)


def test_a_run_with_the_average_saves_the_blend_and_resumes_from_the_trained_weights(pydocs, tmp_path):
    """`train --set ema_every=2`: final.pt is 0.6 × the average + 0.4 × the weights as trained, which resume.pt keeps;
    those are the weights of the same run without the average (the average changes no step), so final.pt differs."""
    on, sets = tmp_path / "on", FAST + ["dtype=fp32", "batch_size=1"]   # fp32 whatever the CPU: the two runs agree
    r = cli("train", "--config", "cpu-micro", "--steps", "4", "--data", pydocs, "--out", on, "--quiet",
            "--set", "ema_every=2", "--set", "ema_decay=0.3", *[a for s in sets for a in ("--set", s)])
    assert r.returncode == 0, r.stderr
    assert json.loads((on / "result.json").read_text())["ema"] == {"every": 2, "rate": 0.91, "updates": 2, "blend": 0.6}
    off = T.train("cpu-micro", pydocs, tmp_path / "off", steps=4, sets=sets, verbose=False)
    assert off["ema"] is None
    final, resume, plain = (torch.load(p, weights_only=True) for p in (on / "final.pt", on / "resume.pt",
                                                                        tmp_path / "off" / "final.pt"))
    avg = resume["state"]["ema"]
    assert avg["updates"] == 2   # after steps 0 and 2
    for n, w in avg["weights"].items():
        assert torch.equal(resume["model"][n], plain["model"][n]), n
        torch.testing.assert_close(final["model"][n], 0.6 * w + 0.4 * resume["model"][n])
    assert any(not torch.equal(final["model"][n], plain["model"][n]) for n in avg["weights"])


def _lrs_by_name(model, opts):
    return {n: g["lr"] for o in opts for g in o.param_groups for p in g["params"]
            for n, q in model.named_parameters() if q is p}


@pytest.mark.parametrize("optim, moe", [("muon", False), ("adamw", False), ("muon", True)])
def test_mlp_out_projections_train_at_their_scale_through_the_schedule(optim, moe):
    cfg = CONFIGS["cpu-tiny-moe" if moe else "cpu-micro"]
    model = GPT(cfg)
    tcfg = TrainConfig(optim=optim, mlp_out_lr_scale=0.8)
    opts = build_optimizers(model, tcfg, print_table=False)
    for frac in (0.001, 0.3, 0.75, 0.99):
        apply_schedule(opts, tcfg, frac)
        lrs = _lrs_by_name(model, opts)
        for n, lr in lrs.items():
            if not n.startswith("blocks.") or ".router." in n or model.get_parameter(n).ndim < 2: continue
            base = lrs[n.replace("w_down", "w_up")]   # the block matrices' rate
            assert lr == pytest.approx(0.8 * base if "w_down" in n else base), (frac, n)
    assert any("w_down" in n for n in lrs)
    plain = build_optimizers(model, TrainConfig(optim=optim), print_table=False)
    assert [len(o.param_groups) for o in plain] != [len(o.param_groups) for o in opts]   # scale 1: one group, as before


def test_an_average_still_mostly_initial_weights_is_not_blended():
    "K82s4's rule: with more than 10% of the initial weights left in the average (a short run), save the trained ones."
    net = _net()
    ema = WeightEma(net, 0.99, 32)   # 0.725 an update: 7 updates leave 10.5% (printed 11%), 8 leave 7.6%
    for _ in range(7): _nudge(net); ema.update(net)
    said = []
    assert blend_for_save(ema, net, 0.6, "completed", say=said.append) is None
    assert "still holds 11% of the initial weights" in said[0]
    _nudge(net)
    ema.update(net)
    assert blend_for_save(ema, net, 0.6, "completed", say=said.append) is not None
