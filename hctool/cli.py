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


def command():
    """The click command tree `hctool` runs: every numeric option bounded, every option's help readable."""
    from hctool.console.optlimits import bound_numbers

    built = typer.main.get_command(app)
    bound_numbers(built)  # every numeric option: a number, finite, in range (hctool/console/optlimits.py)
    readable_help(built)
    return built


def readable_help(cmd) -> None:
    """Every option and argument of the tree says what it takes in words, not as a Python type
    (typer 0.29 prints `<list[str]>`, `<int range>`, and `<bool>` beside a flag). One rule for all
    commands, so that none needs a metavar of its own (one set explicitly is kept):
      a flag or a count          nothing
      an int                     N
      a float                    SECONDS where the option is seconds, else its name
      a path                     DIR for a --...-dir, else PATH
      anything else              the option's name (--on-divergence ON_DIVERGENCE), as argparse does
      a list (repeatable)        its item's
      an argument                its name (PATH; PATHS where it takes several), no type column beside it"""
    for sub in getattr(cmd, "commands", {}).values():
        readable_help(sub)
    for param in cmd.params:
        if param.param_type_name == "argument":
            if param.metavar is None:
                param.metavar = param.name.upper()  # the usage line adds "..." where it takes several
            if hasattr(param, "display_type_rich"):  # typer's type column beside the argument's name
                param.display_type_rich = _no_type
        elif param.metavar is None:
            param.metavar = _option_metavar(param)
    # --help is made when help is asked for, not one of cmd.params: a flag like the others
    original = cmd.get_help_option

    def get_help_option(ctx, _original=original):
        option = _original(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    cmd.get_help_option = get_help_option


def _no_type(ctx) -> None:
    return None


def _option_metavar(param) -> str:
    import pathlib
    import typing

    from hctool.console.optlimits import numeric_kind

    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    long = next((o for o in param.opts if o.startswith("--")), param.opts[0]).lstrip("-")
    named = long.replace("-", "_").upper()
    kind = numeric_kind(param)  # int or float, of a list's items too
    if kind is int:
        return "N"
    if kind is float:
        seconds = "second" in (param.help or "").lower() or any(w in long for w in ("timeout", "budget", "after"))
        return "SECONDS" if seconds else named
    descriptor = getattr(param, "type_descriptor", None)  # typer >= 0.29; before, a click type
    if descriptor is not None:
        annotation = descriptor.annotation
        is_path = any(
            isinstance(t, type) and issubclass(t, pathlib.PurePath) for t in (annotation, *typing.get_args(annotation))
        )
    else:
        is_path = getattr(getattr(param, "type", None), "name", "") == "path"
    if is_path:
        return "DIR" if long.endswith("dir") else "PATH"
    return named


def _main(argv: list[str] | None) -> None:
    try:
        command()(args=argv, prog_name="hctool")
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
