"""Where two ranks' sequences parted, once evidence says they did (docs/consensus.md,
"Evidence and location"). Cross-site pairings of equal calls are the candidates:
the earliest one after which the inserting rank's next call is the call its peer
made there ("the peer's next call matches its following one") is where it
inserted a call, and the first pairing of the same two call sites is named
(where the pattern broke).
"""

from __future__ import annotations

from hctool.consensus.pattern import hard_signature, pattern_key

WINDOW = 512  # calls after a candidate that are compared (the fit is local: bounded work on long traces)


def _equal(p: dict, q: dict) -> bool:
    return hard_signature(p) == hard_signature(q)


def _cross(p: dict, q: dict) -> bool:
    return _equal(p, q) and pattern_key(p) != pattern_key(q)


def cost(x: list, y: list, x_final: bool, y_final: bool) -> tuple[int, int]:
    """(calls that cannot pair, calls that pair across call sites) for x and y
    aligned position by position; a final sequence that is shorter leaves the
    other's surplus unpaired."""
    hard = site = 0
    for p, q in zip(x[:WINDOW], y[:WINDOW]):
        if not _equal(p, q):
            hard += 1
        elif pattern_key(p) != pattern_key(q):
            site += 1
    if max(len(x), len(y)) <= WINDOW and (len(x) < len(y) and x_final or len(y) < len(x) and y_final):
        hard += abs(len(x) - len(y))
    return hard, site


def _same(p: dict, q: dict) -> bool:
    return _equal(p, q) and pattern_key(p) == pattern_key(q)


def inserted_at(x: list, y: list, q: int, x_final: bool, y_final: bool) -> int | None:
    """The index at which x inserted a call, judged by the cross-site pairings
    before q (the evidence), or None when none explains it. At a pairing p, x
    inserted its call if x's next call is the call y made at p (same call, same
    place); when x's next call is also y's next one (a uniform loop), the shift
    has to make the rest fit strictly better, the inserted call costing as much
    as the cross-site pairing it was."""
    for p in range(min(q, len(x) - 1, len(y))):
        if not _cross(x[p], y[p]) or not _same(x[p + 1], y[p]):
            continue
        if p + 1 < len(y) and _same(x[p + 1], y[p + 1]):
            hard, site = cost(x[p + 1:], y[p:], x_final, y_final)
            if not (hard, site + 1) < cost(x[p:], y[p:], x_final, y_final):
                continue
        combo = (pattern_key(x[p]), pattern_key(y[p]))
        return next(j for j in range(p + 1) if _cross(x[j], y[j]) and (pattern_key(x[j]), pattern_key(y[j])) == combo)
    return None

