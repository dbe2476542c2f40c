"""Probes: `pkg.mod:Qual.name` entries of HCTOOL_PROBES record each entry of that function
into the rank's trace (a side-table line with its caller's file:LINE and function), so a
report can say which function led to a divergent collective on each rank. Other entries
are modules or .py files to import (observe-only helpers a repro ships)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading

from hctool.agent import names
from hctool.agent.clock import REAL
from hctool.protocol import env as protocol_env


def _record(name: str):
    from hctool.agent.capture import state, tracefile

    ids = iter(range(1, 1 << 62))

    def before(caller, args, kwargs) -> None:
        if state.S.trace_dir is None:
            return
        try:
            tracefile._side(
                {
                    "pr": name,
                    "n": next(ids),
                    "site": f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}",
                    "fn": caller.f_code.co_name,
                    "t": REAL.monotonic(),
                    "th": threading.current_thread().name,
                }
            )
        except Exception as exc:
            tracefile.note_failure(exc)

    return before


def add_function_probe(target: str) -> None:
    names.on_call(target, before=_record(target.partition(":")[2]))


def _import_probe(name: str) -> None:
    if name.endswith(".py"):
        mod_name = "hctool_probe_" + os.path.splitext(os.path.basename(name))[0]
        spec = importlib.util.spec_from_file_location(mod_name, name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    else:
        importlib.import_module(name)


def install_from_env() -> None:
    """Function probes act in ranks only (a process with RANK); module probes load everywhere."""
    for entry in filter(None, (p.strip() for p in os.environ.get(protocol_env.PROBES, "").split(","))):
        try:
            if ":" in entry and not entry.endswith(".py"):
                if "RANK" in os.environ:
                    add_function_probe(entry)
            else:
                _import_probe(entry)
        except Exception as exc:
            sys.stderr.write(f"hctool: probe {entry} failed: {type(exc).__name__}: {exc}\n")
