"""The chaos report, typed as report.py builds it (plain dicts): `chaos run|explore|shrink|merge
--json` and each run folder's report.json (docs/contracts.md). Nothing builds these types; they
say what the dicts hold, and `hctool schema chaos` publishes the JSON Schema made from them
(docs/schemas/). Every TypedDict is a closed object; `NotRequired`: a key that is there only
sometimes (the comment says when).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal, NotRequired

# typing_extensions' TypedDict, not typing's: pydantic refuses typing's on Python 3.11
from typing_extensions import TypedDict

from hctool.protocol.faults import FAULT_KINDS

# A fault kind's name (the rows of hctool/protocol/faults.py), as an enum for the schema
FaultKindName = Enum("FaultKindName", {name: name for name in FAULT_KINDS}, type=str)  # type: ignore[misc]

# The invariants of both targets: the engine's (chaos/invariants.py CHECKERS) and a command's
# (chaos/command.py COMMAND_CHECKERS); tests/test_json_schemas.py holds this to those tuples.
Invariant = Literal["consensus", "liveness", "correctness", "accounting", "metrics", "exits", "output"]

Verdict = Literal["valid", "invalid", "unknown"]


class FaultJSON(TypedDict):
    """A fault as Fault.to_dict() writes it (the text form is `--inject`'s: docs/chaos.md)."""

    kind: FaultKindName
    ms: float  # or pages, for the kinds counted in pages
    target: str  # "all", "one" or "rank:K"
    p: float
    start_s: float
    duration_s: float | None  # None: until the schedule's heal
    n: int
    role: str | None  # PD: only this side's ranks
    at_call: NotRequired[int]  # anchored in-rank faults: the window counts from the rank's K-th collective
    # the keys of the kinds that take them, only when set
    fn: NotRequired[str]
    when: NotRequired[Literal["entry", "exit"]]
    exc: NotRequired[str]
    op: NotRequired[str]
    group: NotRequired[str]
    path: NotRequired[str]
    thread: NotRequired[str]


class ReplayStep(TypedDict):
    """One schedule of the trail the replay backed off along, and its reproduction rate."""

    schedule: list[str]  # fault specs
    reproduced: str  # "k/n"


class AnomalyJSON(TypedDict):
    run: NotRequired[str]  # explore: the name of the run that found it (a RunJSON's name)
    invariant: Invariant
    evidence: dict[str, Any]  # the invariant's own evidence (open: each checker says what it saw)
    schedule: list[FaultJSON]
    shrunk: list[FaultJSON] | None  # None: not shrunk, or shrinking kept the schedule
    replay: str  # "hctool chaos run ..."
    reproduced: str | None  # "k/n"; None: no replay
    replayed: NotRequired[list[ReplayStep]]  # only when the replay backed off


class RunJSON(TypedDict):
    """One schedule's run."""

    name: str
    schedule: list[str]  # fault specs
    verdict: Verdict
    invariants: list[Invariant]  # those that failed
    blind: list[str]  # checkers that could not look
    seconds: float
    artifacts: str


class ChaosReport(TypedDict):
    """`hctool chaos run|explore|shrink|merge --json`."""

    verdict: Verdict
    target: str  # "command: torchrun ..." or the engine target's flags
    seed: int | None  # None: a merge of no report
    schedules: int
    anomalies: list[AnomalyJSON]
    history: str | None  # path of history.jsonl
    runs: list[RunJSON]
    # explore only
    shard: NotRequired[str]  # "i/N"
    seconds: NotRequired[float]
    first_anomaly_s: NotRequired[float | None]
    schedules_per_min: NotRequired[float | None]
    interrupted: NotRequired[bool]  # explore stopped by Ctrl-C (SIGTERM, SIGHUP): what ran until then
    # merge only
    histories: NotRequired[list[str | None]]
    shards: NotRequired[list[str | None]]


class ChaosBaselineFailure(TypedDict):
    """`chaos run|explore|shrink --json` when the program fails with no fault at all: a finding
    (exit 1) with nothing explored on top of it."""

    verdict: Literal["invalid"]
    without_faults: Literal[True]
    reason: str
