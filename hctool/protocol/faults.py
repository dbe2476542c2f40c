"""The fault vocabulary: `KIND:key=value,...`, shared by every runner (repro scenarios,
`--inject`, chaos schedules) and the agent that applies it inside the ranks.

A fault perturbs timing or rank-local resources only; it never issues a collective, so any
divergence it provokes is the program's own. Kinds come in three families:
- generic in-rank kinds need no knowledge of the program (clocks, non-main threads, the
  rank's collectives, file I/O, its CUDA stream) and act on any torch.distributed program;
- by-name kinds act at the entry (or exit) of a function named `pkg.mod:Qual.name`
  (`__main__:fn` for the script run): `delay`, `raise`, and `cuda-sleep` with `fn=`;
- engine kinds act through the seams the engine declares (engine/lab/seams.py);
- controller kinds are carried out by the supervisor from outside the ranks.

Keys: `rank=K` (same as `target=rank:K`), `target=all|one|rank:K` (default all), `ms` (the
magnitude; `pages=N` for the page-count kinds), `p` (probability per operation, default 1),
`start_s`/`duration_s` (the window in seconds after the workload starts; no duration: until
the heal), `at_call=K` (the window counts from the rank's K-th collective instead, so a replay
hits the same step of the program however long its start took; a supervisor's kind acts when the
rank reaches that call, which waits for it), `n` (requests), `role=prefill|decode` (a PD side),
and per kind: `fn`, `when` (entry|exit), `exc` (an exception name), `op`/`group` (collective filters), `path` (a glob)
and `thread` (a thread-name glob). In-rank kinds travel as HCTOOL_FAULTS (';'-joined).
"""

from __future__ import annotations

import builtins
import fnmatch
import re
import zlib
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any

from hctool.protocol.limits import bounded


class Acts(str, Enum):
    """Who carries a fault kind out."""

    RANK = "rank"  # inside the rank: hctool/agent/faults/<family>.py installs it
    SUPERVISOR = "supervisor"  # from outside the ranks: hctool/supervise/faults.py's FaultController
    WORKLOAD = "workload"  # the engine's workload driver: extra or abandoned requests


class Scope(str, Enum):
    """Where a kind can act (and which exploration draws it)."""

    ANY = "any"  # any torch.distributed program (hctool's engine included)
    ENGINE = "engine"  # hctool's engine only (its seams, its HTTP workload)


@dataclass(frozen=True)
class Kind:
    """One fault kind: every fact about it, so every other table (and every hint) is derived.

    `unit`: how the magnitude is written (`ms`, `pages`, or None for none); `needs_magnitude`:
    a spec without it is refused; `keys`: the text keys it takes, `needs` those it requires;
    `draw`: the magnitude range exploration draws (None: it never draws this kind), `count` the
    range of `n`, `weight` how often it is drawn, `drawn_for` the targets whose exploration draws
    it by default, `draw_keys` text keys exploration sets, `window`: False for one-shot kinds
    (no probability, no window: they act once at start_s), `draw_p`: exploration may draw p<1.
    """

    name: str
    family: str
    acts: Acts
    doc: str
    scope: Scope = Scope.ANY
    unit: str | None = "ms"
    needs_magnitude: bool = True
    keys: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    needs_n: bool = False
    draw: tuple[float, float] | None = None
    count: tuple[int, int] | None = None
    weight: int = 1
    drawn_for: tuple[Scope, ...] = ()
    draw_keys: tuple[tuple[str, str], ...] = ()
    window: bool = True
    draw_p: bool = True
    default_ms: float = 0.0  # a magnitude-less kind that still needs a non-zero value (kv-drop: "drop")

    @property
    def by_name(self) -> bool:
        """Acts at a function the spec names (fn= required): exploration cannot make one up."""
        return "fn" in self.needs


_R, _S, _W = Acts.RANK, Acts.SUPERVISOR, Acts.WORKLOAD
ENG = Scope.ENGINE
# The vocabulary: one row per kind. In-rank kinds first (generic, by name, the engine's seams),
# then the supervisor's and the workload's. tests/chaos/test_kinds.py holds every row to an
# installer (or a controller action), a draw range, a docs row and a behaviour test.
KINDS: tuple[Kind, ...] = (
    # -- generic, in the rank: any program --------------------------------------------------------
    Kind(
        "clock-skew",
        "clocks",
        _R,
        "the rank's clocks (time.time/monotonic/perf_counter and _ns) gain ms per second while active",
        draw=(50, 500),
        drawn_for=(ENG, Scope.ANY),
        draw_p=False,
    ),
    Kind(
        "clock-jump",
        "clocks",
        _R,
        "the rank's clocks jump ms ahead when the fault starts",
        draw=(500, 8000),
        drawn_for=(ENG, Scope.ANY),
        draw_p=False,
    ),
    Kind(
        "clock-jitter",
        "clocks",
        _R,
        "each wall-clock reading (time.time) on the rank is off by up to +-ms",
        draw=(5, 100),
        drawn_for=(Scope.ANY,),
        draw_p=False,
    ),
    Kind(
        "thread-slow",
        "threads",
        _R,
        "the rank's non-main Python threads (thread=GLOB: those named so) wake ms late from every wait",
        keys=("thread",),
        draw=(10, 300),
        drawn_for=(Scope.ANY,),
    ),
    Kind(
        "collective-delay",
        "collectives",
        _R,
        "sleep ms before each of the rank's collectives (op=NAME, group=INDEX: only those)",
        keys=("op", "group"),
        draw=(5, 400),
        drawn_for=(Scope.ANY,),
    ),
    Kind(
        "io-delay",
        "files",
        _R,
        "each read and write of a file whose path matches path=GLOB takes ms longer",
        keys=("path",),
        needs=("path",),
        draw=(5, 200),
        drawn_for=(Scope.ANY,),
        draw_keys=(("path", "*"),),
    ),
    Kind(
        "cuda-sleep",
        "cuda",
        _R,
        "CUDA: a ms sleep on the rank's current stream before each collective (fn=: at that function)",
        keys=("fn", "op", "group"),
        draw=(5, 200),
    ),
    # -- by name, in the rank: at a function the spec names ----------------------------------------
    Kind(
        "delay",
        "named",
        _R,
        "sleep ms at the entry (when=exit: the return) of fn=pkg.mod:Qual.name",
        keys=("fn", "when"),
        needs=("fn",),
    ),
    Kind(
        "raise",
        "named",
        _R,
        "raise exc=Name at the entry of fn=pkg.mod:Qual.name",
        unit=None,
        needs_magnitude=False,
        keys=("fn", "exc"),
        needs=("fn", "exc"),
    ),
    # -- the engine's seams, in the rank ------------------------------------------------------------
    Kind(
        "h2d-sleep",
        "copies",
        _R,
        "engine: sleep ms before a host->device copy (load-back)",
        ENG,
        draw=(5, 200),
        weight=2,
        drawn_for=(ENG,),
    ),
    Kind(
        "d2h-sleep",
        "copies",
        _R,
        "engine: sleep ms before a device->host copy (backup)",
        ENG,
        draw=(5, 200),
        weight=2,
        drawn_for=(ENG,),
    ),
    Kind(
        "free-delay",
        "pool",
        _R,
        "engine: device pages return to the free list ms later",
        ENG,
        draw=(20, 600),
        weight=3,
        drawn_for=(ENG,),
    ),
    Kind(
        "host-pool-shrink",
        "pool",
        _R,
        "engine: the rank's host (L2) pool comes out pages=N pages smaller",
        ENG,
        unit="pages",
        draw=(1, 4),
    ),
    Kind(
        "storage-latency",
        "storage",
        _R,
        "engine: each L3 page read takes ms longer",
        ENG,
        draw=(5, 120),
        weight=3,
        drawn_for=(ENG,),
    ),
    Kind(
        "storage-error",
        "storage",
        _R,
        "engine: an L3 read or existence query fails (a miss)",
        ENG,
        unit=None,
        needs_magnitude=False,
        drawn_for=(ENG,),
        draw=(0, 0),
    ),
    Kind(
        "storage-timeout",
        "storage",
        _R,
        "engine: an L3 read hangs ms, then fails as timed out",
        ENG,
        draw=(50, 1500),
        drawn_for=(ENG,),
    ),
    Kind(
        "storage-partial",
        "storage",
        _R,
        "engine: an L3 existence query reports only half of the pages",
        ENG,
        unit=None,
        needs_magnitude=False,
        drawn_for=(ENG,),
        draw=(0, 0),
    ),
    Kind(
        "storage-miss",
        "storage",
        _R,
        "engine: the rank's L3 existence queries report pages=N fewer pages",
        ENG,
        unit="pages",
        draw=(1, 4),
    ),
    Kind("kv-send-delay", "pd", _R, "engine, PD prefill rank: each KV push starts ms later", ENG, draw=(5, 300)),
    Kind(
        "kv-drop",
        "pd",
        _R,
        "engine, PD prefill rank: its KV parts are never sent",
        ENG,
        unit=None,
        needs_magnitude=False,
        default_ms=1.0,
        draw=(0, 0),
    ),
    Kind(
        "bootstrap-delay",
        "pd",
        _R,
        "engine, PD decode rank: each bootstrap registration is ms late",
        ENG,
        draw=(50, 1000),
    ),
    # -- the supervisor, from outside the ranks ----------------------------------------------------
    Kind(
        "rank-pause",
        "signals",
        _S,
        "SIGSTOP the rank for ms, then SIGCONT",
        draw=(100, 2000),
        drawn_for=(ENG, Scope.ANY),
        window=False,
    ),
    Kind("rank-kill", "signals", _S, "SIGKILL the rank", unit=None, needs_magnitude=False, window=False, draw=(0, 0)),
    # -- the engine's workload ----------------------------------------------------------------------
    Kind(
        "request-burst",
        "requests",
        _W,
        "engine: send n extra workload requests at once",
        ENG,
        unit=None,
        needs_magnitude=False,
        needs_n=True,
        count=(2, 12),
        drawn_for=(ENG,),
        window=False,
        draw=(0, 0),
    ),
    Kind(
        "request-cancel",
        "requests",
        _W,
        "engine: send n workload requests and disconnect after ms",
        ENG,
        needs_n=True,
        draw=(50, 500),
        count=(1, 6),
        drawn_for=(ENG,),
        window=False,
    ),
)
KIND: dict[str, Kind] = {k.name: k for k in KINDS}

# Derived views, for the readers that want a set or a {name: doc} table.
FAULT_KINDS = {k.name: k.doc for k in KINDS}
IN_RANK = {k.name: k.doc for k in KINDS if k.acts is Acts.RANK}
ENGINE = {k.name: k.doc for k in KINDS if k.acts is Acts.RANK and k.scope is Scope.ENGINE}
NEEDS_MS = {k.name for k in KINDS if k.needs_magnitude}
BY_PAGES = {k.name for k in KINDS if k.unit == "pages"}  # magnitude written pages=N; held in ms
NEEDS_N = {k.name for k in KINDS if k.needs_n}
TEXT_KEYS = {k.name: k.keys for k in KINDS if k.keys}
NEEDS_TEXT = {k.name: k.needs for k in KINDS if k.needs}
TEXT_FIELDS = ("fn", "when", "exc", "op", "group", "path", "thread")
_KEYS = ("rank", "target", "ms", "p", "start_s", "duration_s", "at_call", "n", "role", *TEXT_FIELDS)
ROLES = ("prefill", "decode")


def drawn_for(target: Scope) -> tuple[str, ...]:
    """The kinds exploration draws by default against this target."""
    return tuple(k.name for k in KINDS if target in k.drawn_for)


def usable_on(target: Scope) -> tuple[str, ...]:
    """The kinds that can act on this target, in the vocabulary's order."""
    return tuple(k.name for k in KINDS if target is Scope.ENGINE or k.scope is Scope.ANY)


def hint(scope: Scope = Scope.ANY) -> str:
    """The kinds a user can inject on this target, for an error's hint: by-name kinds with their
    fn=, the engine's only where the target is the engine."""
    return ", ".join(f"{n}:fn=..." if KIND[n].by_name else n for n in usable_on(scope))


_FN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class Fault:
    kind: str
    ms: float = 0.0
    rank: int | None = None  # None: see target
    target: str = "all"  # all | one | rank:K  (rank=K sets target rank:K)
    p: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None  # None: until the schedule's heal
    n: int = 0
    role: str | None = None  # PD: only this side's ranks (None: every side)
    fn: str | None = None  # pkg.mod:Qual.name (by-name kinds)
    when: str | None = None  # delay: entry (default) or exit
    exc: str | None = None  # raise: a builtin exception name or pkg.mod:Name
    op: str | None = None  # collective-delay / cuda-sleep: only this collective
    group: str | None = None  # ... only the group of this creation index (0: the default group)
    path: str | None = None  # io-delay: a glob over absolute paths
    thread: str | None = None  # thread-slow: a glob over thread names
    at_call: int | None = None  # start_s/duration_s count from the rank's K-th collective (common.FaultClock)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        if self.rank is not None:
            object.__setattr__(self, "target", f"rank:{self.rank}")
        elif self.target.startswith("rank:"):
            object.__setattr__(self, "rank", _int(self.target[5:], "target rank"))
        elif self.target not in ("all", "one"):
            raise ValueError(f"fault {self.kind}: target must be all, one or rank:K, got {self.target!r}")
        for key in ("ms", "p", "start_s", "duration_s"):  # NaN and infinity pass every comparison below;
            value = getattr(self, key)  # ms=1e300 overflowed time.sleep in the rank
            if value is not None and not (value == value and abs(value) != float("inf")):
                raise ValueError(f"fault {self.kind}: {key} must be a finite number, got {value!r}")
            if value is not None and not (key == "p" or value < 0):  # a negative value has its own message below
                bounded(
                    f"fault {key}",
                    value,
                    f"fault {self.kind}: {'pages' if key == 'ms' and self.kind in BY_PAGES else key}",
                )
        if self.ms < 0 or (self.rank is not None and self.rank < 0) or self.n < 0 or self.start_s < 0:
            raise ValueError(f"fault {self.kind}: rank, ms, n and start_s must not be negative")
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"fault {self.kind}: p must be within [0, 1], got {self.p:g}")
        if self.role not in (None, *ROLES):
            raise ValueError(f"fault {self.kind}: role must be prefill or decode, got {self.role!r}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"fault {self.kind}: duration_s must be positive")
        if self.at_call is not None:
            if KIND[self.kind].acts is Acts.WORKLOAD:  # a client sees no rank's calls
                raise ValueError(f"fault {self.kind} acts on the workload, not a rank: it takes no at_call=")
            if isinstance(self.at_call, bool) or not isinstance(self.at_call, int) or self.at_call < 1:
                raise ValueError(f"fault {self.kind}: at_call must be a collective's number, 1 or more")
            bounded("fault at_call", self.at_call, f"fault {self.kind}: at_call")
        for key in TEXT_FIELDS:  # HCTOOL_FAULTS joins specs with ';': one inside a value split the fault in two
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or ";" in value or "," in value):
                raise ValueError(
                    f"fault {self.kind}: {key} must be text without ';' or ',' (they separate faults "
                    f"and keys), got {value!r}"
                )
        allowed = TEXT_KEYS.get(self.kind, ())
        for key in ("fn", "when", "exc", "op", "group", "path", "thread"):
            if getattr(self, key) is not None and key not in allowed:
                raise ValueError(f"fault {self.kind} takes no {key}=; its keys: {', '.join(_keys(self.kind))}")
        for key in NEEDS_TEXT.get(self.kind, ()):
            if not getattr(self, key):
                raise ValueError(f"fault {self.kind} needs {key}=" + ("pkg.mod:Qual.name" if key == "fn" else "..."))
        if self.fn is not None and not _FN.match(self.fn):
            raise ValueError(f"fault {self.kind}: fn must be pkg.mod:Qual.name (or __main__:name), got {self.fn!r}")
        if self.when not in (None, "entry", "exit"):
            raise ValueError(f"fault {self.kind}: when must be entry or exit, got {self.when!r}")
        if self.exc is not None and not (_builtin_exception(self.exc) or _FN.match(self.exc)):
            raise ValueError(
                f"fault {self.kind}: exc must name an exception (TimeoutError, OSError, pkg.mod:Name), got {self.exc!r}"
            )
        if self.group is not None and not self.group.isdigit():
            raise ValueError(f"fault {self.kind}: group must be a creation index (0: the default group)")

    def spec(self) -> str:
        """The text form; defaults are left out, so old specs print as they were written."""
        parts = [] if self.role is None else [f"role={self.role}"]
        parts += [] if self.target == "all" else [f"rank={self.rank}" if self.rank is not None else "target=one"]
        parts += [
            f"{k}={getattr(self, k)}"
            for k in ("fn", "when", "exc", "op", "group", "path", "thread")
            if getattr(self, k) is not None
        ]
        if self.ms or self.kind in NEEDS_MS:
            parts.append(f"{'pages' if self.kind in BY_PAGES else 'ms'}={self.ms:g}")
        parts += [] if self.at_call is None else [f"at_call={self.at_call}"]
        for key, default in (("p", 1.0), ("start_s", 0.0), ("duration_s", None), ("n", 0)):
            value = getattr(self, key)
            if value != default:
                parts.append(f"{key}={value:g}")
        return f"{self.kind}:{','.join(parts)}" if parts else self.kind

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if v is not None or k not in (*TEXT_FIELDS, "at_call")}
        d.pop("rank")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Fault:
        unknown = set(d) - set(_KEYS) - {"kind"}
        if unknown or "kind" not in d:
            raise ValueError(f"bad fault {d!r}: needs kind; known keys: {', '.join(_KEYS)}")
        unit = "pages" if d["kind"] in BY_PAGES else "ms"
        return parse_fault(
            f"{d['kind']}:"
            + ",".join(f"{unit if k == 'ms' else k}={v}" for k, v in d.items() if k != "kind" and v is not None)
        )

    def applies_to(self, rank: int, role: str | None = None) -> bool:
        return (self.rank is None or self.rank == rank) and (self.role is None or self.role == role)

    def resolved(self, world_size: int, salt: int = 0) -> Fault:
        """`one` becomes a concrete rank, chosen from the fault's text and a salt (a
        schedule's seed), so a replay hits the same rank."""
        if self.target != "one":
            return self
        return replace(self, target="all", rank=(zlib.crc32(self.spec().encode()) + salt) % max(1, world_size))

    def active(self, t: float) -> bool:
        """Active at t seconds on the fault's own clock (from the workload's start, or for at_call=
        from the rank's K-th collective: common.FaultClock.since)."""
        return self.start_s <= t and (self.duration_s is None or t < self.start_s + self.duration_s)

    def matches_path(self, path: str) -> bool:
        return self.path is not None and fnmatch.fnmatchcase(path, self.path)


def anchor_file(clock_file: str, rank: int, k: int) -> str:
    """The file a rank writes beside the fault clock when it reaches its K-th collective, where a
    supervisor's fault anchored there (at_call=K) waits; the supervisor adds `.done` once it acted."""
    import os

    return os.path.join(os.path.dirname(clock_file), f"anchor-rank{rank}-call{k}")


def _builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def _keys(kind: str) -> tuple[str, ...]:
    """The text form's keys for a kind; a page-count kind writes its magnitude pages=N (kept in .ms)."""
    text = TEXT_KEYS.get(kind, ())
    keys = [k for k in _KEYS if k not in ("fn", "when", "exc", "op", "group", "path", "thread") or k in text]
    return tuple("pages" if k == "ms" and kind in BY_PAGES else k for k in keys)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}") from None


_NUMERIC = ("ms", "p", "start_s", "duration_s")
_INTEGER = ("rank", "n", "at_call")


def parse_fault(spec: str) -> Fault:
    """Parse one spec; ValueError with a one-line reason on bad input."""
    kind, _, params = spec.strip().partition(":")
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault {kind!r} in {spec!r}; known: {', '.join(FAULT_KINDS)}")
    values: dict = {}
    for item in filter(None, params.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _keys(kind):
            raise ValueError(f"bad parameter {item!r} in {spec!r}; keys: {', '.join(_keys(kind))}")
        values["ms" if key == "pages" else key] = value.strip()
    if KIND[kind].default_ms:  # kv-drop: no magnitude, any positive value means "drop"
        values.setdefault("ms", f"{KIND[kind].default_ms:g}")
    if kind in NEEDS_MS and "ms" not in values:
        raise ValueError(f"fault {spec!r} needs {'pages' if kind in BY_PAGES else 'ms'}=N")
    if kind in NEEDS_N and "n" not in values:
        raise ValueError(f"fault {spec!r} needs n=N")
    try:
        kw: dict[str, Any] = {
            k: (float(v) if k in _NUMERIC else int(v) if k in _INTEGER else v) for k, v in values.items()
        }
    except ValueError:
        raise ValueError(
            f"fault {spec!r}: rank, n and at_call must be integers, ms, p, start_s, duration_s numbers"
        ) from None
    try:
        return Fault(kind, **kw)
    except ValueError as exc:
        raise ValueError(f"{exc} (in {spec!r})") from None


def parse_faults(text: str) -> list[Fault]:
    return [parse_fault(s) for s in text.split(";") if s.strip()]
