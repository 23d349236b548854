"""The notebooks are read as documents: every one is saved executed, and a cell written to show something (a print, a
plot, a bare value as its last line) shows it. Reads the JSON only (nothing is executed), so it runs in a second.

`nbdev-clean` keeps outputs (it strips execution counts and metadata), so a missing output means the notebook was saved
without running that cell, not that the cleaner took it."""
import ast, json, re
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from conftest import ROOT

NBS = ROOT / "nbs"
NOTEBOOKS = sorted(NBS.glob("*.ipynb"))
KERNEL_NBS = ["17_kernel_rmsnorm", "18_kernel_swiglu", "19_kernel_attention", "20_kernel_cross_entropy",
              "21_kernel_moe", "23_kernel_mlp"]
_DIRECTIVE = re.compile(r"^\s*#\|\s*([\w-]+)", re.M)
_EXPORTED = {"export", "exporti", "exports"}
_NOT_RUN = {"neuron", "cuda"}          # cells that need hardware: skipped when the notebooks are executed here
_NO_EVAL = re.compile(r"^\s*#\|\s*eval:\s*false", re.M | re.I)   # never executed, so never any output
_SHOW_CALLS = {"print", "display", "show", "plot"}


def _src(cell): return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _code_cells(nb): return [c for c in nb["cells"] if c["cell_type"] == "code" and _src(c).strip()]


def _calls_outside_defs(node):
    "The calls a cell's top-level code makes when it runs (not those inside a def, lambda or class body)."
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)): return
    if isinstance(node, ast.Call): yield node
    for child in ast.iter_child_nodes(node): yield from _calls_outside_defs(child)


def _root_name(node):
    "The name a chain of attributes, calls and subscripts starts from (`plt` in `plt.gca().plot`), or None."
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _shows(call):
    "Is this a call whose job is to show something: print/display/show/plot, or anything on `plt`?"
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return name in _SHOW_CALLS or _root_name(f) == "plt"


def show_reason(src):
    "Why a (non-exported, executed) cell with source `src` must have saved output, or None when it need not."
    py = TransformerManager().transform_cell(src)
    try: tree = ast.parse(py)
    except SyntaxError: return None
    if "redirect_stdout" in py: return None      # the cell swallows its own prints on purpose
    calls = list(_calls_outside_defs(tree))
    closes = any(_root_name(c.func) == "plt" and ast.unparse(c.func).endswith(".close") for c in calls)
    for call in calls:      # a cell that closes its figures (to save them to a file) shows none of them
        if _shows(call) and not (closes and _root_name(call.func) == "plt"): return f"calls {ast.unparse(call.func)}("
    last = tree.body[-1] if tree.body else None
    if (isinstance(last, ast.Expr) and not isinstance(last.value, (ast.Call, ast.Await, ast.Yield, ast.Constant))
            and not src.rstrip().endswith(";")):
        return f"ends in the bare expression {ast.unparse(last.value)[:60]!r}"
    return None


def silent_show_cells(nb):
    "(cell index, first line, reason) of each cell that is written to show something and has no saved output."
    bad = []
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] != "code" or c.get("outputs"): continue
        src = _src(c)
        if set(_DIRECTIVE.findall(src)) & (_EXPORTED | _NOT_RUN) or _NO_EVAL.search(src): continue
        why = show_reason(src)
        if why: bad.append((i, next((l for l in src.splitlines() if l.strip() and not l.startswith("#|")), ""), why))
    return bad


def _load(path): return json.loads(path.read_text())


def test_the_notebooks_are_found():
    assert len(NOTEBOOKS) > 40 and all(n in {p.stem for p in NOTEBOOKS} for n in KERNEL_NBS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_saved_executed(path):
    nb = _load(path)
    code = _code_cells(nb)
    assert not code or any(c.get("outputs") for c in code), \
        f"{path.name}: {len(code)} code cells and no saved output: execute it and save (tools/nbsync.py --run)"
    assert not [c for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"], \
        f"{path.name}: a saved output is an error"
    bad = silent_show_cells(nb)
    assert not bad, f"{path.name}: cells written to show something have no saved output:\n" + "\n".join(
        f"  cell {i} ({first[:60]!r}): {why}" for i, first, why in bad)


def _texts(nb):
    "Every text a notebook's saved outputs show: printed streams, text/plain, text/markdown and text/html."
    for c in _code_cells(nb):
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream": yield "text/plain", "".join(o["text"])
            for kind, v in o.get("data", {}).items():
                if kind in ("text/plain", "text/markdown", "text/html"): yield kind, "".join(v)


def _is_table(kind, text, rows=3):
    "A header and at least `rows` rows: HTML <tr>s, or text lines of two or more columns (split by | or 2+ spaces)."
    if kind == "text/html": return text.count("<tr") >= rows + 1
    lines = [l for l in text.splitlines() if len(re.split(r"\s*\|\s*|\s{2,}", l.strip())) >= 2]
    return len(lines) >= rows + 1


@pytest.mark.parametrize("name", KERNEL_NBS)
def test_kernel_notebook_shows_a_table_and_a_plot(name):
    nb = _load(NBS / f"{name}.ipynb")
    assert any(_is_table(k, t) for k, t in _texts(nb)), f"{name}: no saved table (a header and 3+ rows)"
    pngs = [o for c in _code_cells(nb) for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert pngs, f"{name}: no saved plot (an image/png output)"


def test_silent_show_cells():
    "Which cells count: exported, hardware-only and never-evaluated cells are not run here, so they need no output."
    cell = lambda src, outputs=(): dict(cell_type="code", source=src, outputs=list(outputs))
    nb = dict(cells=[cell("print(1)"), cell("print(2)", [{"output_type": "stream", "text": "2"}]),
                     cell("#| export\nx = 1\nx"),
                     cell("#| neuron\nprint(3)"), cell("#| eval: false\nprint(4)"), cell("#| slow\nprint(5)"),
                     dict(cell_type="markdown", source="print(6)")])
    test = [(i, why) for i, _, why in silent_show_cells(nb)]
    assert test == [(0, "calls print("), (5, "calls print(")], test


@pytest.mark.parametrize("src,reason", [
    ("print(1)", "calls print("), ("x = 1\nx", "bare expression"), ("a.b[0]", "bare expression"), ("x == 1", "bare"),
    ("plt.plot([1])", "calls plt.plot("), ("f(x)", None), ("x = 1", None), ("def f():\n    print(1)", None),
    ("x;", None), ("'a docstring'", None), ("%time f(x)", None), ("assert x", None),
    ("with contextlib.redirect_stdout(io.StringIO()): print(1)", None), ("fig.savefig(p)\nplt.close(fig)", None),
    ("plt.gca().plot([1])", "calls plt.gca().plot("), ("ax.plot([1])", "calls ax.plot("),
])
def test_show_reason(src, reason):
    got = show_reason(src)
    assert (got is None) if reason is None else (got is not None and reason in got), (src, got)
