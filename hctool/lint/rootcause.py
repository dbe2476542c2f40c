"""One finding per root cause: a rank-local source and every collective it gates.

The location is the source (the poll, the deadline comparison, the write on another thread, the
swallowed I/O failure); `related` lists each gated collective with how the source decides it, the
deciding conditions and exits, and the call chain of the nearest one down to the real collective.
A source that is rank-local only under a premise (a pool's free count) is one finding per premise
and pool, however many places and methods read it, with the premise named and the code that makes it
hold cited (project.Project.lagging_pools).
"""

from __future__ import annotations

from hctool.lint import sources as S
from hctool.lint.checks import Finding, Rel, Relation

KIND_TEXT = {
    "pool": "a pool's free count",
    "poll": "an event or future poll",
    "deadline": "a per-rank deadline",
    "thread": "a field another thread writes",
    "io": "an I/O failure that a handler swallows",
    "rank": "a configured rank-local value",
    "id": "the rank id",
    "id-local": "the rank id",
    "order": "an order by per-rank wall-clock stamps",
}


def group_key(r: Relation) -> tuple:
    src = r.src
    if src is None:
        return ("cond", *(r.cond or (r.path, r.line)))
    pid = S.premise_id(src.kind, src.what)
    if pid:
        # one root cause per pool: its free counts (`available_size()`, `swa_available_size()`) differ
        # between ranks for the same reason, wherever they are read
        return ("premise", pid, S.free_count_pool(src.what) or src.what)
    return ("src", src.path, src.line, src.kind, src.what)


def fold(relations: list[Relation], lagging: dict | None = None) -> list[Finding]:
    """LAGGING: pool -> project.Lag, the change of a pool at a time of one rank's own that a free-count
    finding's premise rests on (cited in its message and its related lines).

    A pool whose change runs only under the condition of another finding's source (SGLang's host pool,
    freed by the waiting-timeout abort of a request, scheduler.py:2892, under the per-rank deadline at
    :2889) is that source's consequence, not a root cause of its own: its collectives join that finding."""
    lagging = lagging or {}
    groups: dict[tuple, list[Relation]] = {}
    for r in relations:
        groups.setdefault(group_key(r), []).append(r)
    at = {(key[1], key[2]): key for key in groups if key[0] == "src"}
    for key in [k for k in groups if k[0] == "premise"]:
        lag = lagging.get(key[2])
        target = at.get(lag.cause) if lag is not None and lag.cause else None
        if target is not None:
            groups[target] += groups.pop(key)
    return [_finding(rels, lagging, key) for key, rels in sorted(groups.items(), key=lambda kv: repr(kv[0]))]


def _rel(path: str, line: int) -> str:
    # The finding's own path form (relative to where lint ran), so a message's citation and its
    # location read the same: `mypkg/tp.py:14`, never a bare `tp.py:14`.
    return f"{path}:{line}"


def _finding(rels: list[Relation], lagging: dict, key: tuple = ()) -> Finding:
    srcs = sorted({r.src for r in rels if r.src is not None})
    own = [s for s in srcs if key[:1] == ("src",) and (s.path, s.line, s.kind, s.what) == key[1:]]
    srcs = own + [s for s in srcs if s not in own]  # the group's own source first: its location
    gated: dict[tuple, Relation] = {}
    for r in sorted(rels, key=lambda r: (r.path, r.line, r.rule)):
        gated.setdefault((r.path, r.line), r)  # one entry per call site, its first rule
    sites = list(gated.values())
    if srcs:
        loc = srcs[0]
        path, line, col, fn, kind = loc.path, loc.line, loc.col, loc.fn, loc.kind
    else:  # no named source: the deciding condition stands in
        r0 = sites[0]
        path, line = r0.cond or (r0.path, r0.line)
        col, fn, kind = 1, r0.function, None
    primary = min(sites, key=lambda r: (r.path != path, abs(r.line - line), r.path, r.line))
    related: list[Rel] = []
    for s in srcs[1:]:
        same = s.kind == srcs[0].kind
        text = f"the same source: {s.what}" if same else f"and through what it changes: {s.what}"
        related.append(Rel(s.path, s.line, text, "source"))
    premise_id = S.premise_id(kind, loc.what) if srcs else None
    premise = S.PREMISES.get(premise_id) if premise_id else None
    lag = lagging.get(S.free_count_pool(loc.what)) if premise else None
    if lag is not None:
        seen_here = f"here `{S.free_count_pool(loc.what)}` changes at {_rel(lag.path, lag.line)}"
        where = ", under a per-rank condition"
        if lag.via:
            where = f", reached from the per-rank call or thread at {_rel(*lag.via)}"
        premise = f"{premise}: {seen_here}{where}"
    evidence: list[Rel] = []  # after the gated calls, before the chain: the first related line is a collective
    if lag is not None:
        evidence.append(
            Rel(lag.path, lag.line, "the premise: the pool changes here at a time of this rank's own", "source")
        )
        if lag.via:
            via = "the premise: the per-rank call or thread it runs under"
            evidence.append(Rel(lag.via[0], lag.via[1], via, "source"))
    seen = {(path, line)}
    for r in sorted(sites, key=lambda r: (r is not primary, r.path, r.line)):
        related.append(Rel(r.path, r.line, f"{r.rule}: {r.what} {r.how}", "collective"))
        for where, role in ((r.loop, "loop"), (r.cond, "condition"), (r.exit, "exit")):
            if where and (where[0], where[1]) not in seen:
                seen.add((where[0], where[1]))
                label = {
                    "loop": "the loop",
                    "condition": "the deciding condition",
                    "exit": f"the early `{where[2] if len(where) > 2 else 'return'}`",
                }[role]
                related.append(Rel(where[0], where[1], label, role))
    related += evidence
    related += [Rel(p, ln, m, "chain") for p, ln, m in primary.chain]
    what = loc.what if srcs else "state"
    n = len(sites)
    head = f"rank-local {what} ({KIND_TEXT.get(kind, 'rank-local state')})"
    if primary.rule == "HC104":
        message = f"{head} decides {primary.what} ({_rel(primary.path, primary.line)}), which {primary.how}"
    else:
        message = (
            f"{head} decides whether {'a collective call runs' if n == 1 else f'{n} collective calls run'}: "
            f"{primary.what} ({_rel(primary.path, primary.line)}) {primary.how}"
        )
    if n > 1:
        message += f"; and {n - 1} more (related)"
    if premise:
        message += (
            f". Premise: {premise}; if that cannot happen here, accept it with "
            f'`uniform = ["{premise_id}"]` in [tool.hctool.lint]'
        )
    return Finding(path, line, col, primary.rule, message, related, line, S.severity(kind), fn, premise, n)
