"""`neuronfrontier.research.plan`: the scaling fit recovers known laws, the plan keeps the tile and memory rules and names what
binds, and `neuronfrontier plan` prints and writes a preset (notebook 93_plan)."""
import json

import numpy as np
import pytest
from conftest import cli
from neuronfrontier.engine.config import TrainConfig
from neuronfrontier.research.plan import (CHINCHILLA, compute_optimal, fit_scaling, law, memory_limit, memory_per_rank,
                                 nonneg_lstsq, parse_duration, plan, predict, preset, format_plan)

TRUE = dict(E=1.2, A=80.0, alpha=0.36, B=300.0, beta=0.41)
GRID = [dict(N=n, D=d) for n in (1e6, 3e6, 1e7, 3e7) for d in (1e5, 3e5, 1e6, 3e6)]
BINDINGS = {"compute", "memory per rank", "data", "step time / launch shape", "step time"}


def _rows(noise=0.0, seed=0):
    e = np.random.default_rng(seed).normal(0, noise, len(GRID)) if noise else np.zeros(len(GRID))
    return [dict(g, val_bpb=float(law(g["N"], g["D"], **TRUE)) + x) for g, x in zip(GRID, e)]


def test_the_fit_recovers_known_coefficients():
    got = fit_scaling(_rows())
    for k, v in TRUE.items(): assert got[k] == pytest.approx(v, rel=1e-3), k
    assert got["rmse"] < 1e-6 and got["loo_rmse"] < 1e-4 and len(got["loo_residuals"]) == len(GRID)


def test_the_fit_with_noise_keeps_the_exponents_near_and_reports_the_noise():
    got = fit_scaling(_rows(noise=0.01))
    assert abs(got["beta"] - TRUE["beta"]) < 0.05 and abs(got["alpha"] - TRUE["alpha"]) < 0.1
    assert 0.003 < got["loo_rmse"] < 0.03 and got["loo_rmse"] >= got["rmse"]


def test_the_fit_needs_enough_rows():
    with pytest.raises(ValueError, match="at least 6"): fit_scaling(_rows()[:5])


def test_nonnegative_least_squares_keeps_coefficients_nonnegative():
    X = np.array([[[1, 1, 0], [1, 2, 0], [1, 3, 0]]], float)
    c, _ = nonneg_lstsq(X, np.array([1.0, 3.0, 5.0]))      # unconstrained: intercept -1
    assert (c >= 0).all() and c[0, 0] == 0 and c[0, 1] == pytest.approx(11 / 7)


@pytest.mark.parametrize("fit", [CHINCHILLA, TRUE])
def test_compute_optimal_is_the_minimum_along_the_budget(fit):
    C = 1e21
    N, D = compute_optimal(fit, C)
    assert N * D * 6 == pytest.approx(C)
    Ns = np.geomspace(N / 100, N * 100, 4001)
    assert Ns[np.argmin(predict(fit, Ns, C / 6 / Ns))] == pytest.approx(N, rel=1e-2)


def _check_rules(p):
    m, c = p["model"], p["chosen"]
    for width in (m.d_model, m.d_mlp, m.d_attn, m.seq_len): assert width % 128 == 0
    assert m.d_head == 128 and m.d_mlp == 4 * m.d_model
    assert p["memory"]["total"] <= p["memory_limit"] and c["micro_rows"] >= 1
    assert memory_per_rank(m, c["micro_rows"], p["world"])["total"] == p["memory"]["total"]
    assert c["global_batch_tokens"] % (p["world"] * m.seq_len) == 0 and c["rows_per_rank"] % c["micro_rows"] == 0
    assert p["binding"] in BINDINGS and p["binding"] == p["binds"][0][0]
    TrainConfig(**{k: v for k, v in vars(p["train"]).items()})     # a valid TrainConfig, fsdp included


def test_plan_for_phase_2_keeps_the_rules_and_is_compute_bound():
    p = plan(4 * 3600, 16, fit="chinchilla")
    _check_rules(p)
    assert p["world"] == 128 and p["binding"] == "compute"
    assert p["memory_limit"] == memory_limit(1) and p["step_s_roofline"] > 0
    doc = preset(p)
    assert set(doc) == {"name", "model", "recipe", "train", "provenance"}
    assert doc["train"]["fsdp"] is True and doc["train"]["global_batch_tokens"] == p["chosen"]["global_batch_tokens"]
    assert "roofline" in doc["provenance"]["roofline"]["label"] and "nats" in doc["provenance"]["caveat"]
    assert p["reference"] is None and p["extrapolation"] == []


def test_plan_from_our_fit_says_how_far_it_extrapolates_and_gives_the_reference():
    p = plan(4 * 3600, 16)                                  # the committed CPU fit (nbs/results/scaling_fit.json)
    _check_rules(p)
    assert p["fit"]["n"] >= 9 and p["fit"]["loo_rmse"] > 0 and p["extrapolation"]
    assert p["reference"]["d_model"] % 128 == 0 and p["reference"]["binding"] in BINDINGS
    assert "extrapolated" in preset(p)["provenance"]["caveat"]


def test_plan_names_memory_when_the_preferred_shape_does_not_fit():
    p = plan(10 * 24 * 3600, 16, fit="chinchilla")       # ten days: the fit wants a model one rank cannot hold
    _check_rules(p)
    assert p["binding"] == "memory per rank" and not p["unconstrained"]["fits"]
    assert p["unconstrained"]["N"] > p["chosen"]["N"]


def test_plan_names_data_and_the_launch_shape():
    assert "data" in [k for k, _ in plan(4 * 3600, 16, fit="chinchilla", data_tokens=1e9)["binds"]]
    short = plan(900, 16, fit="chinchilla")             # 300 s of training: less than a row per rank by the rule
    _check_rules(short)
    assert short["binding"] == "step time / launch shape"
    assert short["chosen"]["global_batch_tokens"] == short["world"] * short["model"].seq_len


def test_plan_refuses_impossible_settings():
    with pytest.raises(ValueError, match="start-up"): plan(300, 16, fit="chinchilla")
    with pytest.raises(ValueError, match="1 or 2"): plan(3600, 16, fit="chinchilla", lnc=3)
    with pytest.raises(ValueError, match="chips"): plan(3600, 0, fit="chinchilla")


def test_durations():
    assert [parse_duration(s) for s in ("4h", "30m", "90s", "14400", "1.5h")] == [14400, 1800, 90, 14400, 5400]
    for bad in ("4d", "-1h", "0", "soon"):
        with pytest.raises(ValueError, match="4h, 30m, 90s"): parse_duration(bad)
    for bad in ("-1h", "-5", "0", "0m"):
        with pytest.raises(ValueError, match=f"^--budget {bad}: must be positive"): parse_duration(bad)


def test_cli_plan_prints_the_plan_and_writes_the_preset(tmp_path):
    out = tmp_path / "preset.json"
    r = cli("plan", "--budget", "4h", "--chips", "16", "--out", out)
    assert r.returncode == 0, r.stderr
    for text in ("d_model", "global batch", "roofline estimate", "memory per rank", "fit: L(N, D)",
                 "leave-one-out RMSE", "binding constraint:", "extrapolation:", "reference: Chinchilla",
                 "caveat: extrapolated", "not modelled:"):
        assert text in r.stdout, text
    doc = json.loads(out.read_text())
    assert doc["model"]["d_model"] % 128 == 0 and doc["recipe"] == "kit" and doc["provenance"]["binding"] in BINDINGS


def test_cli_plan_leads_with_the_prediction_and_writes_nothing_unasked(tmp_path, monkeypatch, capsys):
    from neuronfrontier.cli import main
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--budget", "4h"]) == 0
    assert list(tmp_path.rglob("*")) == []                           # no runs/plan/preset.json without --out
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "pass --out FILE to write the preset"
    at = lambda prefix: next(i for i, l in enumerate(lines) if l.lstrip().startswith(prefix))
    assert lines[1].startswith("what the plan can back — step times from a fit of public trn2 PyTorch runs")
    assert at("step time") < at("steps") < at("memory per rank") < at("shape:") < at("d_model") < at("caveat:")
    assert "fit of public PyTorch runs (4 step times" in lines[at("step time")]


def test_cli_plan_bad_budget_is_one_line(tmp_path):
    r = cli("plan", "--budget", "4 days", "--chips", "16", "--out", tmp_path / "p.json")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "4h, 30m, 90s" in r.stderr


def test_plan_step_time_is_the_calibrated_prediction_on_trn2():
    from neuronfrontier.research.calibration import family, fit
    from neuronfrontier.research.cost import step_estimate
    p = plan(4 * 3600, 16, fit="chinchilla")                # the default: the fit of public trn2 PyTorch runs
    c, m = p["chosen"], p["model"]
    a, b = fit(family("compiled"))
    roof = step_estimate(m, c["micro_rows"], m.seq_len, p["world"], kernels=False,
                         accum=c["rows_per_rank"] // c["micro_rows"])["step_s"]
    assert p["calibrated"] and p["step_s"] == pytest.approx(a + b * roof, rel=1e-9)
    assert p["step_s_roofline"] == pytest.approx(roof, rel=1e-9) and p["step_s"] != pytest.approx(p["step_s_mfu"])
    assert p["steps"] == int(p["tokens"] // c["global_batch_tokens"])
    assert p["tokens"] == pytest.approx(p["train_s"] * c["global_batch_tokens"] / p["step_s"], rel=1e-9)
    text = format_plan(p)
    assert "fit of public PyTorch runs (4 step times" in text and "calibrated roofline" in text and "trn2" in text
    assert "fit of public PyTorch runs" in preset(p)["provenance"]["predicted"]["label"]
    assert "predicted from public chip measurements" not in text
    q = plan(4 * 3600, 16, fit="chinchilla", calibrated=False)   # --mfu: the assumed MFU's step
    assert q["step_s"] == pytest.approx(max(q["step_s_mfu"], q["step_s_roofline"]))
    assert "assumed 30% MFU" in format_plan(q)
