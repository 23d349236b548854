#!/usr/bin/env python
"""Write `neuronfrontier/nki_api.json`: the names and signatures of the public NKI 0.6 API, read from AWS's API stubs.

The stubs live in the public repository aws-neuron/aws-neuron-sdk (`nki/api/nki/__init__.py`,
`nki/api/nki/language/__init__.py`, `nki/api/nki/isa/__init__.py`). This script parses them with `ast` and records
facts only — every public name of `nki`, `nki.language`, `nki.isa`, the methods of `nki.language.NkiTensor`, the members
of the enums, and for each function its parameter names, kinds, order and default expressions — together with the
repository, commit and paths it read. No docstring or code is copied. Run it once per NKI release:

    python tools/nki_api_table.py /path/to/aws-neuron-sdk.git [COMMIT]      # a git dir (bare or not); COMMIT defaults to HEAD

`tests/test_sim.py` checks the simulator's `nl` / `nisa` callables against the table with `inspect.signature`.
"""
import ast, json, subprocess, sys
from pathlib import Path

PATHS = {"nki": "nki/api/nki/__init__.py", "nki.language": "nki/api/nki/language/__init__.py",
         "nki.isa": "nki/api/nki/isa/__init__.py"}
OUT = Path(__file__).resolve().parent.parent / "neuronfrontier" / "nki_api.json"


def _params(fn: ast.FunctionDef, drop_self=False):
    "[[name, kind, default source or None], ...] in signature order (kinds as inspect.Parameter names them)."
    a = fn.args
    pos = [(p, "POSITIONAL_ONLY") for p in a.posonlyargs] + [(p, "POSITIONAL_OR_KEYWORD") for p in a.args]
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    out = [[p.arg, k, None if d is None else ast.unparse(d)] for (p, k), d in zip(pos, defaults)]
    if a.vararg: out.append([a.vararg.arg, "VAR_POSITIONAL", None])
    out += [[p.arg, "KEYWORD_ONLY", None if d is None else ast.unparse(d)] for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg: out.append([a.kwarg.arg, "VAR_KEYWORD", None])
    return out[1:] if drop_self else out


def _is_enum(cls: ast.ClassDef): return any(isinstance(b, ast.Name) and b.id == "Enum" for b in cls.bases)


def _class(cls: ast.ClassDef):
    "An enum: its members and values; another class: its public methods, properties and attributes."
    if _is_enum(cls):
        return {"kind": "enum", "members": {t.targets[0].id: ast.literal_eval(t.value) for t in cls.body
                                            if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)}}
    methods, props, attrs = {}, [], []
    for n in cls.body:
        if isinstance(n, ast.FunctionDef):
            if any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list): props.append(n.name)
            elif not n.name.startswith("_") or n.name in ("__getitem__", "__init__"):
                methods[n.name] = {"kind": "function", "params": _params(n, drop_self=True)}
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name): attrs.append(n.target.id)
        elif isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name): attrs.append(n.targets[0].id)
    return {"kind": "class", "methods": methods, "properties": props, "attributes": attrs}


def parse(src: str):
    "Public names of one stub module: functions, classes, and module-level constants (dtypes, buffers, …)."
    names = {}
    for n in ast.parse(src).body:
        if isinstance(n, ast.FunctionDef): names[n.name] = {"kind": "function", "params": _params(n)}
        elif isinstance(n, ast.ClassDef): names[n.name] = _class(n)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names[n.target.id] = {"kind": "constant", "type": ast.unparse(n.annotation)}
        elif isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
            names[n.targets[0].id] = {"kind": "constant", "type": None}
    names.pop("DType", None)   # the stubs' type alias (DType = str), not an API name
    return names


def main(gitdir, commit="HEAD"):
    git = lambda *a: subprocess.run(["git", "-C", gitdir, *a], capture_output=True, text=True, check=True).stdout
    sha = git("rev-parse", commit).strip()
    table = {"provenance": {"repository": "github.com/aws-neuron/aws-neuron-sdk", "commit": sha,
                            "commit_date": git("show", "-s", "--format=%cI", sha).strip(), "paths": PATHS,
                            "nki_version": "0.6.0", "neuron_sdk": "2.32.0", "generated_by": "tools/nki_api_table.py"}}
    for mod, path in PATHS.items(): table[mod] = parse(git("show", f"{sha}:{path}"))
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    counts = {m: len(table[m]) for m in PATHS}
    print(f"wrote {OUT} from {sha[:12]}: {counts}")


if __name__ == "__main__":
    if len(sys.argv) < 2: sys.exit(__doc__)
    main(*sys.argv[1:3])
