"""Measure `hctool lint` speed on large real trees (default: the installed torch package).

    python benchmarks/bench_lint.py [PATH ...] [--jobs N]

Prints one line per tree: files, lines, seconds, lines/s, findings, unparsable files.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hctool.lint.config import LintConfig
from hctool.lint.runner import lint


def default_trees() -> list[Path]:
    import torch

    root = Path(os.path.dirname(torch.__file__))
    return [root / "distributed", root]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    for tree in args.paths or default_trees():
        report = lint([tree], LintConfig(root=tree), jobs=args.jobs, cwd=tree)
        rate = report.lines / report.seconds if report.seconds else 0.0
        print(f"{tree}: {report.files} files, {report.lines} lines, {report.seconds:.1f} s, "
              f"{rate:,.0f} lines/s, {len(report.findings)} findings, {len(report.errors)} unparsable "
              f"(jobs={args.jobs})", flush=True)


if __name__ == "__main__":
    main()
