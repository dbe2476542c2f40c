"""Call-site patterns of a channel: which equal calls paired across call sites.

A pairing of equal calls (same op, shapes, dtypes, reduce op, root) from
different call sites is not a divergence by itself: Join's shadow all-reduces,
the rank-0-first barriers, the sender/receiver arms of a broadcast and a neutral
vote from another line pair so by design, also when that shifts how often each
line meets its peer's. It counts only through evidence found elsewhere
(docs/consensus.md, "Evidence, cause and culprit"); the pairings say where such a
divergence is located. The state is bounded by the program's call sites.
"""

from __future__ import annotations

import json

ROOTED = {"broadcast", "reduce", "gather", "scatter", "broadcast_object_list", "gather_object", "scatter_object_list"}
# What must agree for two calls to pair correctly; the call site is only location.
HARD_FIELDS = (
    ("op", "op"),
    ("sh", "shape"),
    ("dt", "dtype"),
    ("ro", "reduce_op"),
    ("root", "root"),
    ("label", "label"),
    ("digest", "label"),
)
FREE_FORM = {"gather_object"}  # what a rank contributes is any object: its length is not a shape
HOLD = 256  # calls a cross-site pairing stays in the window, to locate a later divergence there
MAX_PAIRINGS = 256  # distinct cross-site pairings remembered per channel


def field(ev: dict, f: str):
    if f in ("sh", "dt") and ev.get("op") in FREE_FORM:
        return None
    v = ev.get(f)
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def site_key(ev: dict):
    # Root and non-root ranks legitimately reach a rooted op from different lines
    # of one function (`if rank == src: ... broadcast(...) else: ... broadcast(...)`).
    if ev.get("op") in ROOTED and ev.get("site"):
        return (ev["site"].rsplit(":", 1)[0], ev.get("fn"))
    return ev.get("site")


def hard_signature(ev: dict) -> tuple:
    sig = ev.get("_hard")  # kept on the event: the window is looked at again every poll
    if sig is None:
        if "dir" in ev:  # p2p: both sides describe the same flow; sites are never compared
            flow = (ev["rank"], ev["peer"]) if ev["dir"] == "send" else (ev["peer"], ev["rank"])
            sig = ("p2p", flow, field(ev, "sh"), tuple(ev["dt"]))
        else:
            sig = tuple(field(ev, f) for f, _ in HARD_FIELDS)
        ev["_hard"] = sig
    return sig


def pattern_key(ev: dict):
    """Where a call comes from, callers included: the call site and the line that
    called its function (the same helper reached from two places is two places)."""
    if "dir" in ev:
        return None
    stack = ev.get("stack") or ()
    return site_key(ev), (stack[1] if len(stack) > 1 else None)


def caller_text(key) -> str | None:
    return key[1].rsplit("/", 1)[-1] if key and key[1] else None


class Pattern:
    """What the channel's dropped prefix established."""

    def __init__(self) -> None:
        self.pairings: dict = {}  # combo (pattern key per member) -> {"seq", "count", "events"}


class Scan:
    """Walks a channel's positions in order over a Pattern. commit=False (a look at
    the live window, repeated each poll) leaves the Pattern as it was."""

    def __init__(self, pattern: Pattern, ranks: list[int], commit: bool = False):
        self.pattern, self.ranks, self.ref, self.commit = pattern, ranks, ranks[0], commit
        self.pairings = pattern.pairings if commit else {}

    def classify(self, events: dict[int, dict]):
        """("same",) | ("cross", combo) for one position at which every member made an equal call."""
        keys = {r: pattern_key(events[r]) for r in self.ranks}
        if len(set(keys.values())) == 1:
            return ("same",)
        return ("cross", tuple(keys[r] for r in self.ranks))

    def step(self, seq: int, events: dict[int, dict], what=None):
        what = what or self.classify(events)
        if what[0] == "cross":
            combo = what[1]
            mine = self.pairings.get(combo)
            if mine is not None:
                mine["count"] += 1
            elif (
                combo in self.pattern.pairings
                or len(self.pattern.pairings) + (0 if self.commit else len(self.pairings)) < MAX_PAIRINGS
            ):
                self.pairings[combo] = {"seq": seq, "count": 1, "events": dict(events)}
        return what


def pairings_of(pattern: Pattern, window: dict) -> dict:
    """Committed pairings merged with those a window scan saw (counts added)."""
    out = {c: dict(p) for c, p in pattern.pairings.items()}
    for c, p in window.items():
        if c in out:
            out[c]["count"] += p["count"]
        else:
            out[c] = dict(p)
    return out
