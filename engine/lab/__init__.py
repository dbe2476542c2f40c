"""engine.lab: the one surface of the engine that hctool (and repros/) may use.

Everything the tool needs from the engine is named here; nothing outside engine/ imports
another engine module (tests/engine/test_walls.py walks the imports). Loading this package
imports nothing: each name is imported on first use, so the supervisor and the in-rank agent
pay for what they touch (no torch for the contract or the variants).

  settings      ServerArgs, ModelConfig (engine/server_args.py); Variants, VARIANTS, Variant:
                the incident variants, one table (variants.py)
  processes     contract: env names, module entry points, frontend_env / rank_env (contract.py)
  seams         SEAMS, DECLARED, POINTS: where faults may act, no-ops by default (seams.py)
  observation   TickSnapshot, Replicated, RankLocal, NodeRow, add_tick_observer, check_accounting
                (snapshot.py); state records of --state-digest: STATE_FIELDS
  storage       check_storage_dir, StorageDirError (the L3 folder check at launch)
  files         ENGINE_ROOT: the engine's source folder (cache keys of chaos runs)
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker sees: the real names (at run time each loads on first use)
    from engine.lab import contract
    from engine.lab.seams import DECLARED, POINTS, SEAMS
    from engine.lab.snapshot import (
        NodeRow,
        RankLocal,
        Replicated,
        TickSnapshot,
        add_tick_observer,
        check_accounting,
    )
    from engine.lab.variants import VARIANTS, Variant, Variants
    from engine.managers.state_digest import FIELDS as STATE_FIELDS
    from engine.mem_cache.hicache_page import StorageDirError, check_storage_dir
    from engine.server_args import PREFETCH_POLICIES, WRITE_POLICIES, ModelConfig, ServerArgs

ENGINE_ROOT = Path(__file__).resolve().parents[1]

_SURFACE = {
    "ServerArgs": "engine.server_args",
    "ModelConfig": "engine.server_args",
    "WRITE_POLICIES": "engine.server_args",
    "PREFETCH_POLICIES": "engine.server_args",
    "Variants": "engine.lab.variants",
    "VARIANTS": "engine.lab.variants",
    "Variant": "engine.lab.variants",
    "contract": "engine.lab.contract",
    "SEAMS": "engine.lab.seams",
    "DECLARED": "engine.lab.seams",
    "POINTS": "engine.lab.seams",
    "TickSnapshot": "engine.lab.snapshot",
    "Replicated": "engine.lab.snapshot",
    "RankLocal": "engine.lab.snapshot",
    "NodeRow": "engine.lab.snapshot",
    "add_tick_observer": "engine.lab.snapshot",
    "check_accounting": "engine.lab.snapshot",
    "STATE_FIELDS": ("engine.managers.state_digest", "FIELDS"),
    "check_storage_dir": "engine.mem_cache.hicache_page",
    "StorageDirError": "engine.mem_cache.hicache_page",
}
__all__ = [
    "ENGINE_ROOT",
    "ServerArgs",
    "ModelConfig",
    "WRITE_POLICIES",
    "PREFETCH_POLICIES",
    "Variants",
    "VARIANTS",
    "Variant",
    "contract",
    "SEAMS",
    "DECLARED",
    "POINTS",
    "TickSnapshot",
    "Replicated",
    "RankLocal",
    "NodeRow",
    "add_tick_observer",
    "check_accounting",
    "STATE_FIELDS",
    "check_storage_dir",
    "StorageDirError",
]


def __getattr__(name: str):
    where = _SURFACE.get(name)
    if where is None:
        raise AttributeError(f"engine.lab has no {name!r}; the surface is: {', '.join(__all__)}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    value = importlib.import_module(module) if attr == "contract" else getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
