"""Progress of long work on stderr, only when stderr is a terminal.

One rich live display per process holds every open task, so a task opened
inside another (a chaos exploration, and the repro run of one schedule inside
it) shows as a second line instead of failing (rich allows one live display at
a time). Off a terminal, or with -q, `task()` yields an object whose methods do
nothing and nothing is written: piped and --json output stay as they were.
Log lines printed while the display is up appear above it (rich redirects
sys.stderr, and hctool.console.log writes to sys.stderr as it is at the time).
"""

from __future__ import annotations

import contextlib
import sys
import threading

from hctool.console import log

_lock = threading.Lock()
_display = None  # the rich Progress while any task is open
_open = 0


def enabled() -> bool:
    try:
        return sys.stderr.isatty() and not log.quiet()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


class _Task:
    def __init__(self, display, task_id):
        self._display, self._id = display, task_id

    def update(
        self,
        completed: float | None = None,
        total: float | None = None,
        text: str | None = None,
        advance: float | None = None,
    ) -> None:
        kw: dict = {}
        if completed is not None:
            kw["completed"] = completed
        if total is not None:
            kw["total"] = total
        if text is not None:
            kw["text"] = text
        if advance is not None:
            kw["advance"] = advance
        self._display.update(self._id, **kw)


class _Null:
    def update(self, *args, **kwargs) -> None:
        pass


@contextlib.contextmanager
def task(label: str, total: float | None = None, text: str = ""):
    """A progress line `label [bar] text elapsed` while the block runs."""
    global _display, _open
    if not enabled():
        yield _Null()
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with _lock:
        if _display is None:
            _display = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=24),
                TextColumn("{task.fields[text]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            _display.start()
        _open += 1
        display = _display
        task_id = display.add_task(label, total=total, text=text)
    try:
        yield _Task(display, task_id)
    finally:
        with _lock:
            display.remove_task(task_id)
            _open -= 1
            if _open == 0:
                display.stop()
                _display = None
