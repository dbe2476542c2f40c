"""hctool's diagnostics go through `logging` (logger "hctool"), to stderr.

At the default level a message is printed exactly as the old `print(msg,
file=sys.stderr)` did (no prefix added), so scripts that read stderr see the
same bytes; `-q/--quiet` keeps only warnings and errors, `-v/--verbose` adds
debug lines. `Error: ...` lines and data on stdout do not go through here.
"""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("hctool")


class _StderrHandler(logging.Handler):
    """Writes to sys.stderr as it is at the time of the call (pytest's capsys, rich's
    live display and typer's test runner swap it), flushing each line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # a closed stderr must not end the program
            self.handleError(record)


_handler: _StderrHandler | None = None


def setup(verbosity: int = 0) -> logging.Logger:
    """verbosity: -1 quiet (warnings), 0 default (info), 1+ verbose (debug)."""
    global _handler
    if _handler is None:
        _handler = _StderrHandler()
        _handler.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.addHandler(_handler)
        LOGGER.propagate = False
    LOGGER.setLevel(logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO)
    return LOGGER


def get() -> logging.Logger:
    """The logger, set up at the default level on first use (library callers get the
    messages the CLI prints, without configuring anything)."""
    if _handler is None:
        setup(0)
    return LOGGER


def info(msg: str) -> None:
    get().info(msg)


def debug(msg: str) -> None:
    get().debug(msg)


def warning(msg: str) -> None:
    get().warning(msg)


def quiet() -> bool:
    return not get().isEnabledFor(logging.INFO)
