"""Measure `hctool lint` speed on large real trees (default: the installed torch package).

    python benchmarks/bench_lint.py [PATH ...] [--jobs N]
    python benchmarks/bench_lint.py PATH --cache [--runs 3] [--jobs N] [--edit REL.py]

Without --cache: one line per tree (files, lines, seconds, lines/s, findings, unparsable files),
linted in process without a cache. With --cache: the CLI as a user runs it (a subprocess, JSON
output), in a copy of the tree: RUNS cold runs with --no-cache and RUNS with an empty cache
directory each (which they write), RUNS warm runs
(nothing changed), and RUNS one-file edits (a line appended to REL.py, default the tree's largest
file), each with its wall and CPU seconds; then the medians and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hctool.lint.config import LintConfig
from hctool.lint.runner import lint


def default_trees() -> list[Path]:
    import torch

    root = Path(os.path.dirname(torch.__file__))
    return [root / "distributed", root]


def _cli(tree: Path, cache: Path | None, jobs: int) -> tuple[float, float, int]:
    """(wall s, CPU s of the run and its workers, findings) of one `hctool lint TREE --format json`."""
    env = dict(os.environ)
    args = [sys.executable, "-m", "hctool", "lint", str(tree), "--format", "json", "--jobs", str(jobs)]
    if cache is None:
        args.append("--no-cache")
    else:
        env["HCTOOL_CACHE_DIR"] = str(cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(args, cwd=tree.parent, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode not in (0, 1):
        raise SystemExit(f"hctool lint failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, len(json.loads(out.stdout))


def _line(label: str, runs: list) -> str:
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    return (
        f"{label}: median {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
        f"(runs: {', '.join(f'{w:.2f}' for w in walls)} s; {runs[0][2]} findings)"
    )


def bench_cache(tree: Path, runs: int, jobs: int, edit: str | None) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-lint-") as tmp:
        copy = Path(tmp) / tree.name
        shutil.copytree(tree, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        target = copy / edit if edit else max(copy.rglob("*.py"), key=lambda p: p.stat().st_size)
        cache = Path(tmp) / "cache"
        cold, nocache = [], []
        for _ in range(runs):
            nocache.append(_cli(copy, None, jobs))
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(_cli(copy, cache, jobs))
        warm = [_cli(copy, cache, jobs) for _ in range(runs)]
        edits = []
        for i in range(runs):
            with open(target, "a") as fh:
                fh.write(f"\n_bench_edit_{i} = {i}\n")
            edits.append(_cli(copy, cache, jobs))
        print(f"{tree} ({len(list(copy.rglob('*.py')))} files), jobs={jobs}, load average {os.getloadavg()[0]:.1f}")
        print(_line("cold (--no-cache)", nocache))
        print(_line("cold (empty cache, written)", cold))
        print(_line("warm (unchanged)", warm))
        print(_line(f"one-file edit ({target.relative_to(copy)})", edits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--cache", action="store_true", help="cold, warm and one-file-edit runs of the CLI")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--edit", help="with --cache: the file (relative to the tree) to edit")
    args = parser.parse_args()
    for tree in args.paths or default_trees():
        if args.cache:
            bench_cache(tree.resolve(), args.runs, args.jobs, args.edit)
            continue
        report = lint([tree], LintConfig(root=tree), jobs=args.jobs, cwd=tree)
        rate = report.lines / report.seconds if report.seconds else 0.0
        print(
            f"{tree}: {report.files} files, {report.lines} lines, {report.seconds:.1f} s, "
            f"{rate:,.0f} lines/s, {len(report.findings)} findings, {len(report.errors)} unparsable "
            f"(jobs={args.jobs})",
            flush=True,
        )


if __name__ == "__main__":
    main()
