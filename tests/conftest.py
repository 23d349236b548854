import os, socket, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pydocs(tmp_path_factory):
    "A freshly prepared copy of the embedded corpus (8 shards + 8k BPE)."
    from neuronfrontier.data.shards import prepare
    return prepare(tmp_path_factory.mktemp("data") / "pydocs", log=lambda *a: None)


def cli(*args, cwd=None, timeout=900, env=None):
    "Run the installed `neuronfrontier` console script (`env`: variables added to this process's); return the CompletedProcess."
    exe = Path(sys.executable).parent / "neuronfrontier"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "neuronfrontier.cli"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout, env=env)


def free_port() -> int:
    "A TCP port on 127.0.0.1 that nothing listens on right now."
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


@pytest.fixture
def fake_torch_neuronx():
    "The TorchNeuron stand-in (neuronfrontier.chip.torchneuron): nki_op and wrap_nki, the kernels in the simulator."
    from neuronfrontier.chip.torchneuron import TorchNeuronStandIn
    return TorchNeuronStandIn().module
