"""The facts the project cites live inside the repository: every `docs/…md` path the README, the notebooks and the
package mention exists, every CHIP_EVIDENCE section they cite is a section of docs/chip_evidence.md, and nothing
points outside the repository to the shared folder the facts were first kept in."""
import re
from pathlib import Path

from conftest import ROOT

DOCS = ROOT / "docs"
OUTSIDE = "../" + "shared/"   # spelled in two parts so this file does not cite it
# Our docs are lower case (docs/README.md aside); an upper-case name such as FrontierForge's `docs/FINDINGS.md`
# belongs to another repository and is not checked.
DOC_PATH = re.compile(r"(?<![\w./-])docs/((?:[a-z0-9_]+|README)\.md)")
SECTION_REF = re.compile(r"docs/([a-z0-9_]+\.md)`?,\s*\*([^*\n]+)\*")
# "CHIP_EVIDENCE 5", "CHIP_EVIDENCE §2", "CHIP_EVIDENCE 4, 5", "CHIP_EVIDENCE 4-5", "`CHIP_EVIDENCE.md` 3–5",
# "CHIP_EVIDENCE sections 2 and 3", "CHIP_EVIDENCE section 2", "`docs/chip_evidence.md` §4–5"
CHIP_REF = re.compile(r"(?:CHIP_EVIDENCE(?:\.md)?|docs/chip_evidence\.md)`?\s*(?:§\s*|sections?\s+)?"
                      r"(\d+(?:\s*(?:,|-|–|and)\s*\d+)*)")


def sources(*patterns):
    "The text of every file under ROOT matching `patterns`, by path (this file excluded)."
    return {p: p.read_text(encoding="utf-8", errors="replace") for pat in patterns for p in sorted(ROOT.glob(pat))
            if p.is_file() and p.resolve() != Path(__file__).resolve()}


def cited_sections(text):
    "Every section number a CHIP_EVIDENCE citation in `text` names, ranges expanded."
    out = set()
    for m in CHIP_REF.finditer(text):
        for part in re.split(r"\s*(?:,|and)\s*", m.group(1)):
            ends = [int(x) for x in re.split(r"\s*[-–]\s*", part)]
            out.update(range(ends[0], ends[-1] + 1))
    return out


def headings(path):
    return re.findall(r"^#+ (.+?)\s*$", path.read_text(encoding="utf-8"), flags=re.M)


def test_cited_docs_exist():
    cited = [(p, name) for p, text in sources("README.md", "nbs/*.ipynb", "neuronfrontier/**/*.py").items()
             for name in DOC_PATH.findall(text)]
    assert cited, "no docs/ citation found: the notebooks cite docs/competition.md"
    missing = [f"{p.relative_to(ROOT)}: docs/{name}" for p, name in cited if not (DOCS / name).is_file()]
    assert not missing, f"cited but not in the repository: {missing}"


def test_cited_doc_sections_exist():
    "A citation `docs/X.md`, *Heading* names a heading of X."
    refs = [(p, name, head) for p, text in sources("README.md", "nbs/*.ipynb", "neuronfrontier/**/*.py").items()
            for name, head in SECTION_REF.findall(text)]
    assert refs, "no section citation found: 92_rehearsal cites docs/competition.md, *Memory of one chip*"
    bad = [f"{p.relative_to(ROOT)}: docs/{name}, {head}" for p, name, head in refs
           if not (DOCS / name).is_file() or head.strip() not in headings(DOCS / name)]
    assert not bad, f"no such section: {bad}"


def test_chip_evidence_sections_exist():
    have = {int(n) for n in re.findall(r"^## (\d+)\.", (DOCS / "chip_evidence.md").read_text(encoding="utf-8"),
                                        flags=re.M)}
    assert have == set(range(8)), f"chip_evidence.md sections: {sorted(have)}"
    cited = {p.relative_to(ROOT): cited_sections(text)
             for p, text in sources("README.md", "nbs/*.ipynb", "neuronfrontier/**/*.py", "benchmarks/**/*.py",
                                    "tests/*.py").items()}
    assert any(cited.values())
    bad = {str(p): sorted(n - have) for p, n in cited.items() if n - have}
    assert not bad, f"CHIP_EVIDENCE sections cited but missing from docs/chip_evidence.md: {bad}"


def test_bare_names_resolve():
    "Code cites the two fact files by their old names; the titles carry those names."
    assert headings(DOCS / "chip_evidence.md")[0].startswith("CHIP_EVIDENCE")
    assert headings(DOCS / "competition.md")[0].startswith("COMPETITION")


def test_citation_parser():
    assert cited_sections("(CHIP_EVIDENCE 1, PD); CHIP_EVIDENCE §2 N; CHIP_EVIDENCE 4-5") == {1, 2, 4, 5}
    assert cited_sections("`CHIP_EVIDENCE.md` 3–5, CHIP_EVIDENCE sections 6 and 7; CHIP_EVIDENCE key, n") == {
        3, 4, 5, 6, 7}
    assert cited_sections("(`docs/chip_evidence.md` §4–5)") == {4, 5}
    assert DOC_PATH.findall("their `docs/FINDINGS.md`; `docs/competition.md`; _docs/x.md") == ["competition.md"]


def test_nothing_points_outside():
    bad = [str(p.relative_to(ROOT)) for p, text in
           sources("README.md", "nbs/*.ipynb", "neuronfrontier/**/*.py", "benchmarks/**/*", "tests/**/*.py",
                   "docs/**/*.md").items() if OUTSIDE in text]
    assert not bad, f"files that cite {OUTSIDE} (outside the repository): {bad}"
