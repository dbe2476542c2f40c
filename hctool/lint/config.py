"""`[tool.hctool.lint]` in pyproject.toml, merged with command-line options."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from hctool.console.errors import UsageError
from hctool.lint.bounded import BUDGET_LIMITS_MIB, DEFAULT_BUDGET_MIB
from hctool.lint.rules import ALL_CODES

KEYS = ("select", "ignore", "collectives", "rank-local", "uniform", "exclude", "memory-per-file")


@dataclass(frozen=True)
class LintConfig:
    select: frozenset[str] = frozenset(ALL_CODES)
    collectives: frozenset[str] = frozenset()  # extra collective functions (wrappers)
    rank_local: frozenset[str] = frozenset()  # extra rank-local calls, attributes or variables
    uniform: frozenset[str] = frozenset()  # calls/attributes whose values are replicated
    exclude: tuple[str, ...] = ()  # glob patterns on paths relative to the config's directory
    root: Path = field(default_factory=Path.cwd)  # where exclude patterns are anchored
    memory_mib: int = DEFAULT_BUDGET_MIB  # the budget to parse one large file in (bounded.py)

    def with_cli(self, select: list[str] | None, ignore: list[str] | None) -> LintConfig:
        chosen = self.select
        if select:
            chosen = frozenset(parse_codes(select, "--select"))
        if ignore:
            chosen = chosen - frozenset(parse_codes(ignore, "--ignore"))
        return replace(self, select=chosen)


def parse_codes(values: list[str] | str, where: str) -> list[str]:
    items = [values] if isinstance(values, str) else list(values)
    codes = [c.strip().upper() for v in items for c in str(v).split(",") if c.strip()]
    for c in codes:
        if c not in ALL_CODES and not any(k.startswith(c) for k in ALL_CODES):
            raise UsageError(f"unknown rule code {c!r} in {where}", f"known codes: {', '.join(ALL_CODES)}")
    # A prefix such as "HC1" selects every code it starts.
    return sorted({k for c in codes for k in ALL_CODES if k.startswith(c)})


def _load_toml(path: Path) -> dict:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - 3.10 only
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise UsageError(
                f"cannot read {path}: Python {sys.version_info[0]}.{sys.version_info[1]} has no tomllib",
                "pip install tomli, or use Python 3.11+",
            ) from None
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}", "check the --config path") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"invalid TOML in {path}: {exc}", "fix the file's syntax") from None


def find_pyproject(start: Path) -> Path | None:
    for d in (start, *start.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _names(section: dict, key: str, path: Path) -> frozenset[str]:
    value = section.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{path}: [tool.hctool.lint] {key} must be a list of strings", f'e.g. {key} = ["name"]')
    return frozenset(value)


def load_config(config_path: Path | None, cwd: Path | None = None) -> LintConfig:
    """Read the explicit --config file, or the nearest pyproject.toml above cwd (if any)."""
    cwd = cwd or Path.cwd()
    if config_path is not None:
        if not config_path.is_file():
            raise UsageError(f"config file not found: {config_path}", "pass a pyproject.toml with [tool.hctool.lint]")
        path = config_path
    else:
        path = find_pyproject(cwd)
        if path is None:
            return LintConfig(root=cwd)
    section = _load_toml(path).get("tool", {}).get("hctool", {}).get("lint", {})
    if not isinstance(section, dict):
        raise UsageError(f"{path}: [tool.hctool.lint] must be a table", None)
    unknown = sorted(set(section) - set(KEYS))
    if unknown:
        raise UsageError(
            f"{path}: unknown key(s) in [tool.hctool.lint]: {', '.join(unknown)}", f"valid keys: {', '.join(KEYS)}"
        )
    select = (
        frozenset(parse_codes(list(_names(section, "select", path)), f"{path} select"))
        if "select" in section
        else frozenset(ALL_CODES)
    )
    select -= frozenset(parse_codes(list(_names(section, "ignore", path)), f"{path} ignore"))
    memory = section.get("memory-per-file", DEFAULT_BUDGET_MIB)
    low, high = BUDGET_LIMITS_MIB
    if type(memory) is not int or not low <= memory <= high:
        raise UsageError(
            f"{path}: [tool.hctool.lint] memory-per-file must be an integer number of MiB from {low} "
            f"to {high}, got {memory!r}",
            f"e.g. memory-per-file = {DEFAULT_BUDGET_MIB}",
        )
    return LintConfig(
        memory_mib=memory,
        select=select,
        collectives=_names(section, "collectives", path),
        rank_local=_names(section, "rank-local", path),
        uniform=_names(section, "uniform", path),
        exclude=tuple(sorted(_names(section, "exclude", path))),
        root=path.parent.resolve(),
    )
