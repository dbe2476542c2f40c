"""The check-consensus report, typed: what the analyzer returns and every renderer takes.

`Report.to_json()` is the contract of docs/contracts.md (the shape scripts rely on, ranks
as string keys); `Report.from_json()` reads one back (a report.json of a run folder, a chaos
record, a plugin's result), checking types: a document of the wrong shape is a ReportError
(a ValueError) naming the field, never a TypeError further on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class ReportError(ValueError):
    """A document that is not a check-consensus report."""


class Verdict(str, Enum):
    CONSISTENT = "consistent"  # every expected rank seen whole, agreeing, ended cleanly
    DIVERGED = "diverged"
    HUNG = "hung"
    CRASHED = "crashed"
    INCOMPLETE = "incomplete"  # ranks seen, but not the whole run (docs/consensus.md "Verdicts")
    NO_COLLECTIVES = "no_collectives"  # process groups formed, no collective call recorded
    NO_PROCESS_GROUP = "no_process_group"  # no rank of this run recorded anything

    @property
    def exit_code(self) -> int:
        return 0 if self is Verdict.CONSISTENT else 1

    @property
    def seen(self) -> bool:
        """Whether the verdict is about calls that were seen (a finding or consistent), not about
        what could not be seen."""
        return self not in (Verdict.INCOMPLETE, Verdict.NO_COLLECTIVES, Verdict.NO_PROCESS_GROUP)


class Kind(str, Enum):
    EXTRA = "extra"  # the culprit made a call its peers did not
    MISSING = "missing"  # the culprit did not make a call its peers made (skipped it, left a loop, died)
    OP = "op"
    SHAPE = "shape"
    DTYPE = "dtype"
    REDUCE_OP = "reduce_op"
    ROOT = "root"
    LABEL = "label"
    GROUP = "group"  # the ranks created other process groups, or in another order
    WAIT_CYCLE = "wait_cycle"
    SITE = "site"


class Confidence(str, Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


def _ranks_dict(d: Any, what: str) -> dict:
    if not isinstance(d, dict):
        raise ReportError(f"{what} must be an object, got {type(d).__name__}")
    return d


def _str_or_none(d: dict, key: str, what: str) -> str | None:
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise ReportError(f"{what}.{key} must be a string")
    return v


def _int_or_none(d: dict, key: str, what: str) -> int | None:
    v = d.get(key)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
        raise ReportError(f"{what}.{key} must be an integer")
    return v


def _list(d: dict, key: str, what: str) -> list:
    v = d.get(key) or []
    if not isinstance(v, list):
        raise ReportError(f"{what}.{key} must be a list")
    return v


@dataclass
class Call:
    """One call as the report names it."""

    op: str | None
    site: str | None = None
    function: str | None = None
    group: str | None = None
    shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    reduce_op: str | None = None
    root: int | None = None
    label: str | None = None
    stack: list[str] = field(default_factory=list)  # "file.py:LINE function", innermost first

    def describe(self) -> str:
        """`all_reduce [[4]] float32 op=MAX root/peer=0`"""
        if self.op is None:
            return "-"
        text = f"{self.op} {self.shapes} {','.join(self.dtypes)}".rstrip()
        if self.reduce_op:
            text += f" op={self.reduce_op}"
        if self.root is not None:
            text += f" root/peer={self.root}"
        if self.label:
            text += f" label={self.label!r}"
        return text

    def where(self) -> str:
        """`all_reduce at train.py:6 (log_metric)`"""
        fn = f" ({self.function})" if self.function and self.function != "<module>" else ""
        return f"{self.op} at {self.site or '?'}{fn}"

    def _json(self) -> dict:
        return {
            "op": self.op,
            "site": self.site,
            "function": self.function,
            "shapes": self.shapes,
            "dtypes": self.dtypes,
            "reduce_op": self.reduce_op,
            "root": self.root,
            "label": self.label,
        }

    @classmethod
    def _read(cls, d: dict, what: str) -> dict:
        _ranks_dict(d, what)
        stack = _list(d, "stack", what)
        if not all(isinstance(s, str) for s in stack):
            raise ReportError(f"{what}.stack must be a list of strings")
        return {
            "op": _str_or_none(d, "op", what),
            "site": _str_or_none(d, "site", what),
            "function": _str_or_none(d, "function", what),
            "shapes": _list(d, "shapes", what),
            "dtypes": [str(x) for x in _list(d, "dtypes", what)],
            "reduce_op": _str_or_none(d, "reduce_op", what),
            "root": _int_or_none(d, "root", what),
            "label": _str_or_none(d, "label", what),
            "stack": stack,
        }


@dataclass
class RankCall(Call):
    """A rank's call at the divergence (the contract's per-rank entry)."""

    state: str = "completed"  # "completed" | "blocked" | "absent"
    last_seen: str | None = None  # for an absent rank: its last recorded call
    probed: bool = False  # the run recorded probes: `probe` is said (None: none before this call)
    probe: dict | None = None  # the last probed function it entered before this call

    def to_json(self) -> dict:
        out = dict(self._json(), state=self.state)
        if self.state != "absent":
            out["stack"] = self.stack
        if self.last_seen is not None:
            out["last_seen"] = self.last_seen
        if self.probed:
            out["probe"] = self.probe
        return out

    @classmethod
    def from_json(cls, d: dict, what: str) -> RankCall:
        base = Call._read(d, what)
        state = d.get("state", "completed")
        if state not in ("completed", "blocked", "absent", "failed"):
            raise ReportError(f"{what}.state {state!r} is not completed, blocked or absent")
        probe = d.get("probe")
        if probe is not None and not isinstance(probe, dict):
            raise ReportError(f"{what}.probe must be an object")
        return cls(**base, state=state, last_seen=_str_or_none(d, "last_seen", what), probed="probe" in d, probe=probe)


@dataclass
class Cause:
    """The first call with no counterpart (or the call that differs), and whose path deviated."""

    rank: int  # the rank that holds the call (for a skip: the peer that made it)
    seq: int
    kind: Kind
    culprit_ranks: list[int]
    call: Call
    after: dict | None = None  # {"op", "site", "count"}: the run of calls right before it

    def to_json(self) -> dict:
        return dict(
            self.call._json(),
            group=self.call.group,
            stack=self.call.stack,
            rank=self.rank,
            seq=self.seq,
            kind=self.kind.value,
            culprit_ranks=self.culprit_ranks,
            after=self.after,
        )

    @classmethod
    def from_json(cls, d: dict, what: str = "cause") -> Cause:
        base = Call._read(d, what)
        base["group"] = _str_or_none(d, "group", what)
        rank, seq = _int_or_none(d, "rank", what), _int_or_none(d, "seq", what)
        if rank is None or seq is None:
            raise ReportError(f"{what} needs rank and seq")
        after = d.get("after")
        if after is not None and not isinstance(after, dict):
            raise ReportError(f"{what}.after must be an object")
        return cls(
            rank,
            seq,
            _kind(d.get("kind"), what),
            _int_list(d.get("culprit_ranks"), f"{what}.culprit_ranks"),
            Call(**base),
            after,
        )


@dataclass
class Symptom:
    """Where a rank was when the run ended: the call it blocked or failed in, or how it ended."""

    state: str  # "blocked" | "failed" | "ended" | "crashed" | "running" | "absent"
    call: Call = field(default_factory=lambda: Call(None))
    seq: int | None = None
    error: str | None = None

    def to_json(self) -> dict:
        out = dict(self.call._json(), group=self.call.group, state=self.state)
        if self.seq is not None:
            out["seq"] = self.seq
        if self.error:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, d: dict, what: str) -> Symptom:
        base = Call._read(d, what)
        base["group"] = _str_or_none(d, "group", what)
        state = d.get("state")
        if not isinstance(state, str):
            raise ReportError(f"{what}.state must be a string")
        return cls(state, Call(**base), _int_or_none(d, "seq", what), _str_or_none(d, "error", what))

    def words(self) -> str:
        """`blocked in barrier at train.py:19`"""
        if self.state in ("blocked", "failed"):
            text = f"{self.state} in {self.call.where()}"
            return text + (f" ({self.error})" if self.error and self.state == "failed" else "")
        if self.state == "ended":
            return "ended" + (f" after {self.call.where()}" if self.call.op else " with no call")
        if self.state == "crashed":
            return (
                "crashed"
                + (f": {self.error}" if self.error else "")
                + (f" after {self.call.where()}" if self.call.op else "")
            )
        return {"running": "still running", "absent": "never seen"}.get(self.state, self.state)


@dataclass
class Divergence:
    group: str
    seq: int
    kind: Kind
    culprit_ranks: list[int]
    ranks: dict[int, RankCall]
    cause: Cause | None = None
    symptom: dict[int, Symptom] = field(default_factory=dict)
    confidence: Confidence = Confidence.HIGH
    basis: str | None = None
    alternative: str | None = None
    deadlock: str | None = None
    cycle: list[dict] = field(default_factory=list)
    never_reached: bool = False  # missing: the culprits never got to the call (alive elsewhere, or dead), not a skip

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "group": self.group,
            "seq": self.seq,
            "kind": self.kind.value,
            "culprit_ranks": self.culprit_ranks,
            "ranks": {str(r): e.to_json() for r, e in sorted(self.ranks.items())},
        }
        if self.cause is not None:
            out["cause"] = self.cause.to_json()
        out["symptom"] = {str(r): s.to_json() for r, s in sorted(self.symptom.items())}
        out["confidence"] = self.confidence.value
        out["basis"] = self.basis
        if self.alternative:
            out["alternative"] = self.alternative
        if self.deadlock:
            out["deadlock"] = self.deadlock
            out["cycle"] = self.cycle
        if self.never_reached:
            out["never_reached"] = True
        return out

    @classmethod
    def from_json(cls, d: Any) -> Divergence:
        what = "first_divergence"
        _ranks_dict(d, what)
        group, seq = d.get("group"), d.get("seq")
        if not isinstance(group, str) or not isinstance(seq, int) or isinstance(seq, bool):
            raise ReportError(f"{what} needs a group (string) and a seq (integer)")
        ranks = {
            _rank(r, f"{what}.ranks"): RankCall.from_json(_ranks_dict(e, f"{what}.ranks[{r}]"), f"{what}.ranks[{r}]")
            for r, e in _ranks_dict(d.get("ranks") or {}, f"{what}.ranks").items()
        }
        symptom = {
            _rank(r, f"{what}.symptom"): Symptom.from_json(
                _ranks_dict(e, f"{what}.symptom[{r}]"), f"{what}.symptom[{r}]"
            )
            for r, e in _ranks_dict(d.get("symptom") or {}, f"{what}.symptom").items()
        }
        cause = Cause.from_json(d["cause"]) if d.get("cause") else None
        conf = d.get("confidence", "high")
        try:
            confidence = Confidence(conf)
        except ValueError:
            raise ReportError(f"{what}.confidence {conf!r} is not high, medium or low") from None
        cycle = _list(d, "cycle", what)
        return cls(
            group,
            seq,
            _kind(d.get("kind"), what),
            _int_list(d.get("culprit_ranks"), f"{what}.culprit_ranks"),
            ranks,
            cause,
            symptom,
            confidence,
            _str_or_none(d, "basis", what),
            _str_or_none(d, "alternative", what),
            _str_or_none(d, "deadlock", what),
            [c for c in cycle if isinstance(c, dict)],
            bool(d.get("never_reached")),
        )

    def cause_line(self) -> str:
        """The headline: `cause: rank 1, extra all_reduce at train.py:6 (log_metric), after 7 calls of
        all_reduce at train.py:8`."""
        culprits = ", ".join(map(str, self.culprit_ranks))
        who = f"rank{'s' if len(self.culprit_ranks) > 1 else ''} {culprits}"
        c = self.cause
        if self.kind is Kind.WAIT_CYCLE:
            return f"cause: {who} wait for each other across groups" + (f": {self.deadlock}" if self.deadlock else "")
        if c is None:
            return f"cause: {who}, {self.kind.value} in group {self.group} seq {self.seq}"
        after = ""
        if c.after and c.after.get("site"):
            n = c.after.get("count") or 0
            after = f", after {n} call{'s' if n != 1 else ''} of {c.after.get('op')} at {c.after['site']}"
        if self.kind is Kind.MISSING and self.never_reached:
            return f"cause: {who} never reached the {c.call.where()} that rank {c.rank} waits in"
        if self.kind is Kind.MISSING and c.rank not in self.culprit_ranks:
            return f"cause: {who} skipped the {c.call.where()} that rank {c.rank} made{after}"
        if self.kind is Kind.EXTRA:
            return f"cause: {who}, extra {c.call.where()}{after}"
        if self.kind is Kind.MISSING:
            return f"cause: {who}, missing {c.call.where()}{after}"
        if self.kind is Kind.GROUP:
            return f"cause: {who}, {c.call.op}({c.call.label or ''}) at {c.call.site} that the other ranks do not make"
        return f"cause: {who}, {c.call.where()} differs in {self.kind.value.replace('_', ' ')}{after}"

    def symptom_line(self) -> str:
        """`symptom: rank 0 blocked in barrier at train.py:19; rank 1 blocked in all_reduce at train.py:8`"""
        from hctool.consensus.classes import ranges

        # ranks that stopped alike share one clause ("ranks 0-511,513-1023 blocked in ..."), in rank order
        by_words: dict[str, list[int]] = {}
        for r, s in sorted(self.symptom.items()):
            by_words.setdefault(s.words(), []).append(r)
        parts = [f"{'rank' if len(rs) == 1 else 'ranks'} {ranges(rs)} {w}" for w, rs in by_words.items()]
        return "symptom: " + "; ".join(parts) if parts else ""


@dataclass
class Coverage:
    """What the verdict rests on."""

    expected_ranks: int = 0
    traced_ranks: list[int] = field(default_factory=list)
    ranks_with_calls: list[int] = field(default_factory=list)
    ended: dict[int, str] = field(default_factory=dict)
    foreign_traces: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        out = {
            "expected_ranks": self.expected_ranks,
            "traced_ranks": self.traced_ranks,
            "ranks_with_calls": self.ranks_with_calls,
            "ended": {str(r): s for r, s in sorted(self.ended.items())},
        }
        if self.foreign_traces:
            out["foreign_traces"] = self.foreign_traces
        return out

    @classmethod
    def from_json(cls, d: Any) -> Coverage:
        _ranks_dict(d, "coverage")
        ended = {
            _rank(r, "coverage.ended"): str(s) for r, s in _ranks_dict(d.get("ended") or {}, "coverage.ended").items()
        }
        return cls(
            int(d.get("expected_ranks") or 0),
            _int_list(d.get("traced_ranks"), "coverage.traced_ranks"),
            _int_list(d.get("ranks_with_calls"), "coverage.ranks_with_calls"),
            ended,
            [str(x) for x in _list(d, "foreign_traces", "coverage")],
        )


@dataclass
class Report:
    verdict: Verdict
    world_size: int
    first_divergence: Divergence | None = None
    stacks: dict[str, str] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    reason: str | None = None
    coverage: Coverage | None = None
    cross_site_pairings: list[dict] = field(default_factory=list)
    incomplete: list[dict] = field(default_factory=list)
    exit_codes: dict[str, int | None] | None = None
    command_exit_code: int | None = None
    faults: list[dict] | None = None
    probes: dict | None = None
    extra: dict = field(default_factory=dict)  # fields a caller adds (repro's, chaos's), kept as they are

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    def headline(self) -> str:
        """One line: the verdict and, for a finding, the cause; else what was (not) seen."""
        if self.first_divergence is not None:
            return f"{self.verdict.value}: {self.first_divergence.cause_line()}"
        return f"{self.verdict.value}: {self.reason}" if self.reason else self.verdict.value

    def stack_classes(self) -> list:
        """Ranks with the same main-thread stack, odd classes first (consensus/classes.py)."""
        from hctool.consensus.classes import main_thread_frames, stack_classes

        return stack_classes({int(r): main_thread_frames(t) for r, t in self.stacks.items() if str(r).isdigit()})

    def count_classes(self) -> list:
        """Ranks with the same calls per op, odd classes first."""
        from hctool.consensus.classes import count_classes

        return count_classes({r: ops for r, ops in self.counts.items() if str(r).isdigit()})

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "verdict": self.verdict.value,
            "world_size": self.world_size,
            "first_divergence": self.first_divergence.to_json() if self.first_divergence else None,
            "stacks": dict(self.stacks),
            "counts": self.counts,
        }
        if self.stacks:
            out["stack_classes"] = [c.to_json() for c in self.stack_classes()]
        if self.counts:
            out["count_classes"] = [c.to_json() for c in self.count_classes()]
        if self.reason:
            out["reason"] = self.reason
        if self.coverage is not None:
            out["coverage"] = self.coverage.to_json()
        if self.cross_site_pairings:
            out["cross_site_pairings"] = self.cross_site_pairings
        if self.incomplete:
            out["incomplete"] = self.incomplete
        if self.probes is not None:
            out["probes"] = self.probes
        if self.exit_codes is not None:
            out["exit_codes"] = self.exit_codes
        if self.command_exit_code is not None:
            out["command_exit_code"] = self.command_exit_code
        if self.faults is not None:
            out["faults"] = self.faults
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Any) -> Report:
        _ranks_dict(d, "report")
        try:
            verdict = Verdict(d.get("verdict"))
        except ValueError:
            raise ReportError(f"report.verdict {d.get('verdict')!r} is not a check-consensus verdict") from None
        ws = d.get("world_size", 0)
        if not isinstance(ws, int) or isinstance(ws, bool) or ws < 0:
            raise ReportError("report.world_size must be a non-negative integer")
        fd = d.get("first_divergence")
        stacks = _ranks_dict(d.get("stacks") or {}, "report.stacks")
        counts = _ranks_dict(d.get("counts") or {}, "report.counts")
        for r, ops in counts.items():
            if not isinstance(ops, dict) or not all(isinstance(n, int) for n in ops.values()):
                raise ReportError(f"report.counts[{r}] must map ops to integers")
        codes = d.get("exit_codes")
        if codes is not None and (
            not isinstance(codes, dict) or not all(c is None or isinstance(c, int) for c in codes.values())
        ):
            raise ReportError("report.exit_codes must map ranks to integers or null")
        known = {
            "verdict",
            "world_size",
            "first_divergence",
            "stacks",
            "counts",
            "reason",
            "coverage",
            "cross_site_pairings",
            "incomplete",
            "exit_codes",
            "command_exit_code",
            "faults",
            "probes",
            "stack_classes",
            "count_classes",
        }  # the classes are derived again from stacks and counts
        return cls(
            verdict,
            ws,
            Divergence.from_json(fd) if fd else None,
            {str(r): str(t) for r, t in stacks.items()},
            counts,
            _str_or_none(d, "reason", "report"),
            Coverage.from_json(d["coverage"]) if d.get("coverage") else None,
            [p for p in _list(d, "cross_site_pairings", "report") if isinstance(p, dict)],
            [e for e in _list(d, "incomplete", "report") if isinstance(e, dict)],
            codes,
            _int_or_none(d, "command_exit_code", "report"),
            [f for f in _list(d, "faults", "report") if isinstance(f, dict)] if d.get("faults") is not None else None,
            d.get("probes") if isinstance(d.get("probes"), dict) else None,
            {k: v for k, v in d.items() if k not in known},
        )


def _rank(r: Any, what: str) -> int:
    try:
        n = int(r)
    except (TypeError, ValueError):
        raise ReportError(f"{what} key {r!r} is not a rank") from None
    if not 0 <= n < 1 << 16:
        raise ReportError(f"{what} key {r!r} is not a rank")
    return n


def _int_list(v: Any, what: str) -> list[int]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ReportError(f"{what} must be a list of integers")
    return v


def _kind(v: Any, what: str) -> Kind:
    try:
        return Kind(v)
    except ValueError:
        raise ReportError(f"{what}.kind {v!r} is not a divergence kind") from None
