"""Where the code stands against issue 36's measures (settings per dataclass, module and function lengths, exported
notebook cells, who touches the ops dispatch table) and issue 52's (notebooks that share a number, what the trainer
imports, exported cells followed by an example, the package's folders). Prints a table; exits 0 (a report:
`tests/test_house.py` is the gate)."""
import ast, json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "neuronfrontier"
LIMITS = {"dataclass fields": 20, "module lines": 800, "function lines": 80, "mean exported cell": 25}


def dataclasses_(tree) -> list[tuple[str, int]]:
    "(name, fields) of every @dataclass in a module."
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in n.decorator_list):
            out.append((n.name, sum(isinstance(b, ast.AnnAssign) for b in n.body)))
    return out


def functions(tree) -> list[tuple[str, int]]:
    "(name, lines) of every function and method."
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def exported_cells() -> list[int]:
    "Lines of every exported code cell of the notebooks."
    out = []
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        for c in json.loads(nb.read_text())["cells"]:
            src = "".join(c["source"])
            if c["cell_type"] == "code" and re.search(r"^#\|\s*export", src, re.M): out.append(len(src.splitlines()))
    return out


def example_share() -> tuple[int, int]:
    "(exported code cells followed by a code cell that is not exported and has saved output, exported code cells)."
    followed = total = 0
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        code = [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
        exported = [bool(re.search(r"^#\|\s*export", "".join(c["source"]), re.M)) for c in code]
        for i, c in enumerate(code):
            if not exported[i]: continue
            total += 1
            followed += i + 1 < len(code) and not exported[i + 1] and bool(code[i + 1].get("outputs"))
    return followed, total


def shared_numbers() -> list[str]:
    "Notebook numbers that more than one notebook carries ('29: averaging, batches')."
    by = {}
    for nb in sorted((ROOT / "nbs").glob("[0-9][0-9]_*.ipynb")): by.setdefault(nb.stem[:2], []).append(nb.stem[3:])
    return [f"{n}: {', '.join(v)}" for n, v in by.items() if len(v) > 1]


def package_imports(module: str) -> list[str]:
    """The package modules `module` (a file under the package, 'run/trainer.py') imports, at any depth, dotted below
    the package ('engine.config'; a folder's module imported by name, `from .. import ops`, as itself)."""
    here = PKG / module
    folder = list(Path(module).parent.parts)
    out = set()
    for n in ast.walk(ast.parse(here.read_text())):
        if isinstance(n, ast.ImportFrom) and n.level:
            base = folder[:len(folder) - n.level + 1]
            if n.module: out.add(".".join(base + [n.module]))
            else: out |= {".".join(base + [a.name]) for a in n.names}
        elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("neuronfrontier."):
            out.add(n.module.removeprefix("neuronfrontier."))
        elif isinstance(n, ast.ImportFrom) and n.module == "neuronfrontier": out |= {a.name for a in n.names}
    return sorted(out)


def measures() -> dict:
    "Each measure: (limit, worst, what is over the limit); `touch`: the modules besides ops that touch its table."
    skip = {"_modidx.py"}
    mods = {p.relative_to(PKG).as_posix(): p.read_text() for p in sorted(PKG.rglob("*.py")) if p.name not in skip}
    trees = {m: ast.parse(s) for m, s in mods.items()}
    kernels = {m for m in mods if m.startswith("kernels/")}
    fields = sorted(((n, k, m) for m, t in trees.items() for n, k in dataclasses_(t)), key=lambda x: -x[1])
    long_mods = sorted(((len(s.splitlines()), m) for m, s in mods.items()), reverse=True)
    long_fns = sorted(((k, f"{m}:{n}") for m, t in trees.items() if m not in kernels for n, k in functions(t)),
                      reverse=True)
    cells = exported_cells()
    mean = sum(cells) / len(cells)
    return {
        "dataclass fields": (LIMITS["dataclass fields"], fields[0][1],
                             [f"{n} {k}" for n, k, _ in fields if k > LIMITS["dataclass fields"]]),
        "module lines": (LIMITS["module lines"], long_mods[0][0],
                         [f"{m} {k}" for k, m in long_mods if k > LIMITS["module lines"]]),
        "function lines (no kernels)": (LIMITS["function lines"], long_fns[0][0],
                                        [f"{n} {k}" for k, n in long_fns if k > LIMITS["function lines"]]),
        "mean exported cell": (LIMITS["mean exported cell"], round(mean, 1),
                               [f"mean {mean:.1f}"] if mean > LIMITS["mean exported cell"] else []),
        "touch": sorted(m for m, s in mods.items() if m != "ops.py" and re.search(r"\bops\._(IMPLS|state)\b", s)),
        "cells": cells,
        "shared numbers": shared_numbers(),
        "examples": example_share(),
        "trainer imports": package_imports("run/trainer.py"),
        "folders": sorted(p.parent.name for p in PKG.glob("*/__init__.py")),
        "top modules": sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "_modidx")),
    }


def main() -> int:
    m = measures()
    print(f"{'measure':28s} {'limit':>6s} {'worst':>8s}  over the limit")
    for name in ("dataclass fields", "module lines", "function lines (no kernels)", "mean exported cell"):
        limit, worst, over = m[name]
        print(f"{name:28s} {limit:6d} {worst:8}  {len(over)}: {', '.join(over[:6])}{' …' if len(over) > 6 else ''}")
    cells = m["cells"]
    print(f"{'exported cells':28s} {len(cells)} cells, {sum(c > 100 for c in cells)} over 100 lines, longest "
          f"{max(cells)}")
    print(f"{'modules touching ops._IMPLS/_state':34s} {len(m['touch'])}: {', '.join(m['touch']) or 'none'}")
    print(f"{'notebooks sharing a number':34s} {len(m['shared numbers'])}: {'; '.join(m['shared numbers']) or 'none'}")
    followed, total = m["examples"]
    print(f"{'exported cells with an example':34s} {followed} of {total} ({followed / total:.0%})")
    print(f"{'package modules the trainer imports':34s} {len(m['trainer imports'])}: {', '.join(m['trainer imports'])}")
    print(f"{'folders; modules at the top':34s} {len(m['folders'])} ({', '.join(m['folders'])}); "
          f"{len(m['top modules'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
