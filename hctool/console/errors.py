"""User-facing errors: one line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import sys


class UsageError(Exception):
    """A mistake the user can fix; carries an optional hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def report_error(message: str, hint: str | None = None) -> None:
    print(f"Error: {message}", file=sys.stderr)
    if hint:
        print(f"Hint: {hint}", file=sys.stderr)
