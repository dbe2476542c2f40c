"""thread-slow: a non-main thread returning from a wait (queue.Queue.get, threading.Event.wait,
time.sleep) is held ms longer, after the wait has released its lock. hctool's own threads
(named hctool-*) and the main thread never are."""

from __future__ import annotations

import fnmatch
import threading
import time

from hctool.agent.clock import REAL
from hctool.agent.faults.common import FaultClock, sleep_ms
from hctool.protocol.faults import Fault

KINDS = ("thread-slow",)


def install(clock: FaultClock, faults: list[Fault]) -> None:
    import queue

    main = threading.main_thread().ident

    def late() -> None:
        me = threading.current_thread()
        if me.ident == main or me.name.startswith("hctool-"):
            return
        mine = [f for f in faults if f.thread is None or fnmatch.fnmatchcase(me.name, f.thread)]
        if mine:
            sleep_ms(clock.total_ms(KINDS, mine))

    def after(fn):
        def slowed(*args, **kwargs):
            result = fn(*args, **kwargs)
            late()
            return result

        slowed.__wrapped__ = fn
        return slowed

    queue.Queue.get = after(queue.Queue.get)
    threading.Event.wait = after(threading.Event.wait)
    time.sleep = after(REAL.sleep)
