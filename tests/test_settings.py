"""Issue 52's settings test: every setting has one description (its `setting` declaration), which `train --help` and
`info` print; every text-format setting is parsed once, when it is set, into a typed value, and a bad value fails at
config time naming the setting; every setting's own check is wired into `resolve`."""
import contextlib, inspect, io, re
from pathlib import Path
import pytest
from neuronfrontier.engine import config
from neuronfrontier.engine.config import ModelConfig, TrainConfig, apply_overrides, resolve
from neuronfrontier.engine.settings import setting_fields

SETTINGS = {**setting_fields(ModelConfig), **setting_fields(TrainConfig)}
TEXT = {k: f for k, f in SETTINGS.items() if f.metadata["parse"]}
# a malformed value for every text-format setting (a new one must add its own here)
BAD_TEXT = {"ve_layers": "0,x", "attn_source": "2:1", "window_pattern": "SXL", "moe_layers": "x:",
            "batch_warmup": "0.2:0.5", "mtp_weights": "1,a", "mtp_fade": "0.45,0.2", "adam_groups": "wte:0.8:0.9:0",
            "kernels": "attention=cuda"}
GOOD_TEXT = {"ve_layers": "0,1", "attn_source": "0:1", "window_pattern": "SL", "moe_layers": "1:",
             "batch_warmup": "0.06:0.25:0.35,0.2:0.5:0.6", "mtp_weights": "1,0.5", "mtp_fade": "0.45",
             "adam_groups": "embed:0.8:0.995:0.001", "kernels": "rms_norm=torch,attention=nki"}


def _norm(text: str) -> str: return " ".join(text.split())


def test_every_setting_has_one_description():
    "A non-empty description in its declaration, no two alike, and no second copy in a comment beside the field."
    docs = [f.metadata["doc"] for f in SETTINGS.values()]
    assert all(d and d.strip() == d for d in docs)
    assert len(set(docs)) == len(docs), [d for d in docs if docs.count(d) > 1]
    for cls in (ModelConfig, TrainConfig):
        for kind in cls._group_types.values():
            src = inspect.getsource(kind)
            comments = [line for line in src.splitlines() if line.strip().startswith("#") or " # " in line]
            assert not comments, f"{kind.__name__} describes a setting outside its declaration: {comments[0]}"


def test_help_and_info_print_each_description():
    from neuronfrontier.cli import build_parser, main
    train_help = _norm(build_parser()._subparsers._group_actions[0].choices["train"].format_help())
    out = io.StringIO()
    with contextlib.redirect_stdout(out): main(["info", "--config", "cpu-micro"])
    info = _norm(out.getvalue())
    for name, f in SETTINGS.items():
        assert _norm(f.metadata["doc"]) in train_help, name
        assert _norm(f.metadata["doc"]) in info, name


def test_every_text_setting_is_parsed_once_into_a_typed_value():
    "Set by `--set`, a text format holds a typed value (not its text) and writes the same text back to files."
    assert set(TEXT) == set(BAD_TEXT) == set(GOOD_TEXT)
    for name, text in GOOD_TEXT.items():
        m, t = apply_overrides(ModelConfig(), TrainConfig(), [f"{name}={text}"])
        cfg = m if name in setting_fields(ModelConfig) else t
        value = getattr(cfg, name)
        assert name == "window_pattern" or not isinstance(value, str), (name, value)
        assert cfg.text(name) == text and cfg.flat()[name] == text
        assert type(cfg)(**cfg.flat()) == cfg   # a file's record reads back to the same typed value


@pytest.mark.parametrize("name", sorted(BAD_TEXT))
def test_a_bad_text_value_fails_at_config_time_naming_the_setting(name):
    with pytest.raises(ValueError, match=rf"^{name}='{re.escape(BAD_TEXT[name])}' "):
        apply_overrides(ModelConfig(), TrainConfig(), [f"{name}={BAD_TEXT[name]}"])


def test_no_module_parses_a_text_setting_again():
    "Consumers read the typed value: no `.split(` or `str(...)` on a text-format setting outside its parser."
    pkg = Path(config.__file__).parents[1]
    reparse = re.compile(r"\.(" + "|".join(TEXT) + r")\)?\.split\(|str\(\w+\.(" + "|".join(TEXT) + r")\)")
    hits = [f"{p.relative_to(pkg)}:{i}" for p in pkg.rglob("*.py") if p.name != "_modidx.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if reparse.search(line)]
    assert hits == []


def _refused(f):
    "A value the setting's own check refuses, as `--set` text (None: the check refuses none of the candidates)."
    typ = str(f.type)
    candidates = ["no-such-value"] if typ == "str" else ["-1000000000", "1000000000", "5", "0.5", "0"]
    for raw in candidates:
        value = raw if typ == "str" else float(raw)
        if f.metadata["check"](value): return raw
    return None


@pytest.mark.parametrize("name", sorted(k for k, f in SETTINGS.items() if f.metadata["check"]))
def test_each_check_fails_resolve_with_the_settings_name(name):
    raw = _refused(SETTINGS[name])
    assert raw is not None, f"{name}: no candidate value is refused"
    with pytest.raises(ValueError, match=rf"^{name}="):
        resolve("cpu-micro", None, [f"{name}={raw}"])


def test_a_typed_value_set_directly_is_checked_as_its_text_would_be():
    "A value set as a tuple (not text) passes the same rules at config time, so the file it writes reads back."
    from neuronfrontier.engine.config import validate_train
    from neuronfrontier.engine.settings import WarmupStage, AttnSource
    with pytest.raises(ValueError, match=r"^batch_warmup='0.5:2:0.1' "):
        validate_train(TrainConfig(batch_warmup=(WarmupStage(0.5, 2.0, 0.1),)))
    with pytest.raises(ValueError, match=r"^attn_source='3:1' "):
        ModelConfig(n_layers=4, attn_source=AttnSource(3, (1,))).validate()


def test_a_resume_file_whose_settings_no_longer_read_is_a_different_model(tmp_path):
    import torch
    from neuronfrontier.run.checkpoint import load_resume
    path = tmp_path / "resume.pt"
    torch.save({"model": {}, "model_config": {**ModelConfig().flat(), "moe_layers": "x"}, "optimizers": [],
                "state": {}, "rng": {}}, path)
    with pytest.raises(ValueError, match="was trained with a different model config"): load_resume(path, ModelConfig())


def test_every_presets_flagless_export_fits_the_portal():
    "The bundle empties the settings' descriptions (and docstrings) rather than reach the portal's file limit."
    from neuronfrontier.submission.bundler import bundle, PORTAL_FILE_BYTES
    for preset in ("trn2-124m", "cpu-tiny"):
        src = bundle(preset)
        assert len(src.encode()) < PORTAL_FILE_BYTES, (preset, len(src.encode()))
        compile(src, "train.py", "exec")
