"""`hctool lint`: static analysis for collectives under rank-local control flow."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from hctool.console.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("lint")
    def lint_command(
        paths: list[Path] = typer.Argument(..., help="Python files or directories to analyze."),
        fmt: str = typer.Option("text", "--format", "-f", help="text, json, sarif or github."),
        as_json: bool = typer.Option(False, "--json", help="Same as --format json (as in hctool's other commands)."),
        select: list[str] | None = typer.Option(
            None, "--select", help="Only these rule codes (comma-separated, prefixes allowed)."
        ),
        ignore: list[str] | None = typer.Option(None, "--ignore", help="Skip these rule codes."),
        config: Path | None = typer.Option(
            None, "--config", help="pyproject.toml holding a tool.hctool.lint table (default: the nearest one)."
        ),
        statistics: bool = typer.Option(
            False, "--statistics", help="Print only the count of findings per rule (text format)."
        ),
        jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, help="Worker processes (default: CPU count)."),
        baseline: Path | None = typer.Option(
            None, "--baseline", help="Report only findings not in this baseline (JSON from --write-baseline)."
        ),
        write_baseline: Path | None = typer.Option(
            None, "--write-baseline", help="Write all current findings to this baseline file and exit 0."
        ),
        diff: str | None = typer.Option(
            None, "--diff", help="Only findings on lines changed since this git ref (working tree vs REF)."
        ),
        severity: str | None = typer.Option(
            None, "--severity", help="Only findings of this severity or above: low, medium (a premise), high."
        ),
        no_cache: bool = typer.Option(
            False,
            "--no-cache",
            help="Analyze every file afresh and write no cache (default cache: $HCTOOL_CACHE_DIR or ~/.cache/hctool).",
        ),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Findings only: no progress, no summary line."),
        verbose: int = typer.Option(
            0, "--verbose", "-v", count=True, help="More diagnostics on stderr (the run's peak memory among them)."
        ),
    ) -> None:
        """Find collectives whose execution depends on rank-local state (HC100-HC104).

        Exit status: 0 no findings, 1 findings, 2 usage/config error or a file that could not be analyzed
        (findings in the other files are still printed). With --baseline, only findings not in the
        baseline count; --write-baseline exits 0.
        """
        from hctool.console import log

        if quiet or verbose:  # also accepted after the subcommand, as ruff takes them
            log.setup(-1 if quiet else verbose)
        from hctool.lint.adopt import apply_baseline, changed_lines, filter_diff, read_baseline
        from hctool.lint.adopt import write_baseline as write_baseline_file
        from hctool.lint.config import load_config
        from hctool.lint.output import FORMATS, _rel, print_text, render
        from hctool.lint.runner import lint, stderr_progress

        if as_json:
            if fmt not in ("text", "json"):
                raise UsageError(f"--json and --format {fmt} exclude each other", "pick one output format")
            fmt = "json"
        if fmt not in FORMATS:
            raise UsageError(f"unknown format {fmt!r}", f"choose one of: {', '.join(FORMATS)}")
        if baseline is not None and write_baseline is not None:
            raise UsageError("--baseline and --write-baseline exclude each other", "write it once, then read it")
        from hctool.lint.sources import LEVELS

        if severity is not None and severity not in LEVELS:
            raise UsageError(f"unknown severity {severity!r}", f"choose one of: {', '.join(LEVELS)}")
        cfg = load_config(config).with_cli(select, ignore)
        known = read_baseline(baseline) if baseline is not None else None  # bad file: exit 2 before the work
        cwd = Path.cwd()
        where = (cwd / paths[0]).resolve() if paths else cwd
        if diff is not None:
            changed_lines(where, diff)  # not a git repository / unknown ref: exit 2 before the work
        from hctool.protocol.env import cache_root

        report = lint(
            paths,
            cfg,
            jobs=jobs,
            progress=stderr_progress if fmt == "text" else None,
            cache_dir=None if no_cache else cache_root(),
        )
        from hctool.lint.bounded import peak_mib

        own, child = peak_mib()
        log.LOGGER.debug(
            f"peak memory: {own:.0f} MiB in this process, {child:.0f} MiB in the largest worker "
            f"(a file over 1 MiB is parsed within {cfg.memory_mib} MiB: docs/lint.md 'Memory')"
        )
        rel = lambda p: _rel(p, report)  # noqa: E731
        if write_baseline is not None:
            n = write_baseline_file(write_baseline, report.findings, rel, cwd)
            print(f"wrote {n} baseline entries ({len(report.findings)} findings) to {write_baseline}", file=sys.stderr)
            for e in report.errors:
                print(f"Error: {e.path}:{e.line}: {e.message}", file=sys.stderr)
            raise typer.Exit(2 if report.errors else 0)
        if diff is not None:
            report.findings = filter_diff(report.findings, cwd, where, diff)
        if severity is not None:
            report.findings = [f for f in report.findings if LEVELS.index(f.severity) >= LEVELS.index(severity)]
        if known is not None:
            result = apply_baseline(report.findings, known, rel, cwd)
            report.findings = result.new
            for k, n in result.fixed:
                print(
                    f"fixed: {k.rule} {k.path} in {k.function or '<module>'}: {k.source} "
                    f"({n} baseline entr{'y' if n == 1 else 'ies'} no longer found)",
                    file=sys.stderr,
                )
        if fmt == "text":
            from rich.console import Console

            print_text(report, Console(), statistics, quiet)
        else:
            out = render(report, fmt)
            if out:
                print(out)
            for e in report.errors:  # machine formats keep stdout clean; errors still reach a human
                print(f"Error: {e.path}:{e.line}: {e.message}", file=sys.stderr)
        raise typer.Exit(report.exit_code)
