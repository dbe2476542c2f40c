"""The one exit rule for signals (docs/contracts.md "Exit codes"): a command stopped by SIGINT,
SIGTERM or SIGHUP reaps everything it started, then ends by that same signal.

So the caller sees what it would see had hctool not caught the signal at all: a shell reads
128 + N (130, 143, 129), a Python parent a returncode of -N, and a shell loop or `make` stops on
Ctrl-C (bash goes on after a child that *exits* 130 after SIGINT; it stops after one killed by
it). Python ends itself the same way after an unhandled KeyboardInterrupt.

Every command sees one event, KeyboardInterrupt in the main thread, for all three signals (its
teardown path is the same); `received` remembers which one came.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
received: int | None = None


def as_interrupt(signum, frame) -> None:
    """Handler: remember the signal, raise KeyboardInterrupt (naming it) in the main thread."""
    global received
    received = signum
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def deferred():
    """A stopping signal that comes inside the block takes effect at its end: a child process
    started and registered for reaping is one step, never a child that nobody will kill."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers run in the main thread only; nothing to defer here
        return
    held: list[tuple[int, object]] = []
    old = {s: signal.getsignal(s) for s in STOPPING}
    replaced = {s: h for s, h in old.items() if callable(h)}  # Python handlers (they raise); SIG_DFL/IGN stay
    for s in replaced:
        signal.signal(s, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        for s, h in replaced.items():
            signal.signal(s, h)
        if held:
            signum, frame = held[0]
            replaced[signum](signum, frame)


def install() -> None:
    for sig in STOPPING:
        signal.signal(sig, as_interrupt)


def end_by_received() -> None:
    """After the teardown: end this process by the signal that stopped it (no-op if none came)."""
    if received is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(received, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [received])
    os.kill(os.getpid(), received)
    os._exit(128 + received)  # not reached: the default action ends the process
