"""Where scenarios live: the catalogue shipped in the `repros` package, plus any
folders the user adds with --catalogue (each holding <id>/scenario.toml)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hctool.repro.scenario import Scenario, ScenarioError, load_scenario


def builtin_dir() -> Path:
    return Path(str(resources.files("repros")))


def scenario_paths(extra_dirs: list[Path] = ()) -> list[Path]:
    paths = []
    for root in [builtin_dir(), *map(Path, extra_dirs)]:
        if not root.is_dir():
            raise ScenarioError(f"catalogue folder {root} does not exist")
        paths.extend(sorted(root.glob("*/scenario.toml")))
    return paths


def load_catalogue(extra_dirs: list[Path] = ()) -> dict[str, Scenario]:
    """Later folders override earlier ones for the same id (a user's own copy wins)."""
    out: dict[str, Scenario] = {}
    for path in scenario_paths(extra_dirs):
        s = load_scenario(path)
        out[s.id] = s
    return out


def find_scenario(sid: str, extra_dirs: list[Path] = ()) -> Scenario:
    catalogue = load_catalogue(extra_dirs)
    if sid not in catalogue:
        known = ", ".join(sorted(catalogue)) or "none"
        raise ScenarioError(f"no scenario {sid!r} in the catalogue (known: {known})")
    return catalogue[sid]
