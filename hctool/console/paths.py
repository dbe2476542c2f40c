"""Paths in what hctool shows: relative where a reader can open them from the working directory.

A report is read by someone else, on another machine, or later from the same folder: the
interpreter's install path or a home directory in it says nothing and leaks the machine's
layout. A file under the working directory is shown relative to it (what the user typed, what
opens from there); a file of an installed package as py-spy shows it, from the package down
(`torch/distributed/distributed_c10d.py`); the interpreter by its name. A path anywhere else
stays whole: it is the only way to open that file.
"""

from __future__ import annotations

import functools
import os
import re
import sys


def _roots() -> list[str]:
    """Where installed modules live (site-packages, the standard library), longest first."""
    return _roots_of(tuple(sys.path), os.getcwd())


@functools.lru_cache(maxsize=4)  # an export shortens every frame of every unfinished call
def _roots_of(path: tuple[str, ...], cwd: str) -> list[str]:
    found = {os.path.realpath(p) for p in path if p and os.path.isabs(p) and os.path.isdir(p)}
    found.discard(os.path.realpath(cwd))
    return sorted(found, key=len, reverse=True)


def short_path(path: str, cwd: str | None = None, roots: list[str] | None = None) -> str:
    """`path` relative to `cwd` (default: the working directory) where it lies under it, else
    from the installed package down where it lies under one, else unchanged."""
    if not os.path.isabs(path):
        return path
    base = os.path.realpath(cwd or os.getcwd())
    real = os.path.realpath(path) if os.path.exists(path) else os.path.normpath(path)
    for candidate in (os.path.normpath(path), real):
        if candidate == base or candidate.startswith(base.rstrip(os.sep) + os.sep):
            return os.path.relpath(candidate, base)
    for root in _roots() if roots is None else roots:
        if real.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(real, root)
    return path


def short_frame(frame: str, cwd: str | None = None) -> str:
    """A recorded stack frame, "PATH:LINE function", with its path shortened."""
    path, sep, rest = frame.partition(":")
    return short_path(path, cwd) + sep + rest if sep else frame


_PROCESS = re.compile(r"^(Process \d+: )(\S+)(.*)$")  # py-spy: the process's command line
_PYTHON = re.compile(r"^(Python v\S+ )\((/[^()]+)\)$")  # py-spy: the interpreter's version and path
_PYSPY_FRAME = re.compile(r"^(\s+.* \()(/[^()]+?)(:\d+\))$")  # a frame py-spy left absolute
_FAULTHANDLER_FRAME = re.compile(r'^(\s*File ")(/[^"]+)(".*)$')


def tidy_stack_text(text: str, cwd: str | None = None) -> str:
    """A py-spy or faulthandler dump with its machine paths shortened (short_path); the
    interpreter, first on py-spy's command line and in its version line, by its name."""
    roots = _roots()
    out = []
    for line in text.splitlines():
        if m := _PROCESS.match(line):
            args = [short_path(a, cwd, roots) if a.startswith("/") else a for a in m.group(3).split(" ")]
            line = m.group(1) + os.path.basename(m.group(2)) + " ".join(args)
        elif m := _PYTHON.match(line):
            line = f"{m.group(1)}({os.path.basename(m.group(2))})"
        elif m := _PYSPY_FRAME.match(line) or _FAULTHANDLER_FRAME.match(line):
            line = m.group(1) + short_path(m.group(2), cwd, roots) + m.group(3)
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
