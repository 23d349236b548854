"""Issue 36's measures as a gate: settings in small groups, modules and functions of a readable length, notebooks in
small exported cells, the ops table touched by ops alone; `--set` reaches every setting; every flag has help."""
import argparse, contextlib, importlib.util, io
from dataclasses import fields, replace
from pathlib import Path
import pytest
from neuronfrontier.engine.config import ModelConfig, TrainConfig, apply_overrides
from neuronfrontier.engine.settings import setting_fields

_spec = importlib.util.spec_from_file_location("house", Path(__file__).resolve().parent.parent / "tools" / "house.py")
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)


@pytest.mark.parametrize("name", ["dataclass fields", "module lines", "function lines (no kernels)",
                                  "mean exported cell"])
def test_within_the_house_limits(name):
    limit, worst, over = house.measures()[name]
    assert not over, f"{name}: limit {limit}, over it: {', '.join(over)}"


def test_only_ops_touches_the_dispatch_table():
    assert house.measures()["touch"] == []


def test_set_reaches_every_setting_by_its_name():
    "Every setting of every group, by its flat name: `--set` parses it into its group, and nothing else changes."
    for cls, side in ((ModelConfig, 0), (TrainConfig, 1)):
        assert len(fields(cls)) <= 20 and all(len(fields(t)) <= 20 for t in cls._group_types.values())
        for name, f in setting_fields(cls).items():
            base = (ModelConfig(), TrainConfig())
            v, text = getattr(base[side], name), base[side].text(name)   # a text format: as files write it
            new = "none" if text is None else str(text)
            out = apply_overrides(*base, [f"{name}={new}"])[side]
            assert getattr(out, name) == v and out == base[side], name
            assert getattr(getattr(out, cls._owner[name]), name) == v


def test_groups_are_copied_not_shared():
    t = TrainConfig(muon_lr=0.04)
    u = replace(t, batch_size=3)
    u.muon_lr = 0.01
    assert (t.muon_lr, t.batch_size, u.muon.muon_lr, u.batch.batch_size) == (0.04, 16, 0.01, 3)
    assert TrainConfig(**t.flat()) == t and ModelConfig(**ModelConfig(d_model=256).flat()).d_model == 256
    with pytest.raises(TypeError, match="unexpected keyword argument 'muon_rate'"): TrainConfig(muon_rate=1)


def _parsers():
    from neuronfrontier.cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_flag_of_every_command_has_help():
    missing = [f"{cmd} {a.option_strings or a.dest}" for cmd, p in _parsers().items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]
    assert missing == []


def test_the_submission_parses_the_shared_flags(monkeypatch):
    "An exported train.py's flags are the CLI's (`flags.FLAGS`): the same types and destinations, its defaults."
    from neuronfrontier.submission import entry as submission
    monkeypatch.setenv("NF_SEED", "7")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit): submission.submission_main(["--help"])
    text = out.getvalue()
    for title in ("files:", "clock:", "what to train:", "machines:"): assert title in text
    train = _parsers()["train"]
    seen = {a.dest: a for a in train._actions}
    for flag, dest, typ in (("--budget", "budget", float), ("--steps", "steps", int), ("--seed", "seed", int)):
        assert seen[dest].type is typ and flag in seen[dest].option_strings
    assert "[NF_SEED]" in text and "[NF_BUDGET]" in text


def test_a_bad_environment_default_is_one_line(monkeypatch, capsys):
    "NF_SEED that is not a number: argparse's one-line error and exit code 2, not a traceback while the parser is built."
    from neuronfrontier.submission import entry as submission
    monkeypatch.setenv("NF_SEED", "abc")
    with pytest.raises(SystemExit) as e: submission.submission_main(["--steps", "1"])
    assert e.value.code == 2 and "argument --seed: invalid int value: 'abc'" in capsys.readouterr().err


def test_notebook_numbers_give_the_reading_order():
    "No two notebooks share a number, and the library's trainer is not named like the exported train.py."
    assert house.measures()["shared numbers"] == []
    assert not (house.PKG / "train.py").exists() and (house.PKG / "run" / "trainer.py").exists()
