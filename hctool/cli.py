"""hctool command line: one module per command group under hctool/commands/.

stdout carries data (with --json only JSON); progress and errors go to stderr.
Heavy imports (torch, the engine) happen inside commands, so --help stays fast.
"""

from __future__ import annotations

import os
import sys

import typer

from hctool import __version__
from hctool.console.errors import UsageError, report_error
from hctool.protocol.safefile import UnsafeFile

app = typer.Typer(
    name="hctool",
    help="Find, reproduce and prevent rank-divergence bugs in tensor-parallel hierarchical KV caches.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"hctool {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More diagnostics on stderr (debug lines)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors on stderr (no progress)."),
) -> None:
    from hctool.console import log

    log.setup(-1 if quiet else verbose)


def _register() -> None:
    # Each command module owns its group; order here is the order in --help.
    from hctool.commands import chaos, consensus, gate, launch, lint, report, repro, schema

    for module in (launch, repro, consensus, lint, chaos, gate, report, schema):
        module.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point: user mistakes become `Error: ...` and exit 2, never a traceback; a command
    stopped by SIGINT, SIGTERM or SIGHUP ends by that signal once it has reaped its children."""
    from hctool.supervise import signals

    signals.install()
    try:
        _main(argv)
    finally:
        signals.end_by_received()


def _main(argv: list[str] | None) -> None:
    from hctool.console.optlimits import bound_numbers

    try:
        command = typer.main.get_command(app)
        bound_numbers(command)  # every numeric option: a number, finite, in range (hctool/console/optlimits.py)
        command(args=argv, prog_name="hctool")
    except UsageError as exc:
        report_error(str(exc), exc.hint)
        sys.exit(2)
    except UnsafeFile as exc:  # a link or FIFO planted where hctool writes (hctool/protocol/safefile.py)
        report_error(exc.strerror, "someone else can write into that folder: use one of your own")
        sys.exit(2)
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # internal error: still one line unless debugging
        if os.environ.get("HCTOOL_DEBUG"):
            raise
        report_error(f"internal error: {type(exc).__name__}: {exc}", "set HCTOOL_DEBUG=1 for a traceback")
        sys.exit(2)
