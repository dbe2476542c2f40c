"""How often each fault fired in a rank: the agent writes `faults-rank{R}-{pid}.json` beside
the traces ({"rank", "pid", "faults": [{"spec", "fired", "target"?, "resolved"?}]}); the
supervisor sums them per fault for its report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

PATTERN = re.compile(r"^faults-rank(\d+)-(\d+)\.json$")
MAX_BYTES = 1 << 20


def file_name(rank: int, pid: int) -> str:
    return f"faults-rank{rank}-{pid}.json"


def read(folder: Path | list[Path], specs: list[str]) -> list[dict]:
    """Per fault of `specs` (in order): {"spec", "fired": {"<rank>": n}, "total", and for a
    by-name fault "resolved": {"<rank>": state}} over every rank file in the folder (or folders:
    a PD run's two sides); a fault no rank reported is there with total 0 ("never fired")."""
    out: dict[str, dict[str, Any]] = {s: {"spec": s, "fired": {}, "total": 0} for s in specs}
    folders = [folder] if isinstance(folder, (str, Path)) else folder
    for path in sorted(p for f in folders for p in Path(f).glob("faults-rank*.json")):
        m = PATTERN.match(path.name)
        if not m or path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_BYTES:
            continue
        try:
            data = json.loads(path.read_text())
            entries = data["faults"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        rank = m.group(1)
        for e in entries if isinstance(entries, list) else []:
            if not isinstance(e, dict) or not isinstance(e.get("spec"), str) or not isinstance(e.get("fired"), int):
                continue
            row = out.setdefault(e["spec"], {"spec": e["spec"], "fired": {}, "total": 0})
            row["fired"][rank] = row["fired"].get(rank, 0) + e["fired"]
            row["total"] += e["fired"]
            if isinstance(e.get("resolved"), str):
                row.setdefault("resolved", {})[rank] = e["resolved"]
    return list(out.values())


def describe(row: dict) -> str:
    """One fault's line: `SPEC fired 12x (rank 0: 4, rank 1: 8)` or `SPEC never fired (why)`;
    the supervisor's workload faults count under "client"."""
    if not row.get("total"):
        states = sorted(set((row.get("resolved") or {}).values()) - {"wrapped"})
        return f"{row['spec']} never fired" + (f" ({'; '.join(states)})" if states else "")
    who = ", ".join(f"rank {k}: {n}" if k.isdigit() else f"{k}: {n}" for k, n in sorted(row["fired"].items()))
    return f"{row['spec']} fired {row['total']}x ({who})"
