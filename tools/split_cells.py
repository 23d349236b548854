"""Split exported notebook cells that hold several definitions into one cell per definition.

    python tools/split_cells.py nbs/*.ipynb      # rewrites the notebooks in place; prints what it split

A definition (a `def` or `class`, with its decorators) takes the statements and comments just above it (constants it
uses, a comment that introduces it) into its cell; statements after the last definition stay with it. Pieces of one
or two lines join the next piece. Cells with outputs, and cells that do not parse, are left as they are. The exported
module is the same code in the same order (only nbdev's cell markers are added)."""
import ast, json, secrets, sys
from pathlib import Path

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def pieces(body: str) -> list[str]:
    "The source `body` (no directives) cut into one piece per definition."
    try: tree = ast.parse(body)
    except SyntaxError: return [body]
    lines, groups, pending = body.splitlines(), [], []
    for st in tree.body:
        pending.append(st)
        if isinstance(st, DEFS):
            groups.append(pending)
            pending = []
    if pending:
        if groups: groups[-1] += pending
        else: return [body]
    cuts = [0] + [g[-1].end_lineno for g in groups[:-1]] + [len(lines)]
    out = ["\n".join(lines[a:b]).strip("\n") for a, b in zip(cuts, cuts[1:])]
    merged = []
    for p in out:   # a piece of one or two lines joins the next one
        if merged and len(merged[-1].splitlines()) <= 2: merged[-1] = merged[-1] + "\n\n" + p
        else: merged.append(p)
    return [p for p in merged if p.strip()]


def split_notebook(path: Path) -> int:
    "Split the exported cells of the notebook at `path` in place; returns the number of cells added."
    nb = json.loads(path.read_text())
    cells, added = [], 0
    for c in nb["cells"]:
        src = "".join(c["source"])
        lines = src.splitlines()
        head = [l for l in lines[:3] if l.startswith("#|")]
        exported = any(l.split()[1:2] in (["export"], ["exporti"]) for l in head)
        if c["cell_type"] != "code" or not exported or c.get("outputs") or lines[:len(head)] != head:
            cells.append(c)
            continue
        parts = pieces("\n".join(lines[len(head):]))
        for i, p in enumerate(parts):
            new = dict(c, source=("\n".join(head) + "\n" + p).splitlines(keepends=True))
            if i: new["id"] = secrets.token_hex(4)
            cells.append(new)
        added += len(parts) - 1
    if added:
        nb["cells"] = cells
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return added


if __name__ == "__main__":
    for name in sys.argv[1:]:
        if n := split_notebook(Path(name)): print(f"{name}: {n} cells added")
