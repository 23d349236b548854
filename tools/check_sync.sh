#!/usr/bin/env bash
# Fail when nbdev-export / nbdev-clean would change the tree: the exported library and the cleaned
# notebooks must be exactly what is checked in.
set -euo pipefail
BIN=${1:-.venv/bin}
snap() { find nbs neuronfrontier -type f \( -name '*.ipynb' -o -name '*.py' \) -not -path '*/.ipynb_checkpoints/*' \
         -not -path '*/__pycache__/*' | sort | xargs sha1sum; }
before=$(snap)
"$BIN/nbdev-export"
"$BIN/nbdev-clean"
after=$(snap)
if [ "$before" != "$after" ]; then
  echo "notebooks and library out of sync: run 'make export' and commit. Changed files:" >&2
  diff <(echo "$before") <(echo "$after") >&2 || true
  exit 1
fi
echo "notebooks and library in sync"
