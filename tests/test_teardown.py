"""Every rank exits 0 (issue 51): the export's launch line, launched back to back, ends with every rank at exit 0 and a
loadable final.pt; a finalizer that aborts at interpreter exit cannot take a rank down; a rank that fails on purpose
exits with its own code and reason; `check`'s kit run names a teardown abort (nbs/31_distributed, nbs/97_contract)."""
import sys

import pytest

from conftest import ROOT
from neuronfrontier.submission import contract as C
from test_check import HAND, _write

sys.path.insert(0, str(ROOT / "benchmarks"))
import soak  # noqa: E402

LAUNCHES = 20
# what a gloo worker does when it releases a collective's tensor during interpreter finalization, made certain: an
# object whose finalizer aborts the process; and an atexit handler, the organisers' own clean-up, that must still run
RACE = '''

import atexit as _atexit, os as _os
class _Race:
    def __del__(self): _os.abort()
_race = _Race()
_atexit.register(lambda: open("atexit_ran_" + _os.environ.get("RANK", "0"), "w").close())
'''


def _export_launch(ranks=2, fault="") -> dict:
    return dict(what="export", ranks=ranks, load=False, fault=fault, expect="")


@pytest.fixture(scope="module")
def site(pydocs, tmp_path_factory):
    "cpu-micro exported and laid out beside the stand-in prepare.py, with a 6 s budget (1 s of training)."
    return soak.Soak(pydocs, tmp_path_factory.mktemp("soak"), standin_budget_s=6.0, eval_tokens=4096)


def test_the_launch_line_ends_with_every_rank_at_0(site):
    "LAUNCHES launches of the export's launch line at 2 ranks: every rank exits 0, final.pt loads and scores."
    recs = [site.launch(i, _export_launch()) for i in range(LAUNCHES)]
    print(soak.HEADER, *map(soak.row, recs), sep="\n")
    assert all(r["ok"] for r in recs), [soak.row(r) for r in recs if not r["ok"]]


def test_a_finalizer_that_aborts_cannot_take_a_rank_down(site):
    """The export's prepare.py gains an object whose finalizer aborts the process at interpreter exit, and an atexit
    handler: every rank still exits 0 (the interpreter is never finalized) and every rank's handler ran."""
    prepare = site.sub / "prepare.py"
    before = prepare.read_text()
    try:
        prepare.write_text(before + RACE)
        rec = site.launch(0, _export_launch())
    finally:
        prepare.write_text(before)
    print(soak.row(rec))
    assert rec["ok"] and rec["rank_exits"] == {0: 0, 1: 0}, soak.row(rec)
    assert all((site.sub / f"atexit_ran_{r}").exists() for r in (0, 1))


def test_a_rank_that_fails_exits_with_its_own_code_and_reason(site):
    "NF_FAULT=bogus: a rank exits 2 with the one-line reason (the other too, or stopped by torchrun), none aborts."
    rec = site.launch(0, _export_launch(fault="bogus"))
    print(soak.row(rec))
    assert rec["ok"] and 2 in rec["rank_exits"].values() and not rec["final_pt"], soak.row(rec)
    assert len(rec["reasons"]) == 1   # every rank that says why says the same one line
    assert rec["reasons"][0].startswith("error: NF_FAULT='bogus': cannot read 'bogus'; use nan@STEP, kernel-error:OP")


def test_check_names_a_teardown_abort(pydocs, tmp_path):
    """A hand-written submission that leaves through Python's own exit, with the race made certain: the kit run fails
    and says that a rank aborted after final.pt was written, in the teardown."""
    src = HAND.split("        # A gloo worker thread")[0] + RACE
    d = _write(tmp_path / "hand", src)
    ok, why, ck = C.kit_run(d, pydocs, pydocs / "tokenizer", tmp_path / "work")
    print(why)
    assert ok is False and ck is None
    assert "aborted after final.pt was written: teardown" in why and "run_then_exit" in why, why
