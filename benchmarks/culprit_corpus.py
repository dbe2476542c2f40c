"""Does check-consensus name the right rank and line? Runs programs whose first lines state the
truth, the way a user runs them, and scores the answers.

Each program starts with
    # EXPECT: verdict=diverged culprit=1 line=37        (or: verdict=consistent)
and optionally `# NPROC: 4` (default: the `nproc` a manifest.json beside it gives, else 2).
A run counts as right when the verdict matches and, for a divergence, the culprit ranks are
the expected ones and the cause's line (first_divergence.cause.site) is the expected line.

    python benchmarks/culprit_corpus.py DIR [DIR ...] [--runs N] [--torchrun] [--json OUT]

Prints one line per run and a summary per folder: right / runs, and the misses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPECT = re.compile(r"^#\s*EXPECT:\s*(.*)$", re.M)


def expectation(path: Path, manifest: dict) -> dict:
    text = path.read_text()
    m = EXPECT.search(text)
    if not m:
        return {}
    out = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
    if "culprit" in out:
        out["culprit"] = sorted(int(x) for x in out["culprit"].split(",") if x.strip().isdigit())
    if "line" in out:
        out["line"] = int(out["line"]) if out["line"].isdigit() else None
    nproc = re.search(r"^#\s*NPROC:\s*(\d+)", text, re.M) or re.search(
        r"^#\s*RUN:.*--nproc[-_]per[-_]node[ =](\d+)", text, re.M
    )
    out["nproc"] = int(nproc.group(1)) if nproc else int(manifest.get(path.name, {}).get("nproc") or 2)
    return out


def run_one(path: Path, exp: dict, torchrun: bool, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="hctool-corpus-") as tmp:
        trace = Path(tmp) / "trace"
        if torchrun:
            cmd = ["torchrun", "--standalone", "--nproc-per-node", str(exp["nproc"]), str(path)]
        else:
            cmd = [str(path)]
        argv = [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--json",
            "--nproc",
            str(exp["nproc"]),
            "--timeout",
            str(timeout),
            "--hang-after",
            "10",
            "--trace-dir",
            str(trace),
            "--",
            *cmd,
        ]
        t0 = time.monotonic()
        # a fresh temporary folder per run: a program's own files there (a cache it builds) must not
        # carry over into the next run
        env = dict(os.environ, TMPDIR=tmp)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 120, cwd=path.parent, env=env)
        secs = time.monotonic() - t0
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return {
            "ok": False,
            "why": f"no JSON (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}",
            "secs": secs,
        }
    fd = report.get("first_divergence") or {}
    cause = fd.get("cause") or {}
    got = {
        "verdict": report.get("verdict"),
        "culprit": sorted(fd.get("culprit_ranks") or []),
        "line": int(cause["site"].rsplit(":", 1)[1]) if cause.get("site") else None,
        "kind": fd.get("kind"),
        "confidence": fd.get("confidence"),
        "exit": proc.returncode,
    }
    want_verdict = exp.get("verdict", "diverged")
    ok = got["verdict"] == want_verdict or (want_verdict == "hung" and got["verdict"] in ("hung", "diverged"))
    if want_verdict != "consistent":
        ok = ok and got["culprit"] == exp.get("culprit", got["culprit"])
        if exp.get("line"):
            ok = ok and got["line"] == exp["line"]
    return {"ok": ok, "got": got, "secs": secs, "basis": fd.get("basis")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument(
        "--torchrun", action="store_true", help="run each under torchrun (default: hctool starts the ranks)"
    )
    ap.add_argument("--timeout", type=float, default=90)
    ap.add_argument("--only", default=None, help="regex on file names")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results = []
    for d in args.dirs:
        manifest = {}
        if (d / "manifest.json").is_file():
            manifest = {e["file"]: e for e in json.loads((d / "manifest.json").read_text())}
        for path in sorted(d.glob("*.py")):
            if args.only and not re.search(args.only, path.name):
                continue
            exp = expectation(path, manifest)
            if not exp:
                continue
            for k in range(args.runs):
                r = run_one(path.resolve(), exp, args.torchrun, args.timeout)
                r.update(file=str(path), run=k, want={x: exp.get(x) for x in ("verdict", "culprit", "line")})
                results.append(r)
                mark = "ok  " if r["ok"] else "MISS"
                print(
                    f"{mark} {path.name} run {k}: want {r['want']} got {r.get('got') or r.get('why')} "
                    f"({r['secs']:.1f} s)",
                    flush=True,
                )
                if not r["ok"] and r.get("basis"):
                    print(f"       basis: {r['basis']}", flush=True)
    by_dir: dict[str, list] = {}
    for r in results:
        by_dir.setdefault(str(Path(r["file"]).parent), []).append(r)
    for d, rs in by_dir.items():
        files = {r["file"] for r in rs}
        right_files = {f for f in files if all(r["ok"] for r in rs if r["file"] == f)}
        print(
            f"{d}: {sum(r['ok'] for r in rs)}/{len(rs)} runs right; {len(right_files)}/{len(files)} programs right "
            f"in every run; median {statistics.median(r['secs'] for r in rs):.1f} s per run"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
