"""The JSON document `Report.to_json()` writes (`check-consensus run|analyze --json`), typed key by key.

model.py's dataclasses are what the analyzer works with; their JSON form renames, flattens and
leaves out keys (a rank's `stack` only when it was seen, `cause` only when one was found), so the
contract of docs/contracts.md is typed here, as the dicts it is. `hctool schema check-consensus`
publishes the JSON Schema made from these types (docs/schemas/). Every TypedDict here is a closed
object: a key not named is not in the contract. `NotRequired`: a key that is there only sometimes
(the comment says when). Repro's and chaos's reports embed the same pieces.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

# typing_extensions' TypedDict, not typing's: pydantic refuses typing's on Python 3.11
from typing_extensions import TypedDict

from hctool.consensus.model import Confidence, Kind, Verdict
from hctool.protocol.schemas import RankKey


class CallFields(TypedDict):
    """The call as every per-rank entry names it."""

    op: str | None
    site: str | None  # "file.py:LINE"
    function: str | None
    shapes: list[Any]  # one shape per tensor argument
    dtypes: list[str]
    reduce_op: str | None
    root: int | None  # root, or the peer of a p2p call
    label: str | None  # assert_same's label


class ProbeSeen(TypedDict):
    """With --probe: the last probed function a rank entered before its call."""

    name: str
    caller: str | None  # "function:LINE"
    site: str | None


class RankCallJSON(CallFields):
    """A rank's call at the divergence's seq (what the transport paired with the cause)."""

    state: Literal["completed", "blocked", "absent"]
    stack: NotRequired[list[str]]  # not for an absent rank
    last_seen: NotRequired[str]  # an absent rank's last recorded call
    probe: NotRequired[ProbeSeen | None]  # only when the run recorded probes


class AfterJSON(TypedDict):
    """The run of equal calls just before the cause on its rank."""

    op: str | None
    site: str | None
    count: int


class CauseJSON(CallFields):
    """The first call with no counterpart."""

    group: str | None
    stack: list[str]
    rank: int
    seq: int
    kind: Kind
    culprit_ranks: list[int]
    after: AfterJSON | None


class SymptomJSON(CallFields):
    """Where a rank was when the run ended."""

    group: str | None
    state: Literal["blocked", "failed", "ended", "crashed", "running", "absent"]
    seq: NotRequired[int]
    error: NotRequired[str]


class CycleEntry(TypedDict):
    """A rank on a wait cycle across groups and the call it waits in."""

    rank: int
    group: str
    seq: int
    site: str | None


class DivergenceJSON(TypedDict):
    """`first_divergence`: the cause, the culprits, and where every rank stopped."""

    group: str
    seq: int
    kind: Kind
    culprit_ranks: list[int]
    ranks: dict[RankKey, RankCallJSON]
    cause: NotRequired[CauseJSON]  # when a first call with no counterpart was found
    symptom: dict[RankKey, SymptomJSON]
    confidence: Confidence
    basis: str | None
    alternative: NotRequired[str]  # only where the evidence is symmetric
    deadlock: NotRequired[str]  # a wait cycle, in words
    cycle: NotRequired[list[CycleEntry]]  # with deadlock
    never_reached: NotRequired[bool]  # kind missing: the culprits never got to the call


class StackClassJSON(TypedDict):
    ranks: str  # "0-511,513-1023"
    size: int
    frames: list[str]


class CountClassJSON(TypedDict):
    ranks: str
    size: int
    counts: dict[str, int]  # calls per op


class CoverageJSON(TypedDict):
    """What the verdict rests on."""

    expected_ranks: int
    traced_ranks: list[int]
    ranks_with_calls: list[int]
    ended: dict[RankKey, Literal["clean", "crashed", "running"]]
    foreign_traces: NotRequired[list[str]]  # trace files in the folder that this run did not write


class PairedSite(TypedDict):
    site: str | None
    caller: str | None


class CrossSitePairing(TypedDict):
    """Equal calls from different call sites that the transport paired."""

    group: str
    seq: int
    count: int
    ranks: dict[RankKey, PairedSite]
    legitimate: bool


class TraceCutShort(TypedDict):
    """A rank whose recorder stopped because the trace folder could take no more."""

    rank: int
    reason: str  # "trace disk full", ...
    errno: str  # "ENOSPC", ...
    group: str | None
    seq: int


class FaultCount(TypedDict):
    """How often one fault fired (hctool/protocol/faultcounts.py)."""

    spec: str
    fired: dict[str, int]  # per rank ("0", "1", ...), and "client" for the supervisor's workload faults
    total: int
    resolved: NotRequired[dict[RankKey, str]]  # by-name kinds: "wrapped", "pending" or "missing: why"


class ReportJSON(TypedDict):
    """`hctool check-consensus run|analyze --json`."""

    verdict: Verdict
    world_size: int
    first_divergence: DivergenceJSON | None
    stacks: dict[RankKey, str]
    counts: dict[RankKey, dict[str, int]]
    stack_classes: NotRequired[list[StackClassJSON]]  # when stacks were taken
    count_classes: NotRequired[list[CountClassJSON]]  # when calls were counted
    reason: NotRequired[str]  # a verdict with no divergence: what was, or was not, seen
    coverage: NotRequired[CoverageJSON]
    cross_site_pairings: NotRequired[list[CrossSitePairing]]  # only when there were some
    incomplete: NotRequired[list[TraceCutShort]]  # only when a full trace folder cut a trace short
    probes: NotRequired[dict[RankKey, dict[str, int]]]  # run --probe: entries per probed function
    exit_codes: NotRequired[dict[RankKey, int | None]]  # run, and analyze of a run folder
    command_exit_code: NotRequired[int]  # run -- CMD
    faults: NotRequired[list[FaultCount]]  # run --inject
