"""Issue 37's levers, each against a direct computation: a test fails without the lever."""
import pytest
import torch
import torch.nn.functional as F
from neuronfrontier import ops
from neuronfrontier.config import ModelConfig, resolve
from neuronfrontier.model import GPT


def test_leaky_relu2_forward_and_backward():
    "ops.relu2 with leak α is (max(z, αz))², forward and backward; α = 0 is ReLU² exactly."
    torch.manual_seed(0)
    x = torch.randn(3, 5, 128, requires_grad=True)
    w = (torch.randn(256, 128) / 11).requires_grad_()
    y = ops.relu2(x, w, leak=0.35)
    z = x @ w.T
    ref = torch.where(z > 0, z, 0.35 * z) ** 2
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w), g)
    want = torch.autograd.grad(ref, (x, w), g)
    for a, b in zip(got, want): torch.testing.assert_close(a, b)
    torch.testing.assert_close(ops.relu2(x, w), F.relu(z) ** 2, rtol=0, atol=0)


def test_mlp_leak_reaches_the_model_and_is_checked():
    m, _ = resolve("cpu-micro", "kit", ["mlp_leak=0.35"])
    assert m.mlp_leak == 0.35 and m.arch.mlp_leak == 0.35
    mlp = GPT(m).blocks[0].mlp
    x = torch.randn(2, 4, m.d_model)
    z = x @ mlp.w_up.weight.T
    torch.testing.assert_close(mlp(x), mlp.w_down(torch.where(z > 0, z, 0.35 * z) ** 2))
    with pytest.raises(ValueError, match=r"mlp_leak=-0.1 must lie in \[0, 1\)"):
        ModelConfig(mlp="relu2", mlp_leak=-0.1).validate()


def test_a_resume_checkpoint_from_before_a_new_setting_still_loads(tmp_path):
    "resume.pt written before `mlp_leak` existed (no such key): the default fills it; a different value is refused."
    from neuronfrontier.checkpoint import load_resume
    m, _ = resolve("cpu-micro", "kit")
    old = {k: v for k, v in m.flat().items() if k != "mlp_leak"}
    ck = {"model": {}, "model_config": old, "optimizers": [], "state": {}, "rng": {}}
    torch.save(ck, tmp_path / "resume.pt")
    assert load_resume(tmp_path / "resume.pt", m)["model_config"] == old
    with pytest.raises(ValueError, match="different model config"):
        load_resume(tmp_path / "resume.pt", ModelConfig(**{**m.flat(), "mlp_leak": 0.35}))


def test_value_embeddings_on_chosen_layers():
    "ve_layers lists the layers with a value embedding: the model has those tables and gates, n_params counts them."
    m, _ = resolve("cpu-micro", "kit", ["n_layers=4", "ve_layers=0,3"])
    assert [m.has_ve(i) for i in range(4)] == [True, False, False, True]
    g = GPT(m)
    assert sorted(g.value_embeds) == ["0", "3"]
    assert [b.attn.ve_gate is not None for b in g.blocks] == [True, False, False, True]
    assert m.n_params() == sum(p.numel() for p in g.parameters())
    with pytest.raises(ValueError, match=r"ve_layers='1,9' selects no layer or one outside 0..3"):
        resolve("cpu-micro", "kit", ["n_layers=4", "ve_layers=1,9"])
