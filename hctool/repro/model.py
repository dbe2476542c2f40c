"""The repro reports, typed as they are built (plain dicts: harness.py, verdict.py
VariantReport.to_json, commands/repro.py): `hctool repro list --json`, `hctool repro ID --json`
and `hctool repro all --json` (docs/contracts.md). Nothing builds these types; `hctool schema`
publishes the JSON Schemas made from them (docs/schemas/). Every TypedDict is a closed object;
`NotRequired`: a key that is there only sometimes (the comment says when).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

# typing_extensions' TypedDict, not typing's: pydantic refuses typing's on Python 3.11
from typing_extensions import TypedDict

from hctool.consensus.report_json import DivergenceJSON, FaultCount
from hctool.protocol.schemas import RankKey

# scenario.py VERDICTS; tests/test_json_schemas.py holds this to that tuple
ReproVerdict = Literal["deadlocked", "crashed", "diverged", "healthy"]


class Measured(TypedDict):
    """A variant's last measured reproduction rate, as its scenario file records it."""

    runs: int
    as_expected: int
    date: str
    note: str


class VariantEntry(TypedDict):
    name: str
    expected: list[ReproVerdict]
    description: str
    mechanism: dict[str, Any] | None  # the declared mechanism's keys (docs/repros.md)
    measured: Measured | None


class ListEntry(TypedDict):
    """One incident of `hctool repro list --json`."""

    id: str
    title: str
    upstream: dict[str, Any]  # the scenario's [upstream] table, as written
    topology: dict[str, int]  # {"tp": N}, or {"prefill_tp": N, "decode_tp": M} for PD
    faults: list[str]  # fault specs
    variants: list[VariantEntry]
    path: str


class Requests(TypedDict):
    sent: int
    succeeded: int
    failed: int
    aborted: int


class DeclaredMechanism(TypedDict):
    """The scenario's [variants.mechanism]: only the keys it sets."""

    function: NotRequired[str]
    kind: NotRequired[list[str]]
    culprit_ranks: NotRequired[list[int]]
    state_field: NotRequired[str]
    output: NotRequired[Literal["differs"]]


class MechanismSeen(TypedDict):
    declared: DeclaredMechanism
    seen: bool
    evidence: list[str]  # what matched and what did not
    seen_runs: NotRequired[int]  # --runs K: in how many runs


class StateDivergence(TypedDict):
    """The first field of the ranks' replicated state that differs (ranks run with --state-digest)."""

    tick: int | None
    field: str  # "lru_order[3]"
    index: int
    ranks: dict[RankKey, str]
    differing_fields: list[str]
    ticks: dict[RankKey, int | None]


class VariantResult(TypedDict):
    """One variant's run (or K runs, summarized)."""

    name: str
    expected: list[ReproVerdict]
    verdict: ReproVerdict
    ok: bool
    seconds: float
    load_back_tokens_by_round: list[int]
    requests: Requests
    reason: str
    mechanism: MechanismSeen | None  # None: a variant that declares none (a fixed one)
    state_divergence: StateDivergence | None
    first_divergence: DivergenceJSON | None
    stacks: dict[RankKey, str]
    counts: dict[RankKey, dict[str, int]]
    faults: list[FaultCount]
    artifacts: str
    # --runs K only
    runs: NotRequired[int]
    ok_runs: NotRequired[int]
    verdicts: NotRequired[list[ReproVerdict]]


class IncidentResult(TypedDict):
    """`hctool repro ID --json`: exit 0 iff every variant is ok."""

    id: str
    title: str
    variants: list[VariantResult]
    artifacts: str


class AllResult(TypedDict):
    """`hctool repro all --json`: exit 0 iff ok."""

    shard: str  # "i/N"
    ok: bool
    incidents: list[IncidentResult]
