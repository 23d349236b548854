#!/usr/bin/env python
"""A soak of the launch line: the export's `train.py` and `neuronfrontier train --nproc N`, launched many times back
to back, counting how each launch ends, rank by rank.

    python benchmarks/soak.py --launches 200 --out nbs/results/soak.json
    python benchmarks/soak.py --launches 6 --out /tmp/soak.json          # a quick look

Set-up: `cpu-micro` exported (`neuronfrontier export`, no flags but the data) and laid out as the organisers' machine
lays it out (`contract._kit_site`: the stand-in prepare.py beside train.py, the cache of shards and tokenizer). The
stand-in's budget is short (`STANDIN_TRAIN_TIME_BUDGET_SECONDS`, of which an export keeps 5 s for its save) and its
evaluation small (`STANDIN_EVAL_MAX_TOKENS`). Launch i is drawn from fixed cycles:

* what: the launch line with no flags (`torch.distributed.run --standalone --nproc_per_node=N train.py`, LNC 1) four
  times in five, `neuronfrontier train --nproc N` the fifth;
* ranks: 2, 2, 3, 2, 4, 2, 8 (the 2-core CPU runs 8 ranks slowly, which is the point);
* load: every other launch runs beside a process that keeps one core busy (`while True: pass`);
* faults (`NF_FAULT`): none, nan@8, none, slow-save:1, none, kernel-variant:rms_norm, none, startup-delay:2. A NaN
  rolls back and trains on; a slow save, a kernel that fails at its second variant (it falls back to PyTorch's op) and
  a slow start-up all end with every rank at 0.

`--fail-launches K` adds K launches of the export that fail on purpose (`NF_FAULT=bogus`): a rank exits 2 with the
one-line reason, the others too or stopped by torchrun once one has failed (SIGTERM), and none abort.

Per launch: torchrun's exit code and each rank's (0 for all when torchrun exits 0; else from torchrun's failure
summary), whether out/final.pt was written by this launch and loads (the export's own `load_for_eval`, or ours), and
whether the printed val_bpb is the scorer's: the stand-in's `evaluate_bpb` on the loaded checkpoint for the export
(the organisers' scorer), our `evaluate_bpb` for `neuronfrontier train`, within the 4 printed decimals. A nonzero exit
after final.pt was written is named a teardown abort (`contract.teardown_abort`). The exit status is 1 when any launch
ends otherwise than expected.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "cpu-micro"
RANKS = (2, 2, 3, 2, 4, 2, 8)
FAULTS = ("", "nan@8", "", "slow-save:1", "", "kernel-variant:rms_norm", "", "startup-delay:2")
STANDIN_BUDGET_S = 8.0      # the stand-in's TRAIN_TIME_BUDGET_SECONDS: 3 s of training (an export keeps 5 s)
EVAL_TOKENS = 8192          # the stand-in's evaluation, and ours for `neuronfrontier train`
TRAIN_BUDGET_S = 3.0        # `neuronfrontier train --budget`
TIMEOUT_S = 600
BPB_TOL = 6e-5              # the printed 4 decimals, and sums split over ranks


def plan(i: int, failing: bool = False) -> dict:
    "Launch i of the fixed cycles (see the module's docstring)."
    if failing: return dict(what="export", ranks=2, load=False, fault="bogus", expect="fails: every rank exits 2")
    return dict(what="train" if i % 5 == 4 else "export", ranks=RANKS[i % len(RANKS)], load=i % 2 == 1,
                fault=FAULTS[i % len(FAULTS)], expect="every rank exits 0")


def rank_exits(stderr: str, rc: int, ranks: int) -> dict:
    """{rank: exit code}: all 0 when torchrun exits 0; else the ranks torchrun's failure summary names ('?' for a rank
    it does not name: stopped by torchrun, or never reported)."""
    if rc == 0: return {r: 0 for r in range(ranks)}
    named = {int(r): int(c) for r, c in re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", stderr)}
    return {r: named.get(r, "?") for r in range(ranks)}


def reasons(stderr: str) -> list[str]:
    "The one-line `error: ...` reasons the ranks printed, each once (torchrun's `[rankN]:` prefixes dropped)."
    lines = (re.sub(r"^\[rank\d+\]:\s*", "", line.strip()) for line in stderr.splitlines())
    return list(dict.fromkeys(line for line in lines if line.startswith("error: ")))


def printed_bpb(stdout: str) -> float | None:
    "The last `val_bpb=` the launch printed."
    found = re.findall(r"val_bpb=([0-9.]+|nan)", stdout)
    return float(found[-1]) if found else None


class Soak:
    """The export, the organisers' layout and the scorers, made once; `launch(i)` runs one launch and returns its
    record."""

    def __init__(self, data: Path, work: Path, standin_budget_s: float = STANDIN_BUDGET_S,
                 eval_tokens: int = EVAL_TOKENS):
        from neuronfrontier.submission import contract, kit_prepare
        from neuronfrontier.data.shards import find_shards, load_tokenizer
        self.data, self.work = data, work
        export = work / "export"
        r = subprocess.run([sys.executable, "-m", "neuronfrontier.cli", "export", "--config", CONFIG, "--data",
                            str(data), "--out", str(export)], capture_output=True, text=True, timeout=TIMEOUT_S)
        if r.returncode: raise SystemExit(f"export failed: {r.stderr.strip().splitlines()[-1:]}")
        self.env = contract._kit_site(export, work, data, data / "tokenizer") | {
            "NEURON_LOGICAL_NC_CONFIG": "1", "STANDIN_TRAIN_TIME_BUDGET_SECONDS": str(standin_budget_s),
            "STANDIN_EVAL_MAX_TOKENS": str(eval_tokens)}
        self.eval_tokens = eval_tokens
        self.sub = work / "sub"
        spec = importlib.util.spec_from_file_location("soak_train", self.sub / "train.py")
        self.train_py = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.train_py)   # its load_for_eval, what the organisers call
        os.environ["NEURON_COMPETITION_R1_CACHE_DIR"] = self.env["NEURON_COMPETITION_R1_CACHE_DIR"]
        self.kit, self.kit_tok = kit_prepare, kit_prepare.ensure_tokenizer(build_if_missing=False)
        self.enc, self.token_bytes = load_tokenizer(data / "tokenizer")
        self.val = find_shards(data)[1]
        self.contract = contract

    def command(self, p: dict, out: Path) -> tuple[list, Path, dict]:
        "(argv, cwd, env) of launch `p`."
        env = dict(self.env) | ({"NF_FAULT": p["fault"]} if p["fault"] else {})
        if p["what"] == "export":
            return ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={p['ranks']}",
                     "train.py"], self.sub, env)
        return ([sys.executable, "-m", "neuronfrontier.cli", "train", "--config", CONFIG, "--nproc", str(p["ranks"]),
                 "--budget", str(TRAIN_BUDGET_S), "--data", str(self.data), "--out", str(out), "--quiet",
                 "--set", f"eval_tokens={self.eval_tokens}"], ROOT, env)

    def scorer_bpb(self, what: str, ck: Path, out: Path) -> float:
        "The scorer's val_bpb of `ck`: the stand-in's evaluate_bpb through the export's load_for_eval, or ours."
        from neuronfrontier.run.checkpoint import load_for_eval
        from neuronfrontier.data.shards import val_batches
        from neuronfrontier.data.evaluate import evaluate_bpb
        tc = json.loads((out / "result.json").read_text())["config"]["train"]
        with torch.no_grad():
            if what == "export":
                model = self.train_py.load_for_eval(str(ck), torch.device("cpu"))
                res = self.kit.evaluate_bpb(model, self.kit_tok, tc["eval_batch_size"], tc["eval_seq_len"],
                                            torch.device("cpu"), max_tokens=self.eval_tokens)
                return float(res["val_bpb"])
            model = load_for_eval(str(ck), torch.device("cpu"))
            batches = val_batches(self.val, self.enc, tc["eval_seq_len"], tc["eval_tokens"], tc["eval_batch_size"])
            return float(evaluate_bpb(model, batches, self.token_bytes))

    def launch(self, i: int, p: dict) -> dict:
        "Run launch `p` (number i) and judge it."
        out = self.sub / "out" if p["what"] == "export" else self.work / f"train-{i}"
        shutil.rmtree(out, ignore_errors=True)
        argv, cwd, env = self.command(p, out)
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if p["load"] else None
        t0 = time.time()
        try: r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            r = subprocess.CompletedProcess(argv, -9, e.stdout or "", f"timed out after {TIMEOUT_S} s")
        finally:
            if burner: burner.kill()
        seconds = time.time() - t0
        ck = out / "final.pt"
        written = ck.is_file() and ck.stat().st_mtime >= t0
        exits = rank_exits(r.stderr, r.returncode, p["ranks"])
        rec = dict(i=i, **p, rc=r.returncode, rank_exits=exits, final_pt=written, seconds=round(seconds, 1),
                   printed_bpb=printed_bpb(r.stdout), loads=False, scorer_bpb=None,
                   teardown_abort=self.contract.teardown_abort(r.stderr, ck, t0),
                   error=self.contract.last_error(r.stderr) if r.returncode else "", reasons=reasons(r.stderr))
        if written:
            try:
                rec["scorer_bpb"] = self.scorer_bpb(p["what"], ck, out)
                rec["loads"] = True
            except Exception as e:   # a checkpoint that does not load or score is what the soak is for
                rec["error"] = f"final.pt does not load or score: {type(e).__name__}: {e}"[:200]
        rec["ok"] = judge(rec)
        return rec


def judge(rec: dict) -> bool:
    "Whether launch `rec` ended as its plan expects."
    if rec["fault"] == "bogus":   # fails on purpose: a rank exits with its own code 2 and says why; the others
        codes = list(rec["rank_exits"].values())   # too, or are stopped by torchrun (SIGTERM, -15) once one has failed
        return (rec["rc"] != 0 and 2 in codes and all(c in (2, -15, "?") for c in codes) and not rec["teardown_abort"]
                and any("NF_FAULT='bogus'" in line for line in rec["reasons"]))
    same = (rec["printed_bpb"] is not None and rec["scorer_bpb"] is not None
            and abs(rec["printed_bpb"] - rec["scorer_bpb"]) <= BPB_TOL)
    return rec["rc"] == 0 and all(c == 0 for c in rec["rank_exits"].values()) and rec["final_pt"] and rec["loads"] \
        and same


def row(rec: dict) -> str:
    "One launch as a table row."
    exits = ",".join(str(c) for c in rec["rank_exits"].values())
    bpb = "-" if rec["printed_bpb"] is None else f"{rec['printed_bpb']:.4f}"
    scorer = "-" if rec["scorer_bpb"] is None else f"{rec['scorer_bpb']:.4f}"
    note = rec["teardown_abort"] or "; ".join(rec["reasons"]) or rec["error"]
    return (f"{rec['i']:>4} {rec['what']:<6} {rec['ranks']:>5} {'busy' if rec['load'] else '-':<4} "
            f"{rec['fault'] or '-':<24} {exits:<16} {'yes' if rec['final_pt'] else 'no':<8} "
            f"{'yes' if rec['loads'] else 'no':<5} {bpb:>7} {scorer:>7} {rec['seconds']:>6.1f}  "
            f"{'ok' if rec['ok'] else 'UNEXPECTED'}{'  ' + note[:90] if note else ''}")


HEADER = (f"{'#':>4} {'what':<6} {'ranks':>5} {'load':<4} {'NF_FAULT':<24} {'rank exits':<16} {'final.pt':<8} "
          f"{'loads':<5} {'printed':>7} {'scorer':>7} {'s':>6}  outcome")


def summary(recs: list) -> dict:
    "Counts over the launches: by outcome, by what was launched, by fault."
    normal = [r for r in recs if r["fault"] != "bogus"]
    by = {}
    for r in normal:
        key = f"{r['what']} {r['fault'] or 'no fault'}"
        n, ok = by.get(key, (0, 0))
        by[key] = (n + 1, ok + r["ok"])
    return {"launches": len(normal), "all_ranks_0_and_loadable": sum(r["ok"] for r in normal),
            "teardown_aborts": sum(bool(r["teardown_abort"]) for r in recs),
            "failing_on_purpose": len(recs) - len(normal),
            "failing_as_expected": sum(r["ok"] for r in recs if r["fault"] == "bogus"),
            "by_kind": {k: {"launches": n, "ok": ok} for k, (n, ok) in sorted(by.items())},
            "seconds": round(sum(r["seconds"] for r in recs), 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=200, help="launches expected to end with every rank at 0")
    ap.add_argument("--fail-launches", type=int, default=4, help="launches that fail on purpose (NF_FAULT=bogus)")
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "cache" / "pydocs", help="shards + tokenizer/")
    ap.add_argument("--out", type=Path, default=ROOT / "nbs" / "results" / "soak.json")
    a = ap.parse_args(argv)
    if a.launches < 0 or a.fail_launches < 0: raise SystemExit("error: --launches and --fail-launches must be >= 0")
    recs = []
    with tempfile.TemporaryDirectory(prefix="nf_soak_") as tmp:
        soak = Soak(a.data, Path(tmp))
        print(HEADER, flush=True)
        plans = [(i, plan(i)) for i in range(a.launches)]
        plans += [(a.launches + j, plan(j, failing=True)) for j in range(a.fail_launches)]
        for i, p in plans:
            recs.append(soak.launch(i, p))
            print(row(recs[-1]), flush=True)
    s = summary(recs)
    print(f"{s['all_ranks_0_and_loadable']} of {s['launches']} launches: every rank at exit 0, final.pt loadable, "
          f"the printed val_bpb the scorer's; {s['failing_as_expected']} of {s['failing_on_purpose']} failing on "
          f"purpose exited 2 with the reason; {s['teardown_aborts']} teardown aborts; {s['seconds']:.0f} s")
    for k, v in s["by_kind"].items(): print(f"  {k:<40} {v['ok']:>4} of {v['launches']}")
    record = {"summary": s, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_count": os.cpu_count(),
              "torch": torch.__version__, "config": CONFIG, "standin_budget_s": STANDIN_BUDGET_S,
              "eval_tokens": EVAL_TOKENS,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "launches": recs}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=1))
    print(f"written to {a.out}")
    return 0 if all(r["ok"] for r in recs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
