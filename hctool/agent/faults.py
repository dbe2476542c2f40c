"""In-rank faults: the kinds of hctool/protocol/faults.py that act inside a rank.

Generic kinds patch what any program uses: the `time` module (clock-skew, clock-jump,
clock-jitter), waits of non-main threads (thread-slow), the rank's recorded collectives
(collective-delay, cuda-sleep), `open()` (io-delay). By-name kinds wrap a named function
(agent/names.py). Engine kinds go through the engine's declared seams and fault points
(engine/lab/seams.py); none of them touches the engine's state directly.

Time runs from the workload's start, which a supervisor writes to the file named by
HCTOOL_FAULTS_T0 (until it exists, or without it, the clock reads 0, so faults starting at 0
are on from launch); at the heal it adds the heal's second, and from then on no fault fires.
Probabilities draw from a rank-local RNG seeded from the fault and the rank, so a replay draws
alike. Each fault counts how often it fired; counts.py writes them beside the traces.
"""

from __future__ import annotations

import builtins
import fnmatch
import io
import os
import random
import threading
import time

from hctool.agent import counts, names
from hctool.agent.clock import REAL
from hctool.agent.hooks import when_imported
from hctool.protocol import env as protocol_env
from hctool.protocol.faults import Fault
from hctool.protocol.safefile import read_regular

SEAMS_MODULE = "engine.lab.seams"


class FaultClock:
    """Seconds since the workload started (0 before), and which faults fire now."""

    def __init__(self, faults: list[Fault], rank: int):
        self.faults = faults
        self.path = os.environ.get(protocol_env.FAULTS_T0)
        self.t0: float | None = None if self.path else REAL.time()
        self._next_look = 0.0
        self.heal: float | None = None
        self.rng = {f: random.Random(f"{f.spec()}#{rank}") for f in faults}

    def now(self) -> float:
        """Seconds since the workload started; the file holds "T0 [HEAL_S]" and is re-read
        every 0.1 s until the heal is known."""
        if self.path and self.heal is None:
            mono = REAL.monotonic()
            if mono >= self._next_look:
                self._next_look = mono + 0.1
                try:  # the run folder may be shared: never block on a FIFO or follow a link there
                    parts = [float(x) for x in read_regular(self.path, 4096).split()]
                    self.t0 = parts[0]
                    self.heal = parts[1] if len(parts) > 1 else None
                except (OSError, ValueError, IndexError):
                    pass
        return 0.0 if self.t0 is None else max(0.0, REAL.time() - self.t0)

    def firing(self, kinds, faults=None) -> list[Fault]:
        """Active faults of these kinds that fire for this operation (probability p); each
        one returned is counted as fired."""
        t = self.now()
        if self.heal is not None and t >= self.heal:
            return []
        out = [
            f
            for f in (faults if faults is not None else self.faults)
            if f.kind in kinds and f.active(t) and (f.p >= 1.0 or self.rng[f].random() < f.p)
        ]
        for f in out:
            counts.fired(f)
        return out


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        REAL.sleep(ms / 1000.0)


# -- clocks ---------------------------------------------------------------------------


def _install_clocks(clock: FaultClock, faults: list[Fault]) -> None:
    """time.time/monotonic/perf_counter (and _ns) of the whole rank gain the skew and jumps
    (never going back; after the heal the clock keeps what it gained); time.time also gets
    the jitter. The agent itself reads REAL clocks."""
    skews = [f for f in faults if f.kind in ("clock-skew", "clock-jump")]
    jitters = [f for f in faults if f.kind == "clock-jitter"]
    took_effect: set[Fault] = set()

    def offset() -> float:
        t, off = clock.now(), 0.0
        if clock.heal is not None:
            t = min(t, clock.heal)
        for f in skews:
            if t < f.start_s:
                continue
            if f not in took_effect:  # a clock fault "fires" once: when it starts to act
                took_effect.add(f)
                counts.fired(f)
            active = (t if f.duration_s is None else min(t, f.start_s + f.duration_s)) - f.start_s
            off += f.ms / 1000.0 if f.kind == "clock-jump" else f.ms / 1000.0 * active
        return off

    rng = random.Random(f"jitter#{os.environ.get('RANK', '0')}")

    def jitter() -> float:
        total = sum(f.ms for f in clock.firing(("clock-jitter",), jitters)) if jitters else 0.0
        return rng.uniform(-total, total) / 1000.0 if total else 0.0

    if skews:
        time.monotonic = lambda: REAL.monotonic() + offset()
        time.perf_counter = lambda: REAL.perf_counter() + offset()
        time.monotonic_ns = lambda: REAL.monotonic_ns() + int(offset() * 1e9)
        time.perf_counter_ns = lambda: REAL.perf_counter_ns() + int(offset() * 1e9)
    if skews or jitters:
        time.time = lambda: REAL.time() + offset() + jitter()
        time.time_ns = lambda: REAL.time_ns() + int((offset() + jitter()) * 1e9)


# -- non-main threads -------------------------------------------------------------------


def _install_thread_slow(clock: FaultClock, faults: list[Fault]) -> None:
    """A non-main thread returning from a wait (queue.Queue.get, threading.Event.wait,
    time.sleep) is held ms longer, after the wait has released its lock. hctool's own
    threads (named hctool-*) and the main thread never are."""
    import queue

    main = threading.main_thread().ident

    def late() -> None:
        me = threading.current_thread()
        if me.ident == main or me.name.startswith("hctool-"):
            return
        mine = [f for f in faults if f.thread is None or fnmatch.fnmatchcase(me.name, f.thread)]
        if mine:
            _sleep_ms(sum(f.ms for f in clock.firing(("thread-slow",), mine)))

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


# -- collectives ----------------------------------------------------------------------------


def _install_collective_faults(clock: FaultClock, faults: list[Fault]) -> None:
    """collective-delay and cuda-sleep run before each recorded collective of this rank (the
    capture layer calls state.S.before_call). The C hot paths do not call Python, so they are
    turned off in this rank (a chaos run's cost, not a normal run's)."""
    from hctool.agent.capture import state

    os.environ[protocol_env.FASTPATH] = "0"
    os.environ[protocol_env.C10D_KERNEL] = "0"
    delays = [f for f in faults if f.kind == "collective-delay"]
    sleeps = [f for f in faults if f.kind == "cuda-sleep" and f.fn is None]

    def matching(fs, op: str, group_index: str) -> list[Fault]:
        return [f for f in fs if (f.op is None or f.op == op) and (f.group is None or f.group == group_index)]

    def before_call(op: str, group_index: str) -> None:
        if delays:
            _sleep_ms(sum(f.ms for f in clock.firing(("collective-delay",), matching(delays, op, group_index))))
        if sleeps:
            _cuda_sleep(sum(f.ms for f in clock.firing(("cuda-sleep",), matching(sleeps, op, group_index))))

    state.S.before_call = before_call


_cycles_per_ms: dict[int, float] = {}


def _cuda_sleep(ms: float) -> None:
    """torch.cuda._sleep spins for GPU cycles; the rate is timed once per device, as the
    engine's streams do (engine/streams.py sleep_cycles_per_ms)."""
    if ms <= 0:
        return
    import torch

    if not torch.cuda.is_available():
        return
    index = torch.cuda.current_device()
    rate = _cycles_per_ms.get(index)
    if rate is None:
        cycles = 20_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles // 10)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rate = _cycles_per_ms[index] = cycles / max(start.elapsed_time(end), 1e-3)
    torch.cuda._sleep(int(ms * rate))


# -- files --------------------------------------------------------------------------------


class _SlowFile:
    """A file object whose reads and writes take ms longer; everything else is the file's."""

    def __init__(self, f, delay) -> None:
        object.__setattr__(self, "_f", f)
        object.__setattr__(self, "_delay", delay)

    def __getattr__(self, name):
        value = getattr(self._f, name)
        if name in ("read", "read1", "readinto", "readline", "readlines", "write", "writelines"):
            delay = self._delay

            def slowed(*a, **kw):
                delay()
                return value(*a, **kw)

            return slowed
        return value

    def __setattr__(self, name, value) -> None:
        setattr(self._f, name, value)

    def __iter__(self):
        return iter(self.readline, "" if "b" not in getattr(self._f, "mode", "") else b"")

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def _install_io_delay(clock: FaultClock, faults: list[Fault]) -> None:
    real_open = builtins.open

    def slow_open(file, *args, **kwargs):
        f = real_open(file, *args, **kwargs)
        try:
            path = os.path.abspath(os.fsdecode(file)) if not isinstance(file, int) else ""
        except (TypeError, ValueError):
            return f
        mine = [x for x in faults if x.matches_path(path)]
        if not mine:
            return f
        return _SlowFile(f, lambda: _sleep_ms(sum(x.ms for x in clock.firing(("io-delay",), mine))))

    builtins.open = slow_open
    io.open = slow_open


# -- by name ------------------------------------------------------------------------------


def _exception(name: str) -> type[BaseException]:
    value = getattr(builtins, name, None)
    if isinstance(value, type) and issubclass(value, BaseException):
        return value
    import importlib

    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def _install_by_name(clock: FaultClock, f: Fault) -> None:
    if f.kind == "raise":
        _on(clock, f, f.fn, lambda: _raise(_exception(f.exc), f))
    elif f.kind == "cuda-sleep":
        _on(clock, f, f.fn, lambda: _cuda_sleep(f.ms))
    elif f.when == "exit":
        counts.track_target(f, f.fn)
        names.on_call(f.fn, after=lambda caller, result: _sleep_ms(sum(x.ms for x in clock.firing(("delay",), [f]))))
    else:
        _on(clock, f, f.fn, lambda: _sleep_ms(f.ms))


# -- the engine's seams ---------------------------------------------------------------------


def _install_engine(clock: FaultClock, faults: list[Fault]) -> None:
    def ms(*which):
        return lambda *_: sum(f.ms for f in clock.firing(which))

    def storage_exists(n: int) -> int:
        n = n // 2 if clock.firing(("storage-partial",)) else n
        return max(0, n - int(sum(f.ms for f in clock.firing(("storage-miss",)))))

    def install(seams) -> None:
        seams.SEAMS.install(
            copy_delay_ms=lambda stream: sum(
                f.ms
                for f in clock.firing(("h2d-sleep",) if stream == "h2d" else ("d2h-sleep",) if stream == "d2h" else ())
            ),
            free_delay_ms=ms("free-delay"),
            kv_send_delay_ms=ms("kv-send-delay"),
            kv_dropped=lambda: bool(clock.firing(("kv-drop",))),
            bootstrap_delay_ms=ms("bootstrap-delay"),
            storage_exists=storage_exists,
            host_pool_pages=lambda pages: pages - int(sum(f.ms for f in clock.firing(("host-pool-shrink",)))),
        )

    when_imported(SEAMS_MODULE, install)
    # The storage faults act on the engine's named functions: one mechanism with delay/raise
    # (the engine's StorageIO takes an OSError from its backend as a miss).
    from engine.lab.seams import POINTS  # a plain module: no torch, no engine state

    get, query = POINTS["storage_get"], POINTS["storage_query"]
    for f in faults:
        if f.kind == "storage-latency":
            _on(clock, f, get, lambda f=f: _sleep_ms(f.ms))
        elif f.kind == "storage-timeout":
            _on(clock, f, get, lambda f=f: (_sleep_ms(f.ms), _raise(TimeoutError, f)))
        elif f.kind == "storage-error":
            for target in (get, query):
                _on(clock, f, target, lambda f=f: _raise(OSError, f))


def _on(clock: FaultClock, f: Fault, target: str, act) -> None:
    """At each entry of target, if f fires: act()."""
    counts.track_target(f, target)

    def before(caller, args, kwargs):
        if clock.firing((f.kind,), [f]):
            act()

    names.on_call(target, before=before)


def _raise(exc: type[BaseException], f: Fault):
    raise exc(f"hctool fault {f.spec()}")


# -- entry ------------------------------------------------------------------------------------


def install(faults: list[Fault], rank: int) -> None:
    """Install this rank's faults (already filtered for it)."""
    clock = FaultClock(faults, rank)
    counts.start(faults, rank)
    by_kind = lambda *ks: [f for f in faults if f.kind in ks]  # noqa: E731
    _install_clocks(clock, faults)
    if by_kind("thread-slow"):
        _install_thread_slow(clock, by_kind("thread-slow"))
    if by_kind("collective-delay") or [f for f in by_kind("cuda-sleep") if f.fn is None]:
        _install_collective_faults(clock, faults)
    if by_kind("io-delay"):
        _install_io_delay(clock, by_kind("io-delay"))
    for f in faults:
        if f.kind in ("delay", "raise") or (f.kind == "cuda-sleep" and f.fn):
            _install_by_name(clock, f)
    engine = [f for f in faults if f.kind in ENGINE_KINDS]
    if engine:
        _install_engine(clock, engine)


ENGINE_KINDS = {
    "h2d-sleep",
    "d2h-sleep",
    "free-delay",
    "storage-latency",
    "storage-error",
    "storage-timeout",
    "storage-partial",
    "host-pool-shrink",
    "storage-miss",
    "kv-send-delay",
    "kv-drop",
    "bootstrap-delay",
}


def install_from_env() -> list[Fault]:
    """Apply the in-rank faults of HCTOOL_FAULTS that target this rank. A process without
    RANK is not a rank (torchrun's launcher, the engine's frontend): it gets none."""
    import sys

    from hctool.protocol.faults import IN_RANK, parse_faults

    faults = parse_faults(os.environ.get(protocol_env.FAULTS, ""))
    if "RANK" not in os.environ:
        return faults
    rank, role = int(os.environ["RANK"]), os.environ.get(protocol_env.ROLE)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mine = [f for f in (f.resolved(world) for f in faults) if f.kind in IN_RANK and f.applies_to(rank, role)]
    if mine:
        install(mine, rank)
        sys.stderr.write(f"hctool: rank {rank}: faults {'; '.join(f.spec() for f in mine)}\n")
    return faults
