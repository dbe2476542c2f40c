"""Name the first differing field of the per-rank state records that an engine run
with --state-digest writes when its ranks' digests disagree (RUN_DIR/state/rankN.json,
beside the traces). Every rank writes its record in the same tick, so the records
are comparable field by field, in the order the engine lists them."""

from __future__ import annotations

import json
from pathlib import Path


def _read(state_dir: Path) -> dict[int, dict]:
    out = {}
    for path in sorted(Path(state_dir).glob("rank*.json")):
        try:
            rec = json.loads(path.read_text())
            out[int(rec["rank"])] = rec
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a rank killed while writing: compare the others
    return out


def _first_difference(field: str, values: dict[int, list]) -> tuple[int, dict[int, str]] | None:
    """(index, per-rank value there) of the first difference, or None. The LRU order
    is compared on the nodes every rank has: a node missing on one rank is a
    difference of the tree, named by that field."""
    if field == "lru_order":
        common = set.intersection(*(set(v) for v in values.values()))
        values = {r: [x for x in v if x in common] for r, v in values.items()}
    longest = max(len(v) for v in values.values())
    for i in range(longest):
        seen = {r: (v[i] if i < len(v) else "<none>") for r, v in values.items()}
        if len(set(map(str, seen.values()))) > 1:
            return i, {r: str(x)[:160] for r, x in seen.items()}
    return None


def find_state_divergence(state_dir: Path) -> dict | None:
    """{"tick", "field", "index", "ranks": {rank: value}, "differing_fields"} or None."""
    recs = _read(state_dir) if Path(state_dir).is_dir() else {}
    if len(recs) < 2:
        return None
    first = next(iter(recs.values()))
    found, differing = None, []
    for field in first.get("fields", []):
        values = {r: rec["state"].get(field, []) for r, rec in recs.items()}
        diff = _first_difference(field, values)
        if diff is None:
            continue
        differing.append(field)
        if found is None:
            i, ranks = diff
            found = {
                "tick": first.get("tick"),
                "field": f"{field}[{i}]",
                "index": i,
                "ranks": {str(r): v for r, v in sorted(ranks.items())},
            }
    if found is None:
        return None
    found["differing_fields"] = differing
    found["ticks"] = {str(r): rec.get("tick") for r, rec in sorted(recs.items())}
    return found
