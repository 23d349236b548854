#!/usr/bin/env python
"""Style check of the exported library: no line over 120 characters and no `;` between statements.

    python tools/lint_style.py [paths...]        # default: neuronfrontier/ (its _modidx.py excepted)

One exception: the first line of an `__all__ = [...]` list that nbdev writes is allowed 130 characters, because
nbdev wraps the list itself at 120 and then puts `__all__ = ` in front of it. Fix a finding in the notebook the
file's header names, then run nbdev-export. Exit code 1 and one line per finding when anything breaks a rule.
"""
import io
import sys
import tokenize
from pathlib import Path

MAX = 120
NBDEV_ALL = MAX + len("__all__ = ")


def findings(path: Path) -> list[str]:
    "`path:line: why` for each long line and each `;` that separates statements."
    text = path.read_text(encoding="utf-8")
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        limit = NBDEV_ALL if line.startswith("__all__ = [") else MAX
        if len(line) > limit: out.append(f"{path}:{i}: line of {len(line)} characters (at most {MAX})")
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.OP and tok.string == ";":
            out.append(f"{path}:{tok.start[0]}: `;` between statements: put each statement on its own line")
    return out


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    roots = [Path(a) for a in args] or [Path(__file__).resolve().parents[1] / "neuronfrontier"]
    files = [f for r in roots for f in ([r] if r.is_file() else sorted(r.rglob("*.py"))) if f.name != "_modidx.py"]
    problems = [p for f in files for p in findings(f)]
    print("\n".join(problems) if problems else f"style: {len(files)} files, no line over {MAX}, no `;` statements")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
