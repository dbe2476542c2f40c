"""Who waits for whom across groups: the ranks inside a collective elsewhere
(a rank absent from a call is `missing` unless it waits in another group) and
wait cycles, which are deadlocks the moment they form (docs/consensus.md)."""

from __future__ import annotations

from typing import NamedTuple


class Waits(NamedTuple):
    busy: dict[int, set[str]]  # rank -> channels where one of its calls has not completed
    stuck: set[int]  # ranks in a wait cycle: a deadlock that can never resolve
    cycle: str = ""  # the cycle in words
    calls: tuple = ()  # per rank of the first cycle's strongly connected set: {"rank", "group", "seq", "site"}
    events: dict = {}  # rank -> the call it waits in (for those ranks)
    held: frozenset = frozenset()  # ranks whose every collective-issuing thread waits in a synchronous call


def wait_state(
    channels: dict, all_ranks: list[int], ended: dict[int, str | None], thread_last: dict[tuple, dict] | None = None
) -> Waits:
    """Who waits for whom. A rank is held when every thread that issued a
    collective sits in a synchronous call that has not completed (thread_last:
    (rank, thread) -> its latest event). A held rank blocked at index i of a
    channel waits for every member that has not entered index i (entries are
    written before the call, so "not entered" is certain). A cycle of such waits
    across groups is a deadlock the moment it forms."""
    held: dict[int, bool] = {}
    for (r, _th), ev in (thread_last or {}).items():
        held[r] = held.get(r, True) and ev["state"] == "blocked" and not ev.get("async")
    busy: dict[int, set[str]] = {}
    edges: dict[int, dict[int, str]] = {}
    waiting_in: dict[int, tuple] = {}  # rank -> (channel, seq, event) of its call that waits for others
    for ch in channels.values():
        members = ch.member_ranks(all_ranks)
        for r, seq in ch.seqs.items():
            for i, ev in enumerate(seq):
                if ev["state"] == "completed":
                    continue
                busy.setdefault(r, set()).add(ch.key)  # also a rank that died in there
                if ended.get(r) or not held.get(r) or ev.get("async") or ev["state"] != "blocked":
                    continue  # a rank with a thread still running may yet make the call
                for m in members:
                    if m != r and len(ch.seqs.get(m, ())) <= i:
                        edges.setdefault(r, {})[m] = f"rank {r} waits in {ch.key} seq {ch.base + i} for rank {m}"
                        waiting_in.setdefault(r, (ch.key, ch.base + i, ev))
    stuck: set[int] = set()
    words: list[str] = []
    ring: list[int] = []
    for start in sorted(edges):
        if start in stuck:
            continue
        parent: dict[int, int] = {}
        frontier = [start]
        while frontier and start not in parent:  # breadth-first back to start: a cycle
            nxt = []
            for r in frontier:
                for m in sorted(edges.get(r, {})):
                    if m not in parent:
                        parent[m] = r
                        nxt.append(m)
            frontier = nxt
        if start in parent:
            cycle, r = [start], parent[start]
            while r != start:
                cycle.append(r)
                r = parent[r]
            cycle.reverse()  # start -> ... -> start, in wait order
            low = cycle.index(min(cycle))
            cycle = cycle[low:] + cycle[:low]  # told from its lowest rank
            stuck |= set(cycle)
            if not words:
                words = [edges[a][b] for a, b in zip(cycle, cycle[1:] + cycle[:1])]
                ring = cycle + sorted(_strongly_connected(edges, start) - set(cycle))
    calls = tuple(
        {"rank": r, "group": waiting_in[r][0], "seq": waiting_in[r][1], "site": waiting_in[r][2].get("site")}
        for r in ring
    )
    return Waits(
        busy,
        stuck,
        "; ".join(words),
        calls,
        {r: waiting_in[r][2] for r in ring},
        frozenset(r for r, h in held.items() if h),
    )


def _reach(edges: dict[int, dict[int, str]], start: int) -> set[int]:
    seen, todo = {start}, [start]
    while todo:
        for m in edges.get(todo.pop(), {}):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _strongly_connected(edges: dict[int, dict[int, str]], start: int) -> set[int]:
    """Every rank that waits, through others, for `start` and for which `start` waits:
    all of them are on the deadlock (four ranks of two groups waiting crosswise)."""
    return {m for m in _reach(edges, start) if start in _reach(edges, m)}
