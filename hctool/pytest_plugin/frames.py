"""Which frames of a rank's traceback, py-spy stack or faulthandler dump are the user's.

A multi-rank test runs under pytest, pluggy, hctool's recorder and torch.distributed's
wrappers: a rank stopped in `all_reduce` has some 40 frames of theirs around the one line of
the test that matters. The failure shows the user's frames and says how many were hidden.
Shared by the controller (stacks, logs) and the rank worker (tracebacks)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re

# py-spy and faulthandler name a file under a sys.path entry by its path relative to it
_RELATIVE = ("_pytest/", "pytest/", "pluggy/", "hctool/", "torch/distributed/", "<frozen ")
# a thread's start-up frames, under every thread's own
_STDLIB = ("threading.py", "runpy.py")
HIDDEN_WHAT = "pytest, pluggy, hctool, torch.distributed and threading"

_PYSPY_FRAME = re.compile(r"^(?P<indent>\s+)(?P<func>\S.*) \((?P<path>[^()]+?):(?P<line>\d+)\)$")
_FAULTHANDLER_FRAME = re.compile(r'^(?P<indent>\s+)File "(?P<path>.+)", line (?P<line>\d+) in (?P<func>.+)$')
# py-spy: `Thread 123 (idle): "MainThread"`; faulthandler: `Current thread 0x... (most recent call first):`
_THREAD = re.compile(r"^(Thread \S+|Current thread \S+) .*$")
_NOISE = re.compile(r"^(Extension modules: |Process \d+: |Python v\d)")


@functools.lru_cache(maxsize=1)
def _package_dirs() -> tuple[str, ...]:
    """The installed folders of the hidden packages, for absolute paths (found, not imported:
    the controller never imports torch)."""
    dirs = []
    for name, sub in (("_pytest", ""), ("pytest", ""), ("pluggy", ""), ("hctool", ""), ("torch", "distributed")):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(
                os.path.join(os.path.realpath(loc), sub, "") if sub else os.path.join(os.path.realpath(loc), "")
            )
    return tuple(dirs)


@functools.lru_cache(maxsize=1)
def _stdlib_files() -> frozenset[str]:
    import threading

    stdlib = os.path.dirname(os.path.realpath(threading.__file__))
    return frozenset(os.path.join(stdlib, name) for name in _STDLIB)


def is_hidden(path: str) -> bool:
    """A frame of pytest, pluggy, hctool or torch.distributed (or the interpreter's own runpy)."""
    if os.path.isabs(path):
        real = os.path.realpath(path)
        return real.startswith(_package_dirs()) or real in _stdlib_files()
    return path.startswith(_RELATIVE) or path in _STDLIB


class Frame:
    """One frame line of a dump: its file, line and function."""

    __slots__ = ("path", "line", "func")

    def __init__(self, path: str, line: int, func: str):
        self.path, self.line, self.func = path, line, func

    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.func})"


def _frame(line: str) -> Frame | None:
    m = _PYSPY_FRAME.match(line) or _FAULTHANDLER_FRAME.match(line)
    return Frame(m["path"], int(m["line"]), m["func"]) if m else None


def hidden_line(frames: int, threads: int = 0, indent: str = "") -> str:
    what = [f"{frames} frame{'s' if frames != 1 else ''} of {HIDDEN_WHAT}"] if frames else []
    if threads:
        what.append(f"{threads} thread{'s' if threads != 1 else ''} with no frame of yours")
    return f"{indent}({' and '.join(what)} hidden)" if what else ""


def trim(text: str, keep_other_lines: bool) -> tuple[str, list[Frame]]:
    """A dump with only the user's frames: each thread's hidden frames dropped and counted on
    one line, a thread with none of the user's frames dropped whole and counted where its dump
    ends. keep_other_lines: a log (the program's own lines stay); else a py-spy stack (only the
    threads stay). Returns the text and the innermost user frame of each thread kept, in order
    (py-spy and faulthandler list the innermost frame first)."""
    out: list[str] = []
    innermost: list[Frame] = []
    header: str | None = None
    kept: list[str] = []
    indent = "    "
    dropped = 0
    empty_threads = 0

    def end_thread() -> None:
        nonlocal header, kept, dropped, empty_threads
        if header is not None:
            if kept:
                out.extend([header, *kept])
                if dropped:
                    out.append(hidden_line(dropped, indent=indent))
            else:
                empty_threads += 1
        header, kept, dropped = None, [], 0

    def end_dump() -> None:
        nonlocal empty_threads
        end_thread()
        if empty_threads:
            out.append(hidden_line(0, empty_threads))
        empty_threads = 0

    for line in text.splitlines():
        frame = _frame(line)
        if frame is not None and header is not None:
            if is_hidden(frame.path):
                dropped += 1
            else:
                if not kept:
                    innermost.append(frame)
                    indent = line[: len(line) - len(line.lstrip())]
                kept.append(line)
        elif _THREAD.match(line):
            end_thread()
            header = line
        elif header is not None and not line.strip():
            end_thread()  # the blank line after a thread's frames; the dump may go on
        else:
            if header is not None or empty_threads:
                end_dump()
            if keep_other_lines and not _NOISE.match(line):
                out.append(line)
    end_dump()
    return "\n".join(out), innermost
