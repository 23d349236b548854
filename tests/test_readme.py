"""The README against what the code says: its presets table is `neuronfrontier info`'s, its trn2 expectations are
`info --config trn2-124m`'s prediction, and its first screen gives both readers their commands (issue 40)."""
import re
from functools import cache

from conftest import ROOT, cli

README = (ROOT / "README.md").read_text()
FIRST_SCREEN = 70   # lines: what a newcomer reads before scrolling far


@cache
def _info(*args) -> str:
    r = cli("info", *args, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_presets_table_is_what_info_prints():
    m = re.search(r"<!-- presets: neuronfrontier info -->\n```\n(.*?)\n```\n<!-- /presets -->", README, re.S)
    assert m, "README.md lost its presets block"
    assert m.group(1) == _info().rstrip("\n"), "README's presets table is stale: paste `neuronfrontier info`"


def test_every_parameter_count_in_the_readme_is_one_info_prints():
    "A count of millions in the sentence that names a preset (`dense-124m` ... 97.5M) is one of info's columns."
    table = _info()
    presets = [l.split()[0] for l in table.splitlines()[1:]]
    said = [(name, c) for name in presets
            for c in re.findall(rf"`{re.escape(name)}`[^.`]{{0,200}}?\b(\d+(?:\.\d+)?M)\b", README)]
    assert said, "no parameter counts found"
    assert not [(n, c) for n, c in said if not re.search(rf"^{re.escape(n)}\s.*\b{re.escape(c)}", table, re.M)], said


def test_the_trn2_expectations_are_infos_prediction():
    out = _info("--config", "trn2-124m")
    line = next(l for l in out.splitlines() if "PyTorch's ops:" in l)
    steps, bpb = re.search(r"([\d,]+ steps \([\d,]+–[\d,]+\)).*?val_bpb ([\d.]+ \([\d.]+–[\d.]+\))", line).groups()
    trn2 = README.split("## On a trn2 machine")[1].split("\n## ")[0]
    assert steps.replace(" steps", "") in trn2 and bpb in trn2, (steps, bpb)
    params = re.search(r"^trn2-124m\s+([\d.]+M)", out, re.M).group(1)
    assert params in trn2


def test_the_first_screen_serves_both_readers():
    head = "\n".join(README.splitlines()[:FIRST_SCREEN])
    for needed in ("python prepare.py setup", "neuronfrontier export", "neuronfrontier check",
                   "NEURON_LOGICAL_NC_CONFIG=1 torchrun --standalone --nproc_per_node=8 train.py",
                   "make speedrun", "make test", "docs/glossary.md", "docs/competition.md"):
        assert needed in head, f"the README's first {FIRST_SCREEN} lines lack {needed!r}"


def test_no_changelog_prose_in_the_readme():
    for phrase in ("previous release", "the previous default", "an earlier version", "the issue asked",
                   r"git [0-9a-f]{7}\b", "no longer makes", "before `auto`"):
        assert not re.search(phrase, README), phrase


def test_the_recipe_flag_names_every_recipe():
    "`--recipe`'s help lists every recipe a run can name (trn2 included), so `export --help` shows the trn2 one."
    from neuronfrontier.engine.config import RECIPES
    from neuronfrontier.run.flags import FLAGS
    helps = [spec["help"] for group in FLAGS.values() for flag, spec in group.items() if flag == "--recipe"]
    assert helps and all(re.search(rf"\b{re.escape(r)}\b", h) for h in helps for r in RECIPES), (helps, list(RECIPES))
