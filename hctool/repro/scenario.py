"""Scenario files (`repros/<id>/scenario.toml`): what to launch, what to send, which
faults to inject, and the variants with the verdicts each is expected to give.
Loading validates everything and names the file and field of every mistake."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engine.server_args import ServerArgs
from hctool.inject.faults import parse_fault
from hctool.repro.mechanism import Mechanism, MechanismError, parse_mechanism

VERDICTS = ("deadlocked", "crashed", "diverged", "healthy")


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names file and field."""


@dataclass(frozen=True)
class Workload:
    """Rounds of concurrent requests; each prompt is a shared prefix plus a unique
    suffix. Hot prefixes repeat every round (they live in L1/L2); cold prefixes are
    used once and are written to storage by the setup phase (L3 prefetch)."""

    seed: int = 0
    hot_prefixes: int = 4
    cold_prefixes: int = 0
    prefix_tokens: int = 256
    suffix_tokens: int = 16
    requests_per_round: int = 8
    rounds: int = 1
    max_new_tokens: int = 8
    cold_every: int = 2   # every n-th request of a round uses a cold prefix (0: none)


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]
    expected: tuple[str, ...]
    description: str = ""
    mechanism: Mechanism | None = None   # what a buggy variant must show (hctool/repro/mechanism.py)
    measured: dict | None = None         # last measured rate: {runs, as_expected, date, note}


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    summary: str
    upstream: dict
    tp: int
    engine_flags: tuple[str, ...]
    setup_flags: tuple[str, ...]     # engine flags of the setup (storage-filling) run
    workload: Workload
    faults: tuple[str, ...]
    probes: tuple[str, ...]
    variants: tuple[Variant, ...]
    stall_timeout: float = 20.0      # no request finished for this long: stalled
    deadline: float = 120.0          # a variant's workload must end by then
    hang_after: float = 3.0          # a collective blocked this long while a peer is elsewhere
    path: Path | None = field(default=None, compare=False)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise ScenarioError(f"{self.id}: no variant {name!r}; variants: {', '.join(v.name for v in self.variants)}")

    def server_args(self, variant: Variant, tp: int | None = None, extra: tuple[str, ...] = ()) -> ServerArgs:
        return ServerArgs.from_cli([*self.engine_flags, *variant.flags, *extra], tp_size=tp or self.tp)


def _get(table: dict, key: str, kind, where: str, default=...):
    if key not in table:
        if default is ...:
            raise ScenarioError(f"{where}: missing field {key!r}")
        return default
    value = table[key]
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ScenarioError(f"{where}: field {key!r} must be a {name}, got {value!r}")
    return value


def _strings(table: dict, key: str, where: str) -> tuple[str, ...]:
    items = _get(table, key, list, where, [])
    if not all(isinstance(x, str) for x in items):
        raise ScenarioError(f"{where}: field {key!r} must be a list of strings")
    return tuple(items)


def _mechanism(v: dict, expected: tuple[str, ...], where: str) -> Mechanism | None:
    try:
        mech = parse_mechanism(v.get("mechanism"))
    except MechanismError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    if mech is not None and "healthy" in expected:
        raise ScenarioError(f"{where}: a variant expected healthy shows no mechanism; drop [variants.mechanism]")
    return mech


def _measured(v: dict, where: str) -> dict | None:
    m = _get(v, "measured", dict, where, None)
    if m is None:
        return None
    runs, hits = _get(m, "runs", int, f"{where} measured"), _get(m, "as_expected", int, f"{where} measured")
    if not 0 <= hits <= runs or runs < 1:
        raise ScenarioError(f"{where} measured: needs 0 <= as_expected <= runs and runs >= 1")
    return {"runs": runs, "as_expected": hits, "date": _get(m, "date", str, f"{where} measured", ""),
            "note": _get(m, "note", str, f"{where} measured", "")}


def load_scenario(path: Path) -> Scenario:
    path = Path(path)
    where = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    sid = str(_get(data, "id", (str, int), where))
    topo = _get(data, "topology", dict, where, {})
    eng = _get(data, "engine", dict, where, {})
    setup = _get(data, "setup", dict, where, {})
    wl = _get(data, "workload", dict, where, {})
    run = _get(data, "run", dict, where, {})
    known = {f for f in Workload.__dataclass_fields__}
    unknown = set(wl) - known
    if unknown:
        raise ScenarioError(f"{where}: [workload] has unknown fields {sorted(unknown)}; known: {sorted(known)}")
    workload = Workload(**{k: _get(wl, k, int, f"{where} [workload]") for k in wl})
    if min(workload.prefix_tokens, workload.requests_per_round, workload.rounds) < 1 or workload.suffix_tokens < 1:
        raise ScenarioError(f"{where}: [workload] sizes and counts must be positive")
    variants = []
    for i, v in enumerate(_get(data, "variants", list, where)):
        vw = f"{where} variants[{i}]"
        expected = _strings(v, "expected", vw)
        bad = [e for e in expected if e not in VERDICTS]
        if not expected or bad:
            raise ScenarioError(f"{vw}: expected must list verdicts among {', '.join(VERDICTS)}; got {list(expected)}")
        variants.append(Variant(_get(v, "name", str, vw), _strings(v, "flags", vw), expected,
                                _get(v, "description", str, vw, ""), _mechanism(v, expected, vw),
                                _measured(v, vw)))
    if not variants:
        raise ScenarioError(f"{where}: needs at least one [[variants]] entry")
    if len({v.name for v in variants}) != len(variants):
        raise ScenarioError(f"{where}: variant names must be unique")
    faults = _strings(data, "faults", where)
    for spec in faults:
        try:
            parse_fault(spec)
        except ValueError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
    scenario = Scenario(
        id=sid, title=_get(data, "title", str, where), summary=_get(data, "summary", str, where, ""),
        upstream=_get(data, "upstream", dict, where, {}), tp=_get(topo, "tp", int, f"{where} [topology]", 2),
        engine_flags=_strings(eng, "flags", f"{where} [engine]"),
        setup_flags=_strings(setup, "flags", f"{where} [setup]"), workload=workload,
        faults=faults, probes=_strings(data, "probes", where), variants=tuple(variants),
        stall_timeout=_get(run, "stall_timeout", float, f"{where} [run]", 20.0),
        deadline=_get(run, "deadline", float, f"{where} [run]", 120.0),
        hang_after=_get(run, "hang_after", float, f"{where} [run]", 3.0), path=path)
    for v in scenario.variants:  # every variant must form a valid engine configuration
        try:
            scenario.server_args(v)
        except ValueError as exc:
            raise ScenarioError(f"{where}: variant {v.name!r}: engine flags: {exc}") from None
    return scenario
