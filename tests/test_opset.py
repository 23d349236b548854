"A model owns its op set: which backend an op runs on is the model's, not the process's (issue 52)."
import torch

from neuronfrontier import ops
from neuronfrontier.engine.config import resolve
from neuronfrontier.engine.model import GPT


def _model(kernels):
    mcfg, _ = resolve("cpu-micro")
    torch.manual_seed(0)
    return GPT(mcfg, kernels=kernels)


def test_no_process_wide_backend_switch():
    for name in ("set_backend", "use_backend", "pin_backends", "backend_asked", "backend_table", "set_fallback"):
        assert not hasattr(ops, name), f"ops.{name} is a process-wide switch"
    assert "spec" not in ops._state and "fallback" not in ops._state


def test_two_models_run_their_own_kernels_side_by_side():
    calls = []
    def standin(q, k, v, causal=True, window=None):   # the simulator's attention stand-in: records, runs PyTorch
        calls.append(tuple(q.shape))
        return ops.attention_torch(q, k, v, causal, window)
    sim, plain = _model("attention=nki-sim"), _model(None)
    x = torch.randint(0, sim.cfg.vocab_size, (1, 128))
    ops.load_kernels()   # the kernel modules register themselves when first loaded: before the stand-in goes in
    with ops.replaced({"attention": standin}, backend="nki-sim"):
        plain.loss(x, x)
        assert calls == []                                    # the auto model never reaches the nki-sim backend
        sim.loss(x, x)
        assert len(calls) == sim.cfg.n_layers                 # every layer of the other one does
        plain.loss(x, x)
        assert len(calls) == sim.cfg.n_layers                 # and running it changed nothing for the first
    assert all(m.opset is sim.opset for m in sim.modules() if "opset" in vars(m))
    assert ops.AUTO.asked == ops.parse_backend("auto")


def test_using_swaps_the_op_set_for_a_block_only():
    m = _model("torch")
    own = m.opset
    with m.using(ops.OpSet("attention=nki-sim")):
        assert m.blocks[0].attn.opset.asked["attention"] == "nki-sim"
    assert m.opset is own and m.blocks[0].attn.opset is own


def test_a_failing_kernel_falls_back_on_its_own_op_set():
    with ops.isolated():
        ops.register("rms_norm", "nki")(lambda x, w=None, eps=1e-6: 1 / 0)
        flaky, other = ops.OpSet("rms_norm=nki"), ops.OpSet("rms_norm=nki")
        x = torch.randn(2, 128)
        y = ops.rms_norm(x, None, opset=flaky)
        torch.testing.assert_close(y, ops.rms_norm_torch(x, None, 1e-6))
        assert flaky.asked["rms_norm"] == "torch" and "ZeroDivisionError" in flaky.fell_back["rms_norm"]
        assert other.asked["rms_norm"] == "nki" and other.fell_back == {}


def test_isolated_undoes_what_a_block_did_to_auto():
    "A kernel given up by a call that named no op set changes `AUTO`; `isolated` (every fault test's guard) undoes it."
    with ops.isolated():
        ops.AUTO.asked = {**ops.AUTO.asked, "rms_norm": "torch"}
        ops.AUTO.fell_back["rms_norm"] = "RuntimeError: a test's failing kernel"
    assert ops.AUTO.asked == ops.parse_backend("auto") and ops.AUTO.fell_back == {}


def test_a_model_takes_an_op_set_by_its_spec_and_says_what_runs():
    "`using('torch')` runs the model on PyTorch's ops for a block; `spec` and `fallbacks` say what runs and why not."
    m = GPT(resolve("cpu-micro")[0], kernels="attention=nki-sim")
    with m.using("torch"):
        assert set(m.opset.asked.values()) == {"torch"} and m.blocks[0].attn.opset is m.opset
    assert m.opset.asked["attention"] == "nki-sim" and m.opset.spec("cpu").startswith("rms_norm=torch, ")
    m.opset.fell_back["attention"] = "it raised"
    assert m.opset.fallbacks()["attention"] == "it raised"
