"""Scenario files (`repros/<id>/scenario.toml`): what to launch, what to send, which
faults to inject, and the variants with the verdicts each is expected to give.
Loading validates everything and names the file and field of every mistake."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engine.lab import ServerArgs
from hctool.protocol.faults import KIND, Acts, Fault, parse_fault
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
    cold_every: int = 2  # every n-th request of a round uses a cold prefix (0: none)


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]
    expected: tuple[str, ...]
    description: str = ""
    mechanism: Mechanism | None = None  # what a buggy variant must show (hctool/repro/mechanism.py)
    measured: dict | None = None  # last measured rate: {runs, as_expected, date, note}


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    summary: str
    upstream: dict
    tp: int
    engine_flags: tuple[str, ...]
    setup_flags: tuple[str, ...]  # engine flags of the setup (storage-filling) run
    workload: Workload
    faults: tuple[Fault, ...]  # parsed at load; text again only in the ranks' environment
    probes: tuple[str, ...]
    variants: tuple[Variant, ...]
    prefill_tp: int | None = None  # PD: a prefill server of this TP, and `tp` is the decode's
    require_load_back: bool = False  # ok needs hicache_load_back_tokens_total > 0 after every round but the first
    stall_timeout: float = 20.0  # no request finished for this long: stalled
    deadline: float = 120.0  # a variant's workload must end by then
    hang_after: float = 3.0  # a collective blocked this long while a peer is elsewhere
    path: Path | None = field(default=None, compare=False)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise ScenarioError(f"{self.id}: no variant {name!r}; variants: {', '.join(v.name for v in self.variants)}")

    @property
    def pd(self) -> bool:
        return self.prefill_tp is not None

    def server_args(self, variant: Variant, tp: int | None = None, extra: tuple[str, ...] = ()) -> ServerArgs:
        return ServerArgs.from_cli([*self.engine_flags, *variant.flags, *extra], tp_size=tp or self.tp)


# Inclusive bounds of every number a scenario may set: a typo must not grow a
# run to gigabytes (the prompts are built up front) or make it never end.
WORKLOAD_LIMITS = {
    "seed": (0, 2**63 - 1),
    "hot_prefixes": (0, 10_000),
    "cold_prefixes": (0, 10_000),
    "prefix_tokens": (1, 1_000_000),
    "suffix_tokens": (1, 1_000_000),
    "requests_per_round": (1, 10_000),
    "rounds": (1, 10_000),
    "max_new_tokens": (1, 1_000_000),
    "cold_every": (0, 10_000),
}
RUN_LIMITS = {"stall_timeout": 20.0, "deadline": 120.0, "hang_after": 3.0}  # defaults; each in (0, DAY_S]
DAY_S = 86_400.0
MAX_TP = 64
MAX_WORKLOAD_TOKENS = 10_000_000
MAX_FILE_BYTES = 1 << 20
TOP_LEVEL = {
    "id",
    "title",
    "summary",
    "upstream",
    "topology",
    "engine",
    "setup",
    "workload",
    "run",
    "faults",
    "probes",
    "variants",
}
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _kind_name(kind) -> str:
    return kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)


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
        raise ScenarioError(f"{where}: field {key!r} must be a {_kind_name(kind)}, got {value!r}")
    return value


def _number(table: dict, key: str, kind, low, high, where: str, default=...):
    value = _get(table, key, kind, where, default)
    if not (math.isfinite(value) and low <= value <= high):  # NaN fails every comparison
        raise ScenarioError(f"{where}: field {key!r} must be between {low:g} and {high:g}, got {value!r}")
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
    return {
        "runs": runs,
        "as_expected": hits,
        "date": _get(m, "date", str, f"{where} measured", ""),
        "note": _get(m, "note", str, f"{where} measured", ""),
    }


def _known(table: dict, allowed, where: str) -> None:
    unknown = set(table) - set(allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(allowed)}")


def _name(value: str, key: str, where: str) -> str:
    # ids and variant names become folder names under the artifacts directory
    if not value or len(value) > 64 or value.startswith(".") or not set(value) <= NAME_CHARS:
        raise ScenarioError(
            f"{where}: field {key!r} must be 1-64 letters, digits, '.', '_' or '-' "
            f"(not starting with '.'), got {value!r}"
        )
    return value


def _plain(value, where: str) -> None:
    """[upstream] is shown as JSON: only strings, numbers, booleans, lists and tables."""
    if isinstance(value, dict):
        for v in value.values():
            _plain(v, where)
    elif isinstance(value, list):
        for v in value:
            _plain(v, where)
    elif not isinstance(value, (str, int, float, bool)) or (isinstance(value, float) and not math.isfinite(value)):
        raise ScenarioError(f"{where}: [upstream] may hold strings, numbers and lists, got {value!r}")


def _read(path: Path) -> dict:
    where = str(path)
    try:
        if not path.is_file():  # a FIFO or a device would block or never end
            raise ScenarioError(f"{where}: not a regular file")
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ScenarioError(f"{where}: larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    except RecursionError:
        raise ScenarioError(f"{where}: nested too deeply") from None


def _workload(wl: dict, where: str) -> Workload:
    _known(wl, WORKLOAD_LIMITS, where)
    w = Workload(**{k: _number(wl, k, int, *WORKLOAD_LIMITS[k], where) for k in wl})
    total = (
        w.rounds * w.requests_per_round * (w.prefix_tokens + w.suffix_tokens)
        + (w.hot_prefixes + w.cold_prefixes) * w.prefix_tokens
    )
    if total > MAX_WORKLOAD_TOKENS:
        raise ScenarioError(
            f"{where}: the workload would build {total:,} prompt tokens; at most {MAX_WORKLOAD_TOKENS:,}"
        )
    return w


def _variant(v, i: int, where: str) -> Variant:
    vw = f"{where} variants[{i}]"
    if not isinstance(v, dict):
        raise ScenarioError(f"{vw}: must be a [[variants]] table, got {v!r}")
    _known(v, ("name", "flags", "expected", "description", "mechanism", "measured"), vw)
    expected = _strings(v, "expected", vw)
    bad = [e for e in expected if e not in VERDICTS]
    if not expected or bad:
        raise ScenarioError(f"{vw}: expected must list verdicts among {', '.join(VERDICTS)}; got {list(expected)}")
    return Variant(
        _name(_get(v, "name", str, vw), "name", vw),
        _strings(v, "flags", vw),
        expected,
        _get(v, "description", str, vw, ""),
        _mechanism(v, expected, vw),
        _measured(v, vw),
    )


def load_scenario(path: Path) -> Scenario:
    path = Path(path)
    where = str(path)
    data = _read(path)
    _known(data, TOP_LEVEL, where)
    sid = _name(str(_get(data, "id", (str, int), where)), "id", where)
    tables = {
        key: _get(data, key, dict, where, {}) for key in ("upstream", "topology", "engine", "setup", "workload", "run")
    }
    # prefill_tp, decode_tp and require_load_back belong to PD scenarios (issue #13)
    for key, allowed in (
        ("topology", ("tp", "prefill_tp", "decode_tp")),
        ("engine", ("flags",)),
        ("setup", ("flags",)),
        ("run", (*RUN_LIMITS, "require_load_back")),
    ):
        _known(tables[key], allowed, f"{where} [{key}]")
    _plain(tables["upstream"], where)
    for key in ("issues", "prs"):
        refs = tables["upstream"].get(key, [])
        if not isinstance(refs, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in refs):
            raise ScenarioError(f"{where} [upstream]: field {key!r} must be a list of integers, got {refs!r}")
    workload = _workload(tables["workload"], f"{where} [workload]")
    variants = [_variant(v, i, where) for i, v in enumerate(_get(data, "variants", list, where))]
    if not variants:
        raise ScenarioError(f"{where}: needs at least one [[variants]] entry")
    if len({v.name for v in variants}) != len(variants):
        raise ScenarioError(f"{where}: variant names must be unique")
    faults = _strings(data, "faults", where)
    topo, twhere = tables["topology"], f"{where} [topology]"
    # PD scenarios: `decode_tp` is the decode server's TP (the ranks the checks watch)
    tp = _number(topo, "decode_tp" if "decode_tp" in topo else "tp", int, 1, MAX_TP, twhere, 2)
    prefill_tp = _number(topo, "prefill_tp", int, 1, MAX_TP, twhere) if "prefill_tp" in topo else None
    parsed = []
    for spec in faults:
        try:
            fault = parse_fault(spec)
        except ValueError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
        if not math.isfinite(fault.ms) or fault.ms > DAY_S * 1000:
            raise ScenarioError(f"{where}: fault {spec!r}: ms must be a finite number up to {DAY_S * 1000:g}")
        if KIND[fault.kind].acts is Acts.WORKLOAD:  # nothing would send them: the workload is the scenario's own
            raise ScenarioError(f"{where}: fault {spec!r} acts on chaos's workload; put it in a chaos schedule")
        parsed.append(fault)
    run = tables["run"]
    scenario = Scenario(
        id=sid,
        title=_get(data, "title", str, where),
        summary=_get(data, "summary", str, where, ""),
        upstream=tables["upstream"],
        tp=tp,
        prefill_tp=prefill_tp,
        require_load_back=_get(run, "require_load_back", bool, f"{where} [run]", False),
        engine_flags=_strings(tables["engine"], "flags", f"{where} [engine]"),
        setup_flags=_strings(tables["setup"], "flags", f"{where} [setup]"),
        workload=workload,
        faults=tuple(parsed),
        probes=_strings(data, "probes", where),
        variants=tuple(variants),
        **{k: _number(run, k, float, 0.0, DAY_S, f"{where} [run]", d) for k, d in RUN_LIMITS.items()},
        path=path,
    )
    for k in RUN_LIMITS:
        if getattr(scenario, k) <= 0:
            raise ScenarioError(f"{where} [run]: field {k!r} must be above 0, got {getattr(scenario, k)!r}")
    longest = workload.prefix_tokens + workload.suffix_tokens + workload.max_new_tokens
    for v in scenario.variants:  # every variant must form a valid engine configuration
        try:
            args = scenario.server_args(v)
        except ValueError as exc:
            raise ScenarioError(f"{where}: variant {v.name!r}: engine flags: {exc}") from None
        if longest > args.max_context_len:
            raise ScenarioError(
                f"{where}: variant {v.name!r}: a request of {longest} tokens (prefix + suffix + "
                f"max_new_tokens) does not fit its pool ({args.max_context_len} tokens)"
            )
    return scenario
