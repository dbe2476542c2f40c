"""`hctool lint`: static analysis for collectives under rank-local control flow."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from hctool.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("lint")
    def lint_command(
        paths: List[Path] = typer.Argument(..., help="Python files or directories to analyze."),
        fmt: str = typer.Option("text", "--format", "-f", help="text, json, sarif or github."),
        select: Optional[List[str]] = typer.Option(None, "--select", help="Only these rule codes (comma-separated, prefixes allowed)."),
        ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Skip these rule codes."),
        config: Optional[Path] = typer.Option(None, "--config", help="pyproject.toml holding a tool.hctool.lint table (default: the nearest one)."),
        statistics: bool = typer.Option(False, "--statistics", help="Count findings per rule (text format)."),
        jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Worker processes (default: CPU count)."),
    ) -> None:
        """Find collectives whose execution depends on rank-local state (HC100-HC104).

        Exit status: 0 no findings, 1 findings, 2 usage/config error or a file that could not be analyzed
        (findings in the other files are still printed).
        """
        from hctool.lint.config import load_config
        from hctool.lint.output import FORMATS, print_text, render
        from hctool.lint.runner import lint, stderr_progress

        if fmt not in FORMATS:
            raise UsageError(f"unknown format {fmt!r}", f"choose one of: {', '.join(FORMATS)}")
        cfg = load_config(config).with_cli(select, ignore)
        report = lint(paths, cfg, jobs=jobs, progress=stderr_progress if fmt == "text" else None)
        if fmt == "text":
            from rich.console import Console

            print_text(report, Console(), statistics)
        else:
            out = render(report, fmt)
            if out:
                print(out)
            for e in report.errors:  # machine formats keep stdout clean; errors still reach a human
                print(f"Error: {e.path}:{e.line}: {e.message}", file=sys.stderr)
        raise typer.Exit(report.exit_code)
