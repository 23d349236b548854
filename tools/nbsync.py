#!/usr/bin/env python
"""Write a notebook from a percent-format draft, keeping existing cell ids, and optionally execute it.

Authoring aid for the notebooks in `nbs/` (the notebooks stay the source of truth; drafts live in the
git-ignored `.drafts/`). Draft format:

    # %% [markdown]
    # # Title
    # prose ...
    # %%
    #| export
    def f(): ...
    # %% tags=["parameters"]
    budget_s = 60

Cell ids of an existing notebook are kept for unchanged and edited-in-place cells (matched with difflib),
so re-syncing a draft does not churn ids.

    python tools/nbsync.py .drafts/01_data.py nbs/01_data.ipynb [--run]
    python tools/nbsync.py --to-draft nbs/01_data.ipynb .drafts/01_data.py
    python tools/nbsync.py .drafts/01_data.py nbs/01_data.ipynb --keep-outputs   # a source edit, outputs of the rest kept
"""
import argparse, difflib, hashlib, json, re, sys
from pathlib import Path

_HDR = re.compile(r'^# %%(?P<md> \[markdown\])?(?:\s+tags=(?P<tags>\[.*\]))?\s*$')


def parse_draft(text):
    "Split a percent-format draft into (cell_type, source, tags) triples."
    cells, cur = [], None
    for line in text.splitlines():
        m = _HDR.match(line)
        if m:
            if cur: cells.append(cur)
            cur = ['markdown' if m['md'] else 'code', [], json.loads(m['tags']) if m['tags'] else []]
            continue
        if cur is None: cur = ['code', [], []]
        cur[1].append(line)
    if cur: cells.append(cur)
    out = []
    for typ, lines, tags in cells:
        while lines and not lines[-1].strip(): lines.pop()
        while lines and not lines[0].strip(): lines.pop(0)
        if typ == 'markdown': lines = [l[2:] if l.startswith('# ') else l[1:] if l.startswith('#') else l for l in lines]
        out.append((typ, '\n'.join(lines), tags))
    return out


def to_draft(nb):
    parts = []
    for c in nb['cells']:
        src = ''.join(c['source']) if isinstance(c['source'], list) else c['source']
        tags = c.get('metadata', {}).get('tags')
        hdr = '# %%' + (' [markdown]' if c['cell_type'] == 'markdown' else '') + (f' tags={json.dumps(tags)}' if tags else '')
        if c['cell_type'] == 'markdown': src = '\n'.join(('# ' + l) if l else '#' for l in src.split('\n'))
        parts.append(hdr + '\n' + src)
    return '\n\n'.join(parts) + '\n'


def _src(c): return ''.join(c['source']) if isinstance(c['source'], list) else c['source']


def build_nb(cells, old, name, keep_outputs=False):
    "The notebook of draft `cells`, ids from `old`; with `keep_outputs`, a code cell whose source is unchanged keeps its outputs."
    old_cells = old['cells'] if old else []
    ids = [None] * len(cells)
    sm = difflib.SequenceMatcher(a=[_src(c) for c in old_cells], b=[s for _, s, _ in cells], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag in ('equal', 'replace'):
            for k in range(min(i2 - i1, j2 - j1)): ids[j1 + k] = old_cells[i1 + k].get('id')
    used, nb_cells = set(i for i in ids if i), []
    for j, (typ, src, tags) in enumerate(cells):
        cid = ids[j]
        if not cid or cid in used and ids.index(cid) != j:
            h = hashlib.sha1(f'{name}|{j}|{src}'.encode()).hexdigest()
            k = 0
            while h[k:k + 8] in used: k += 1
            cid = h[k:k + 8]
            used.add(cid)
        md = {'tags': tags} if tags else {}
        c = dict(cell_type=typ, id=cid, metadata=md, source=src.splitlines(True))
        if typ == 'code': c.update(execution_count=None, outputs=[])
        prev = [o for o in old_cells if o.get('id') == cid and o['cell_type'] == 'code' and _src(o) == src]
        if keep_outputs and typ == 'code' and prev: c.update(outputs=prev[0].get('outputs', []))
        nb_cells.append(c)
    meta = (old or {}).get('metadata') or {'kernelspec': {'display_name': 'python3', 'language': 'python', 'name': 'python3'}}
    return dict(cells=nb_cells, metadata=meta, nbformat=4, nbformat_minor=5)


def run_nb(path):
    "Execute the notebook in place with execnb (as nbdev-test does), skipping neuron/cuda cells."
    from fastcore.nbio import read_nb, write_nb
    from execnb.shell import CaptureShell
    import os
    flag = re.compile(r'^#\|\s*(neuron|cuda)\s*$', re.M)
    nb = read_nb(path)
    def pre(c): return c.cell_type != 'code' or bool(flag.search(c.source))
    sh = CaptureShell()
    cwd = os.getcwd()
    sh._fname = path
    sh.set_path(Path(path).parent.resolve())
    os.chdir(Path(path).parent)
    try: sh.run_all(nb, exc_stop=True, preproc=pre)
    except Exception:
        print(sh.prettytb(fname=path), file=sys.stderr)
        raise SystemExit(1)
    finally: os.chdir(cwd)
    write_nb(nb, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('src'); ap.add_argument('dest')
    ap.add_argument('--run', action='store_true', help='execute the notebook and store its outputs')
    ap.add_argument('--keep-outputs', action='store_true', help='keep the outputs of code cells whose source is unchanged')
    ap.add_argument('--to-draft', action='store_true', help='write a draft from an existing notebook')
    a = ap.parse_args()
    if a.to_draft:
        Path(a.dest).parent.mkdir(parents=True, exist_ok=True)
        Path(a.dest).write_text(to_draft(json.loads(Path(a.src).read_text())))
        return
    dest = Path(a.dest)
    old = json.loads(dest.read_text()) if dest.exists() else None
    nb = build_nb(parse_draft(Path(a.src).read_text()), old, dest.stem, a.keep_outputs)
    dest.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    if a.run: run_nb(str(dest))


if __name__ == '__main__': main()
