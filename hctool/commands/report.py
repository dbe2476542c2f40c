"""`hctool report RUN_DIR`: one self-contained HTML file of a run (docs/commands.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from hctool.console.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_command(
        path: Path = typer.Argument(
            ..., help="A run folder of check-consensus run, repro, chaos, or Flight Recorder dumps."
        ),
        output: Path = typer.Option(None, "--output", "-o", help="Where to write it (default: RUN_DIR/report.html)."),
    ) -> None:
        """Write one HTML file (no network needed to open it): verdict, calls aligned by seq, timeline, stacks."""
        from hctool.consensus.trace import TraceError
        from hctool.console import log
        from hctool.protocol.safefile import write_atomic
        from hctool.report import REPORT_NAME, build_html
        from hctool.report.folders import FolderError

        try:
            page = build_html(path)
        except (FolderError, TraceError) as exc:
            raise UsageError(str(exc), "give a folder that check-consensus run, repro or chaos wrote") from None
        out = output or path / REPORT_NAME
        try:  # name-and-rename: a link planted at report.html in a shared folder is replaced, not written through
            write_atomic(out, page.encode("utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc.strerror}", "pick a writable path with -o") from None
        log.info(f"hctool: report in {out}")
