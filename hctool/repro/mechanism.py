"""What a buggy variant must show for its run to count as *this* bug reproduced.

A verdict alone (deadlocked, crashed, diverged) says something went wrong, not
what: a rank killed by an unrelated error would pass. So a buggy variant
declares its mechanism in the scenario file and the harness checks it against
the evidence the run left:

    [variants.mechanism]
    function = "check_prefetch_progress"  # on some rank's stack at the first divergent collective
    kind = ["extra", "shape"]             # the first divergence's kind is one of these
    culprit_ranks = [1]                   # the analyzer names exactly these ranks
    state_field = "lru_order"             # first differing field of the per-rank state records
    output = "differs"                    # an answer differs from the no-cache reference

Every key given must match; the report lists the evidence that did.
"""

from __future__ import annotations

from dataclasses import dataclass

from hctool.consensus.model import Call, Divergence, Kind

KINDS = tuple(k.value for k in Kind)
KEYS = ("function", "kind", "culprit_ranks", "state_field", "output")


class MechanismError(ValueError):
    pass


@dataclass(frozen=True)
class Mechanism:
    function: str | None = None
    kind: tuple[str, ...] = ()
    culprit_ranks: tuple[int, ...] = ()
    state_field: str | None = None
    output: str | None = None

    def __post_init__(self) -> None:
        if not (self.function or self.kind or self.culprit_ranks or self.state_field or self.output):
            raise MechanismError(f"mechanism needs at least one of {', '.join(KEYS)}")
        bad = [k for k in self.kind if k not in KINDS]
        if bad:
            raise MechanismError(f"mechanism kind {bad[0]!r} is not one of {', '.join(KINDS)}")
        if self.output not in (None, "differs"):
            raise MechanismError(f'mechanism output must be "differs", got {self.output!r}')
        if any(r < 0 for r in self.culprit_ranks):
            raise MechanismError("mechanism culprit_ranks must not be negative")

    def describe(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k in KEYS if (v := getattr(self, k))}


def parse_mechanism(table) -> Mechanism | None:
    """From a scenario's [variants.mechanism] table; MechanismError names the problem."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise MechanismError(f"mechanism must be a table, got {table!r}")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise MechanismError(f"mechanism has unknown fields {unknown}; known: {list(KEYS)}")
    kind = table.get("kind", [])
    kind = [kind] if isinstance(kind, str) else kind
    ranks = table.get("culprit_ranks", [])
    for key, value, ok in (
        ("function", table.get("function"), lambda x: x is None or isinstance(x, str)),
        ("state_field", table.get("state_field"), lambda x: x is None or isinstance(x, str)),
        ("output", table.get("output"), lambda x: x is None or isinstance(x, str)),
        ("kind", kind, lambda x: isinstance(x, list) and all(isinstance(k, str) for k in x)),
        (
            "culprit_ranks",
            ranks,
            lambda x: isinstance(x, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in x),
        ),
    ):
        if not ok(value):
            raise MechanismError(f"mechanism field {key!r} has the wrong type: {value!r}")
    return Mechanism(table.get("function"), tuple(kind), tuple(ranks), table.get("state_field"), table.get("output"))


def _frames(entry: Call) -> list[str]:
    """Function names on a rank's stack at the divergent call, innermost first."""
    names = [f.rsplit(" ", 1)[-1] for f in entry.stack]
    return ([entry.function] if entry.function else []) + names


def check_mechanism(
    mech: Mechanism, first_divergence: Divergence | None, state_divergence: dict | None, outputs_match: bool
) -> tuple[bool, list[str]]:
    """(every declared key matched, evidence lines: what matched and what did not)."""
    fd, ok, evidence = first_divergence, True, []
    calls: list[tuple[int, Call]] = sorted(fd.ranks.items()) if fd is not None else []
    if fd is not None and fd.cause is not None:
        calls.append((fd.cause.rank, fd.cause.call))  # the cause, however far before the rest it was
    if mech.function:
        hits = [(r, c) for r, c in calls if mech.function in _frames(c)]
        if hits:
            r, e = hits[0]
            evidence.append(
                f"function: rank {r} was in {mech.function} at the first divergent collective "
                f"({e.op} {e.reduce_op or ''} seq {fd.seq})".replace("  ", " ")
            )
        else:
            ok = False
            evidence.append(
                f"function: NOT seen: no rank had {mech.function} on its stack at the first divergent "
                f"collective" + ("" if fd else " (no divergent collective was found)")
            )
    if mech.kind:
        seen = fd.kind.value if fd is not None else None
        ok &= seen in mech.kind
        evidence.append(f"kind: {seen}" + ("" if seen in mech.kind else f" (NOT one of {', '.join(mech.kind)})"))
    if mech.culprit_ranks:
        seen = sorted(fd.culprit_ranks if fd is not None else [])
        match = seen == sorted(mech.culprit_ranks)
        ok &= match
        evidence.append(f"culprit ranks: {seen}" + ("" if match else f" (NOT {sorted(mech.culprit_ranks)})"))
    if mech.state_field:
        field = (state_divergence or {}).get("field")
        match = field is not None and (field == mech.state_field or field.startswith(mech.state_field + "["))
        ok &= match
        if match:
            evidence.append(f"state: ranks first differ in {field} at tick {state_divergence.get('tick')}")
        else:
            evidence.append(f"state: NOT seen: first differing field {field or 'none'} (wanted {mech.state_field})")
    if mech.output:
        ok &= not outputs_match
        evidence.append(
            "output: an answer differs from the no-cache reference"
            if not outputs_match
            else "output: NOT seen: every answer equals the reference"
        )
    return ok, evidence
