#!/usr/bin/env python
"""Write `neuronfrontier/nki_api.json`: the names and signatures of the public NKI API of the current release (NKI 0.8.0,
Neuron SDK 2.34.0), as the public API stubs of NKI 0.6 plus the changes of NKI 0.7 and 0.8 documented since.

The newest public stubs are those of NKI 0.6 (Neuron 2.32.0) in the repository aws-neuron/aws-neuron-sdk
(`nki/api/nki/__init__.py`, `nki/api/nki/language/__init__.py`, `nki/api/nki/isa/__init__.py`; the repository has no
2.33 or 2.34 commit). This script parses them with `ast` — every public name of `nki`, `nki.language`, `nki.isa`, the
methods of `nki.language.NkiTensor`, the members of the enums, and for each function its parameter names, kinds, order
and default expressions — then applies `CHANGES`: the names added, removed, deprecated and re-signed by NKI 0.7 (Neuron
2.33.0) and NKI 0.8 (Neuron 2.34.0), each as the Neuron documentation page it comes from states it (facts only: no
docstring or code is copied). Rules that are not names (the LNC check, tracing) are listed too. Run it once per release:

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


RTD = "https://awsdocs-neuron.readthedocs-hosted.com/en"
_MIGRATION_07 = f"{RTD}/v2.33.1/nki/migration/index.html"                      # Migrating from NKI 0.6.0 to 0.7.0
_DEPRECATIONS_08 = f"{RTD}/latest/about-neuron/announcements/neuron2.x/announce-intent-eos-nki-virtualregister-lnc-apis.html"
_GEN07, _GEN = f"{RTD}/v2.33.0/nki/api/generated", f"{RTD}/latest/nki/api/generated"
P, K = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
_fn = lambda *params: {"kind": "function", "params": [list(p) for p in params]}
_cls = lambda *attributes: {"kind": "class", "methods": {}, "properties": [], "attributes": list(attributes)}

# (NKI version, module, name, change, entry or note, source). change: 'added' | 'signature' (entry: the new one) |
# 'deprecated' (note: what to use) | 'removed' (note: what to use) | 'rule' (not a name: note says what the compiler checks)
CHANGES = [
    ("0.7.0", "nki", "jit", "signature", _fn(("fn", P, "None"), ("compile_config", K, "None"),
                                             ("specialization_config", K, "None"), ("kwargs", "VAR_KEYWORD", None)),
     f"{RTD}/v2.33.1/nki/api/generated/nki.jit.html"),
    ("0.7.0", "nki.compiler", "CompileConfig", "added", _cls(), f"{RTD}/v2.33.1/nki/api/nki.compiler.html"),
    ("0.7.0", "nki.compiler", "SpecializationConfig", "added", _cls(), f"{RTD}/v2.33.1/nki/api/nki.compiler.html"),
    ("0.7.0", "nki.compiler", "AddressRotation", "added", _cls(), f"{RTD}/v2.33.1/nki/api/nki.compiler.html"),
    ("0.7.0", "nki.language", "dynamic_range", "removed", "nl.fori_loop (a device loop) or range (unrolled when traced)", _MIGRATION_07),
    ("0.7.0", "nki.language", "affine_range", "deprecated", "range: the tracer unrolls every Python loop", f"{RTD}/latest/nki/deep-dives/nki-loops.html"),
    ("0.7.0", "nki.language", "sequential_range", "deprecated", "range", f"{RTD}/latest/nki/deep-dives/nki-loops.html"),
    ("0.7.0", "nki.language", "static_range", "deprecated", "range", f"{RTD}/latest/nki/deep-dives/nki-loops.html"),
    ("0.7.0", "nki.language", "empty_like", "signature", _fn(("x", P, None), ("dtype", P, "None"), ("buffer", P, "None"),
                                                             ("name", P, "''"), ("transpose_axes", K, "None"), ("address", K, "None")),
     f"{_GEN07}/nki.language.empty_like.html"),
    *[("0.7.0", "nki.language", n, "added", _fn(*ps), f"{_GEN}/nki.language.{n}.html") for n, ps in (
        ("tiles", (("source", P, None), ("tile_shape", K, "None"))),
        ("blocks", (("source", P, None), ("tile_shape", K, "None"), ("block_shape", K, None))),
        ("alloc_tiles", (("tile_shape", K, None), ("element_shape", K, None), ("buffer", K, None), ("dtype", K, None),
                         ("address", K, "None"), ("name", K, "''"))),
        ("alloc_blocks", (("tile_shape", K, None), ("block_shape", K, None), ("element_shape", K, None), ("buffer", K, None),
                          ("dtype", K, None), ("address", K, "None"), ("name", K, "''"))))],
    *[("0.7.0", "nki.language", n, "added", _cls(), f"{_GEN}/nki.language.{n}.html") for n in ("NkiGrid", "NkiTileGrid", "NkiBlockGrid")],
    ("0.7.0", "nki.isa", "activation", "signature", _fn(("dst", P, None), ("op", P, None), ("data", P, None), ("bias", P, "None"),
                                                         ("scale", P, "1.0"), ("reduce_op", P, "None"), ("reduce_res", P, "None"),
                                                         ("reduce_cmd", P, "reduce_cmd.idle"), ("engine", P, "engine.scalar"),
                                                         ("name", P, "None")), f"{_GEN07}/nki.isa.activation.html"),
    ("0.7.0", "nki.isa", "scalar_tensor_tensor", "signature",
     _fn(("dst", P, None), ("data", P, None), ("op0", P, None), ("operand0", P, None), ("op1", P, None), ("operand1", P, None),
         ("reverse0", P, "False"), ("reverse1", P, "False"), ("reduce_cmd", P, "reduce_cmd.reset_reduce"), ("reduce_op", P, "None"),
         ("reduce_res", P, "None"), ("name", P, "None")), f"{_GEN07}/nki.isa.scalar_tensor_tensor.html"),
    ("0.7.0", "nki.isa", "NkiScalar", "added", _cls("dtype"), f"{_GEN}/nki.isa.NkiScalar.html"),
    ("0.7.0", "nki.isa", "scalar_load", "added", _fn(("src", P, None)), f"{_GEN}/nki.isa.scalar_load.html"),
    ("0.7.0", "nki.isa", "scalar_store", "added", _fn(("dst", P, None), ("value", P, None)), f"{_GEN}/nki.isa.scalar_store.html"),
    ("0.7.0", "nki.isa", "scalar_alu", "added", _fn(("data1", P, None), ("data2", P, None), ("op", P, None), ("name", P, "None")),
     f"{_GEN}/nki.isa.scalar_alu.html"),
    ("0.7.0", "nki.isa", "sendrecv_compute", "added", _fn(("src", P, None), ("dst", P, None), ("send_to_rank", P, None),
                                                         ("recv_from_rank", P, None), ("reduce_op", P, None), ("name", P, "None")),
     f"{_GEN}/nki.isa.sendrecv_compute.html"),
    ("0.7.0", "", "", "rule", "kernels are specialised by tracing them with Python: loops and ifs on Python values unroll; "
     "device-dependent control flow goes through nl.fori_loop / nl.while_loop", _MIGRATION_07),
    ("0.7.0", "", "", "rule", "NCC_EVRF066: a kernel's LNC degree must equal neuronx-cc's (--lnc; 2 by default on trn2)",
     f"{RTD}/latest/compiler/error-codes/EVRF066.html"),
    ("0.8.0", "nki.lnc", "core_barrier", "added", _fn(("data", P, None), ("cores", P, None), ("engine", P, "engine.gpsimd"),
                                                     ("name", P, "None")), f"{RTD}/latest/nki/api/nki.lnc.html"),
    ("0.8.0", "nki.lnc", "sendrecv", "added", _fn(("src", P, None), ("dst", P, None), ("send_to_rank", P, None),
                                                 ("recv_from_rank", P, None), ("dma_engine", P, "dma_engine.dma"),
                                                 ("name", P, "None"), ("priority", P, "None")), f"{RTD}/latest/nki/api/nki.lnc.html"),
    ("0.8.0", "nki.lnc", "sendrecv_compute", "added", _fn(("src", P, None), ("dst", P, None), ("send_to_rank", P, None),
                                                         ("recv_from_rank", P, None), ("reduce_op", P, None), ("name", P, "None"),
                                                         ("priority", P, "None")), f"{RTD}/latest/nki/api/nki.lnc.html"),
    *[("0.8.0", "nki.isa", n, "deprecated", f"nki.lnc.{n}" + (" (without pipe_id)" if n == "sendrecv" else ""), _DEPRECATIONS_08)
      for n in ("sendrecv", "sendrecv_compute", "core_barrier")],
    *[("0.8.0", "nki.isa", n, "deprecated", "nki.isa.scalar_load / scalar_store with nki.isa.NkiScalar", _DEPRECATIONS_08)
      for n in ("register_alloc", "register_move", "register_load", "register_store", "VirtualRegister")],
    ("0.8.0", "nki.language", "if_else", "added", _fn(("cond", P, None), ("then_fn", P, None), ("else_fn", P, "None")),
     f"{_GEN}/nki.language.if_else.html"),
    ("0.8.0", "nki.isa", "local_gather", "rule", "without num_valid_indices the results are undefined and NKI warns", _DEPRECATIONS_08),
    ("0.8.0", "", "", "rule", "neuronx-cc no longer ships neuronxcc.nki: import nki",
     f"{RTD}/latest/_sources/about-neuron/announcements/neuron2.x/announce-removal-neuronxcc-nki-2-34.rst"),
]


def apply_changes(table: dict) -> list[dict]:
    "Apply `CHANGES` to a table of the 0.6 stubs, in place; returns them as records for the provenance."
    out = []
    for version, mod, name, change, entry, source in CHANGES:
        rec = {"nki_version": version, "module": mod, "name": name, "change": change, "source": source}
        if change in ("added", "signature"):
            if change == "signature": assert name in table[mod], (mod, name)
            table.setdefault(mod, {})[name] = entry
        elif change == "deprecated":
            table[mod][name] = {**table[mod][name], "deprecated": {"since": version, "use": entry}}
            rec["use"] = entry
        elif change == "removed":
            del table[mod][name]
            rec["use"] = entry
        else: rec["note"] = entry
        out.append(rec)
    return out


def main(gitdir, commit="HEAD"):
    git = lambda *a: subprocess.run(["git", "-C", gitdir, *a], capture_output=True, text=True, check=True).stdout
    sha = git("rev-parse", commit).strip()
    table = {"provenance": {"repository": "github.com/aws-neuron/aws-neuron-sdk", "commit": sha,
                            "commit_date": git("show", "-s", "--format=%cI", sha).strip(), "paths": PATHS,
                            "stubs_nki_version": "0.6.0", "stubs_neuron_sdk": "2.32.0",
                            "nki_version": "0.8.0", "neuron_sdk": "2.34.0", "generated_by": "tools/nki_api_table.py"}}
    for mod, path in PATHS.items(): table[mod] = parse(git("show", f"{sha}:{path}"))
    table["provenance"]["changes"] = apply_changes(table)
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    counts = {m: len(v) for m, v in table.items() if m != "provenance"}
    print(f"wrote {OUT} from {sha[:12]} + {len(CHANGES)} documented changes: {counts}")


if __name__ == "__main__":
    if len(sys.argv) < 2: sys.exit(__doc__)
    main(*sys.argv[1:3])
