"""The [tool.hctool.gate] table of the project's pyproject.toml."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from hctool.console.errors import UsageError
from hctool.protocol.limits import bounded
from hctool.protocol.safefile import UnsafeFile, read_named, why

STEPS = ("lint", "tests", "repro", "chaos")
# Seconds per step unless [tool.hctool.gate.timeouts] says otherwise (chaos: its budget plus this).
DEFAULT_TIMEOUTS = {"lint": 300.0, "tests": 1200.0, "repro": 1200.0, "chaos": 300.0}
KEYS = {"lint", "lint_baseline", "tests", "pytest_args", "repro", "chaos", "timeouts"}
HINT = "see docs/ci.md for the [tool.hctool.gate] keys"
MAX_CONFIG_BYTES = 4 << 20  # a pyproject.toml; far beyond any real one


@dataclass(frozen=True)
class Chaos:
    target: str  # what `hctool chaos explore` explores: its target options, e.g. "--scenario 30760 --variant bulk"
    budget: float
    seed: int = 0
    shard: str | None = None

    def __post_init__(self) -> None:
        if not self.target or not self.budget > 0:
            raise UsageError("chaos needs a target and a positive budget (seconds)", HINT)
        try:
            bounded("gate chaos budget", self.budget, "[tool.hctool.gate] chaos budget")
        except ValueError as exc:
            raise UsageError(str(exc), HINT) from None


@dataclass(frozen=True)
class GateConfig:
    root: Path
    lint: tuple[str, ...] = ()
    lint_baseline: str | None = None
    tests: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    repro: tuple[str, ...] = ()  # "ID" or "ID:variant"
    chaos: Chaos | None = None
    timeouts: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("lint", "tests"):
            for p in getattr(self, key):
                if not (self.root / p).exists():
                    raise UsageError(f"[tool.hctool.gate] {key}: {p!r} does not exist under {self.root}", HINT)
        if self.lint_baseline is not None and not self.lint:
            raise UsageError("[tool.hctool.gate] lint_baseline is set but lint lists no paths", HINT)
        for name, value in self.timeouts.items():
            if name not in STEPS:
                raise UsageError(
                    f"[tool.hctool.gate.timeouts] {name} = {value!r}: expected one of "
                    f"{', '.join(STEPS)} = positive seconds",
                    HINT,
                )
            try:  # nan passed `<= 0` and the step waited forever; inf likewise
                bounded("gate timeout", value, f"[tool.hctool.gate.timeouts] {name}")
            except ValueError as exc:
                raise UsageError(str(exc), HINT) from None

    def steps(self) -> list[str]:
        """The configured steps, in the order they run (cheap first)."""
        present = {
            "lint": bool(self.lint),
            "tests": bool(self.tests),
            "repro": bool(self.repro),
            "chaos": self.chaos is not None,
        }
        return [s for s in STEPS if present[s]]

    def timeout(self, step: str) -> float:
        if step in self.timeouts:
            return float(self.timeouts[step])
        if step == "chaos" and self.chaos is not None:
            return self.chaos.budget + DEFAULT_TIMEOUTS["chaos"]
        return DEFAULT_TIMEOUTS[step]


def _strings(table: dict, key: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
        raise UsageError(f"[tool.hctool.gate] {key} must be a list of strings, got {value!r}", HINT)
    return tuple(str(v) for v in value)


def load_gate_config(pyproject: Path) -> GateConfig:
    try:  # the safe reader: a FIFO or a link to /dev/zero at pyproject.toml hung the gate
        data = tomllib.loads(read_named(pyproject, MAX_CONFIG_BYTES).decode("utf-8"))
    except OSError as exc:
        raise UsageError(
            f"cannot read {pyproject}: {exc.strerror}" if not isinstance(exc, UnsafeFile) else why(exc, pyproject),
            "run hctool gate from the project root, or pass --config",
        ) from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{pyproject} is not UTF-8 (byte {exc.start})", "fix the file's encoding") from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise UsageError(f"invalid TOML in {pyproject}: {exc}", "fix the file's syntax") from None
    table = data.get("tool", {}).get("hctool", {}).get("gate")
    if not isinstance(table, dict):
        raise UsageError(f"{pyproject} has no [tool.hctool.gate] table", HINT)
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise UsageError(
            f"unknown key(s) in [tool.hctool.gate]: {', '.join(unknown)}", f"known: {', '.join(sorted(KEYS))}"
        )
    chaos = table.get("chaos")
    if chaos is not None:
        if not isinstance(chaos, dict) or set(chaos) - {"target", "budget", "seed", "shard"}:
            raise UsageError(
                f"[tool.hctool.gate] chaos must be a table of target, budget, seed, shard; got {chaos!r}", HINT
            )
        try:
            chaos = Chaos(
                str(chaos.get("target", "")),
                float(chaos.get("budget", 0)),
                int(chaos.get("seed", 0)),
                chaos.get("shard"),
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(f"[tool.hctool.gate] chaos: {exc}", HINT) from None
    baseline = table.get("lint_baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise UsageError(f"[tool.hctool.gate] lint_baseline must be a path string, got {baseline!r}", HINT)
    timeouts = table.get("timeouts", {})
    if not isinstance(timeouts, dict):
        raise UsageError(f"[tool.hctool.gate] timeouts must be a table, got {timeouts!r}", HINT)
    return GateConfig(
        root=pyproject.parent.resolve(),
        lint=_strings(table, "lint"),
        lint_baseline=baseline,
        tests=_strings(table, "tests"),
        pytest_args=_strings(table, "pytest_args"),
        repro=_strings(table, "repro"),
        chaos=chaos,
        timeouts=dict(timeouts),
    )
