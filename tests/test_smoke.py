"""Import every exported module and call something in each.

A name that an exported function uses but only a notebook cell imports (`neuronfrontier.research.diagnostics` once used
`math`, `Path`, `resolve` and `time` that way) works in the notebook and raises NameError in the library. The static
check in `make test` (ruff F821) finds such names; this test runs the code as users import it.
"""
import importlib, pkgutil

import pytest
import torch

import neuronfrontier
from neuronfrontier import ops
from neuronfrontier.engine.config import TrainConfig
from neuronfrontier.chip.testing import rel_err


def _near(a, b, tol=2e-2):
    assert rel_err(a, b) < tol, rel_err(a, b)


def _kernel_op(op, *args, **kw):
    "Run `op` on the NKI simulator and on torch; they agree."
    opset = ops.OpSet(f"{op}=nki-sim")
    assert opset.table()[op] == "nki-sim"
    got = getattr(ops, op)(*args, **kw, opset=opset)
    ref = getattr(ops, op)(*args, **kw, opset=ops.OpSet("torch"))
    _near(got, ref)


def _micro():
    from neuronfrontier.engine.config import CONFIGS
    from neuronfrontier.engine.model import GPT
    torch.manual_seed(0)
    return GPT(CONFIGS["cpu-micro"])


def _diagnostics(data):
    from neuronfrontier.research.diagnostics import attention_logit_max, qk_norm_experiment
    assert len(attention_logit_max(_micro(), torch.randint(0, 8192, (1, 64)))) == 2
    res = qk_norm_experiment(data, steps=2, every=1, config="cpu-micro")
    assert set(res) == {"qk_norm", "no_qk_norm"} and len(res["qk_norm"]["records"]) == 2


def _evaluate(data):
    from neuronfrontier.data.evaluate import evaluate_bpb
    y = torch.randint(0, 8192, (1, 16))
    assert 0 < evaluate_bpb(lambda x: torch.zeros(*x.shape, 8192), [(y, y)], torch.ones(8192, dtype=torch.int32)) < 14


def _clock(data):
    from neuronfrontier.run.clock import pick_device, hw_name
    from neuronfrontier.hw import logical_cores as logical_nc_config
    assert hw_name(pick_device("cpu")) == "cpu" and logical_nc_config() in (1, 2)


def _checkpoint(data):
    import pathlib, tempfile
    from neuronfrontier.run.checkpoint import save_model, load_for_eval
    m = _micro()
    path = save_model(pathlib.Path(tempfile.mkdtemp()) / "final.pt", m)
    idx = torch.randint(0, 8192, (1, 16))
    assert torch.equal(load_for_eval(path, torch.device("cpu"))(idx), m.eval()(idx))


def _averaging(data):
    from neuronfrontier.engine.averaging import WeightEma
    m = _micro()
    ema = WeightEma(m, 0.99, 32)
    ema.after_step(m, 31)
    assert ema.updates == 1 and ema.finite()


def _train(data):
    from neuronfrontier.engine.config import resolve
    from neuronfrontier.engine.optim import build_optimizers
    from neuronfrontier.run.trainer import train_step
    m, tcfg = _micro(), resolve("cpu-micro")[1]
    batches = iter(lambda: (torch.randint(0, 8192, (1, 16)),) * 2, None)
    assert torch.isfinite(train_step(m, build_optimizers(m, tcfg, print_table=False), batches, tcfg, 0.5,
                                     torch.device("cpu")))


def _sim(data):
    from neuronfrontier.sim import last_trace
    _kernel_op("rms_norm", torch.randn(128, 128), torch.ones(128))  # a kernel through the simulator leaves its trace
    assert last_trace() is not None


def _sim_isa(data):
    from neuronfrontier.sim.trace import full
    from neuronfrontier.sim.isa import _OPS, tensor_tensor
    a = full((128, 4), 2.0, "float32")
    tensor_tensor(a, a, a, _OPS["multiply"])  # one Vector instruction, outside a kernel
    assert a._data.min() == a._data.max() == 4.0


def _sim_language(data):
    from neuronfrontier.sim.language import jit, dry_run, emu_nl as nl

    @jit
    def copy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out
    assert dry_run(copy)(torch.zeros(128, 4)).dma_count == 2


def _moe(data):
    from dataclasses import replace
    from neuronfrontier.engine.config import CONFIGS
    from neuronfrontier.engine.model import GPT
    torch.manual_seed(0)
    m = GPT(replace(CONFIGS["cpu-micro"], n_experts=4, top_k=2, d_expert=128))
    x = torch.randint(0, 8192, (1, 128))
    assert torch.isfinite(m.loss(x, x)) and set(m.moe_stats()) >= {"moe_load", "moe_imbalance", "moe_dropped"}


def _bundler(data):
    from neuronfrontier.submission.bundler import bundle
    assert "def load_for_eval(" in bundle("cpu-micro", data_dir=data, tokenizer_dir=data / "tokenizer")


def _kit_prepare(data):
    import os
    from neuronfrontier.submission import kit_prepare as K
    os.environ["NEURON_COMPETITION_R1_CACHE_DIR"] = str(data)
    try:
        x, y, state = next(K.make_dataloader(K.ensure_tokenizer(), 2, 64, "train", "cpu"))
        assert x.shape == y.shape == (2, 64) and state == {"epoch": 0}
    finally: del os.environ["NEURON_COMPETITION_R1_CACHE_DIR"]


def _contract(data):
    from neuronfrontier.submission.shipping import launch_line
    from neuronfrontier.submission.contract import check_launch
    assert check_launch(launch_line(8, 1))[0]


def _submission(data, tmp=None):
    import tempfile
    from neuronfrontier.submission.entry import submission_main
    with tempfile.TemporaryDirectory() as out:   # a missing data directory: the one-line error, exit code 2
        assert submission_main(["--data", f"{out}/none", "--tokenizer", str(data / "tokenizer"), "--out", out,
                                "--steps", "1", "--quiet", "--device", "cpu"]) == 2


def _torchneuron(data):
    from neuronfrontier.chip.torchneuron import TorchNeuronStandIn
    from neuronfrontier.kernels import rmsnorm
    tnx = TorchNeuronStandIn()
    try:
        assert rmsnorm._register_nki(tnx.module)
        got = ops.rms_norm(torch.randn(128, 128, generator=g), torch.ones(128), opset=ops.OpSet("rms_norm=nki"))
        assert got.shape == (128, 128) and [c.kernel for c in tnx.calls] == ["rmsnorm_fwd_kernel"]
    finally:
        ops._IMPLS["rms_norm"].pop("nki", None)


def _tune(data):
    from neuronfrontier.research.tune import decide, step_times, summary
    v = lambda name, ops_, s: dict(name=name, ops=ops_, k=1, median_s=s, status="ok", why="")
    assert decide([v("torch k=1", [], 1.0), v("swiglu k=1", ["swiglu"], 0.9)], ["swiglu"], 1)[1] == ("swiglu",)
    assert summary([]) == (None, None) and callable(step_times)


def _rehearsal(data):
    from neuronfrontier.submission.rehearsal import hbm_per_rank, trn2_backends
    assert hbm_per_rank(2) == 2 * hbm_per_rank(1) and trn2_backends(ops.parse_backend, "auto").startswith("rms_norm=nki")


def _core(data):
    import tempfile
    from neuronfrontier.research.core import write_sample_bundle, byte_tokenizer, bigram_model, evaluate_core
    with tempfile.TemporaryDirectory() as d:   # the sample bundle: CORE = 22/45 by hand (notebook 38_core)
        res = evaluate_core(bigram_model(), byte_tokenizer(), write_sample_bundle(d), "cpu", log=lambda *a: None)
    assert abs(res["core"] - 22 / 45) < 1e-9


def _cli(data):
    from neuronfrontier.cli import main
    assert main(["info", "--config", "cpu-micro"]) == 0


g = torch.Generator().manual_seed(0)
CALLS = {
    "neuronfrontier._modidx": lambda data: importlib.import_module("neuronfrontier._modidx").d["settings"],
    "neuronfrontier.engine.averaging": _averaging,
    "neuronfrontier.research.calibration": lambda data: importlib.import_module("neuronfrontier.research.calibration").bpb_at(2388),
    "neuronfrontier.run.checkpoint": _checkpoint,
    "neuronfrontier.cli": _cli,
    "neuronfrontier.run.clock": _clock,
    "neuronfrontier.research.core": _core,
    "neuronfrontier.engine.config": lambda data: importlib.import_module("neuronfrontier.engine.config").resolve("cpu-micro"),
    "neuronfrontier.engine.settings": lambda data: importlib.import_module("neuronfrontier.engine.settings").settings_help(
        importlib.import_module("neuronfrontier.engine.config").TrainConfig),
    "neuronfrontier.data.shards": lambda data: importlib.import_module("neuronfrontier.data.shards").load_tokenizer(data / "tokenizer"),
    "neuronfrontier.research.diagnostics": _diagnostics,
    "neuronfrontier.run.distributed": lambda data: importlib.import_module("neuronfrontier.run.distributed").agree_max([1, 2], 1),
    "neuronfrontier.data.evaluate": _evaluate,
    "neuronfrontier.submission.kit_prepare": _kit_prepare,
    "neuronfrontier.hw": lambda data: importlib.import_module("neuronfrontier.hw").mfu(1e5, 6e8, "trn2"),
    "neuronfrontier.chip.neuron": lambda data: importlib.import_module("neuronfrontier.chip.neuron").torch_neuronx_module(),
    "neuronfrontier.engine.precision": lambda data: importlib.import_module("neuronfrontier.engine.precision").choose_precision("auto", "cpu"),
    "neuronfrontier.research.cost": lambda data: importlib.import_module("neuronfrontier.research.cost").kernel_work("rmsnorm", 256, 128),
    "neuronfrontier.kernels": lambda data: importlib.import_module("neuronfrontier.kernels"),
    "neuronfrontier.chip": lambda data: importlib.import_module("neuronfrontier.chip").__doc__,
    "neuronfrontier.data": lambda data: importlib.import_module("neuronfrontier.data").__doc__,
    "neuronfrontier.engine": lambda data: importlib.import_module("neuronfrontier.engine").__doc__,
    "neuronfrontier.research": lambda data: importlib.import_module("neuronfrontier.research").__doc__,
    "neuronfrontier.run": lambda data: importlib.import_module("neuronfrontier.run").__doc__,
    "neuronfrontier.submission": lambda data: importlib.import_module("neuronfrontier.submission").__doc__,
    "neuronfrontier.kernels.attention": lambda data: _kernel_op(
        "attention", *(torch.randn(1, 1, 128, 64, generator=g) for _ in range(3))),
    "neuronfrontier.kernels.cross_entropy": lambda data: _kernel_op(
        "cross_entropy", torch.randn(128, 128, generator=g), torch.randn(256, 128, generator=g) / 8, torch.randint(0, 256, (128,), generator=g)),
    "neuronfrontier.kernels.rmsnorm": lambda data: _kernel_op("rms_norm", torch.randn(128, 128, generator=g), torch.ones(128)),
    "neuronfrontier.kernels.mlp": lambda data: _kernel_op(
        "relu2_mlp", torch.randn(128, 128, generator=g), torch.randn(256, 128, generator=g) / 11,
        torch.randn(128, 256, generator=g) / 16, leak=0.35),
    "neuronfrontier.kernels.moe": lambda data: _kernel_op(
        "moe_mlp", torch.randn(256, 128, generator=g), torch.randn(2, 128, 128, generator=g) / 11, torch.randn(2, 128, 128, generator=g) / 11,
        torch.randn(2, 128, 128, generator=g) / 11, torch.tensor([0, 1])),
    "neuronfrontier.engine.moe": _moe,
    "neuronfrontier.kernels.swiglu": lambda data: _kernel_op(
        "swiglu", torch.randn(128, 128, generator=g), torch.randn(256, 128, generator=g) / 11, torch.randn(256, 128, generator=g) / 11),
    "neuronfrontier.engine.loss": lambda data: importlib.import_module("neuronfrontier.engine.loss").chunked_cross_entropy(
        torch.randn(8, 16), torch.randn(32, 16), torch.randint(0, 32, (8,))),
    "neuronfrontier.engine.model": lambda data: _micro()(torch.randint(0, 8192, (1, 16))),
    "neuronfrontier.ops": lambda data: ops.AUTO.table("cpu"),
    "neuronfrontier.engine.optim": lambda data: importlib.import_module("neuronfrontier.engine.optim").zeropower_via_newtonschulz5(torch.randn(8, 16)),
    "neuronfrontier.research.plan": lambda data: importlib.import_module("neuronfrontier.research.plan").parse_duration("4h") == 14400,
    "neuronfrontier.sim": _sim,
    "neuronfrontier.sim.tensor": lambda data: importlib.import_module("neuronfrontier.sim.tensor")._dtype("bfloat16"),
    "neuronfrontier.sim.trace": lambda data: importlib.import_module("neuronfrontier.sim.trace").zeros((128, 4), "float32"),
    "neuronfrontier.sim.isa": _sim_isa,
    "neuronfrontier.sim.pe": lambda data: importlib.import_module("neuronfrontier.sim.pe")._MM_DTYPES >= {"bfloat16", "float32"},
    "neuronfrontier.sim.language": _sim_language,
    "neuronfrontier.chip.torchneuron": _torchneuron,
    "neuronfrontier.submission.rehearsal": _rehearsal,
    "neuronfrontier.run.resilience": lambda data: importlib.import_module("neuronfrontier.run.resilience").parse_faults("nan@3").nan_at == 3,
    "neuronfrontier.dashboard": lambda data: importlib.import_module("neuronfrontier.dashboard").run_summary(data, "pydocs", False),
    "neuronfrontier.dashboard.runs": lambda data: importlib.import_module("neuronfrontier.dashboard.runs").list_runs(data),
    "neuronfrontier.dashboard.kernels": lambda data: importlib.import_module("neuronfrontier.dashboard.kernels").downsample_timeline(
        [(0, 1, 0), (1, 3, 2)], max_points=1)["sbuf"] == [3],
    "neuronfrontier.dashboard.judge": lambda data: importlib.import_module("neuronfrontier.dashboard.judge").result_label({"meta": {}}) is not None,
    "neuronfrontier.dashboard.launcher": lambda data: importlib.import_module("neuronfrontier.dashboard.launcher").BUDGETS[0] == 10,
    "neuronfrontier.dashboard.server": lambda data: importlib.import_module("neuronfrontier.dashboard.server").static_dir().is_dir(),
    "neuronfrontier.run.flags": lambda data: importlib.import_module("neuronfrontier.run.flags").flag_group("clock", "--steps")[1],
    "neuronfrontier.submission.entry": _submission,
    "neuronfrontier.data.batches": lambda data: list(importlib.import_module("neuronfrontier.data.batches").Prefetcher(iter(range(3)), 1)) == [0, 1, 2],
    "neuronfrontier.submission.bundler": _bundler,
    "neuronfrontier.submission.shipping": lambda data: importlib.import_module("neuronfrontier.submission.shipping").launch_line(4, 2).startswith(
        "NEURON_LOGICAL_NC_CONFIG=2 "),
    "neuronfrontier.submission.contract": _contract,
    "neuronfrontier.research.tune": _tune,
    "neuronfrontier.research.sweep": lambda data: importlib.import_module("neuronfrontier.research.sweep").grid_settings(
        importlib.import_module("neuronfrontier.research.sweep").parse_grid(["lr=1e-3,2e-3"])),
    "neuronfrontier.chip.testing": lambda data: importlib.import_module("neuronfrontier.chip.testing").compare_backends(
        "rms_norm", torch.randn(128, 128, generator=g), torch.ones(128), backend="torch"),
    "neuronfrontier.run.trainer": _train,
    "neuronfrontier.engine.sources": lambda data: importlib.import_module("neuronfrontier.engine.sources").setting_sources(
        "trn2-124m", model=True)[1][1] == 1024,
    "neuronfrontier.engine.phases": lambda data: importlib.import_module("neuronfrontier.engine.phases").batch_phase(
        TrainConfig(grad_accum=4, batch_warmup="0.5:0.25:0.35"), 0.1) == (1, 0.35),
    "neuronfrontier.run.spikes": lambda data: importlib.import_module("neuronfrontier.run.spikes").spike_path(
        [9, 8, 7, 6, 5, 6], 0.5),
}
MODULES = sorted(m.name for m in pkgutil.walk_packages(neuronfrontier.__path__, "neuronfrontier."))


def test_every_module_has_a_smoke_call():
    assert MODULES == sorted(CALLS)


@pytest.mark.parametrize("name", MODULES)
def test_import_and_call(name, pydocs):
    importlib.import_module(name)
    CALLS[name](pydocs)
