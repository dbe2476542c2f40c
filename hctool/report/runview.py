"""One traced run in the report: its finding, its calls aligned by sequence
number, its timeline (the whole run, then around the divergence), counts, stacks."""

from __future__ import annotations

from hctool.consensus.marks import Mark
from hctool.consensus.model import Divergence, Report
from hctool.consensus.pattern import hard_signature
from hctool.consensus.timeline import Call, Timeline
from hctool.report.svg import esc, timeline_svg

LANE_BEFORE, LANE_AFTER = 5, 3  # sequence numbers shown around the divergent one
ZOOM_CALLS = 30  # calls per rank before the divergence in the zoomed timeline
BAD = {"diverged", "deadlocked", "crashed", "hung", "invalid"}
WARN = {"unknown", "incomplete", "no_collectives", "no_process_group"}


def verdict_badge(verdict, element_id: str | None = None) -> str:
    cls = "bad" if verdict in BAD else "warn" if verdict in WARN else "good" if verdict else ""
    ident = f' id="{esc(element_id)}"' if element_id else ""
    return f'<span class="verdict {cls}"{ident}>{esc(verdict or "-")}</span>'


def headline(report: Report) -> str:
    """The cause and the culprit first (or what was not seen), as every rendering leads."""
    first = report.first_divergence
    if first is None:
        return report.reason or f"{report.world_size} rank(s), every call agreed"
    return first.cause_line()


def divergence_table(first: Divergence) -> str:
    rows = [
        '<table class="divergence"><tr><th>rank</th><th>role</th><th>state</th><th>call</th><th>site</th>'
        "<th>function</th><th>callers</th><th>where it stopped</th></tr>"
    ]
    for rank, e in sorted(first.ranks.items()):
        culprit = rank in first.culprit_ranks
        call = "-" if e.state == "absent" else e.describe()
        callers = " ← ".join(s.rsplit(" ", 1)[-1] for s in e.stack[:4])
        site = e.site or (f"last: {e.last_seen}" if e.last_seen else "-")
        sym = first.symptom.get(rank)
        rows.append(
            f'<tr class="{"culprit" if culprit else "peer"}" data-rank="{rank}"><td class="rank">{rank}</td>'
            f"<td>{'culprit' if culprit else 'peer'}</td><td>{esc(e.state)}</td><td>{esc(call)}</td>"
            f'<td class="site">{esc(site)}</td><td>{esc(e.function or "-")}</td>'
            f'<td class="site">{esc(callers or "-")}</td><td class="site">{esc(sym.words() if sym else "-")}</td></tr>'
        )
    rows.append("</table>")
    return "\n".join(rows)


def cause_block(first: Divergence, said_above: frozenset[str] = frozenset()) -> str:
    """The answer, before any table: the cause line, the symptom, how sure, and why. A line the
    page already gives just above (a chaos anomaly's, of this run) is not said twice."""
    parts = [] if first.cause_line() in said_above else [f'<p class="cause" id="cause">{esc(first.cause_line())}</p>']
    if first.symptom_line() and first.symptom_line() not in said_above:
        parts.append(f'<p class="symptom">{esc(first.symptom_line())}</p>')
    why = f"confidence {first.confidence.value}" + (f": {first.basis}" if first.basis else "")
    if first.alternative:
        why += f" (the other reading: {first.alternative})"
    parts.append(f'<p class="dim">{esc(why)}</p>')
    return "\n".join(parts)


def _channel_calls(tl: Timeline, channel: str) -> dict[int, dict[int, Call]]:
    return {r: {c.seq: c for c in cs if c.channel == channel} for r, cs in tl.calls.items()}


def lanes_table(tl: Timeline, first: Divergence | None) -> str:
    """Rows = ranks, columns = sequence numbers of one group: the divergent one, or the
    busiest group's last calls. A cell differs (red) from the lowest rank's call at that seq."""
    if first:
        channel, at = first.group, first.seq
    else:
        busiest: dict[str, int] = {}
        for cs in tl.calls.values():
            for c in cs:
                busiest[c.channel] = max(busiest.get(c.channel, 0), c.seq)
        if not busiest:
            return '<p class="dim">no calls recorded</p>'
        channel = max(busiest, key=busiest.get)
        at = None
    per_rank = _channel_calls(tl, channel)
    top = max((max(s, default=-1) for s in per_rank.values()), default=-1)
    centre = at if at is not None else top
    seqs = list(range(max(0, centre - LANE_BEFORE), min(top, centre + LANE_AFTER) + 1))
    head = "".join(f'<th class="{"at" if s == at else ""}">seq {s}</th>' for s in seqs)
    rows = [
        f'<div class="lanes"><table class="seq-lanes" data-group="{esc(channel)}"><tr><th>group '
        f"{esc(channel)}</th>{head}</tr>"
    ]
    ranks = sorted(per_rank) or tl.ranks
    culprits = set(first.culprit_ranks) if first else set()
    for r in ranks:
        cells = []
        for s in seqs:
            c = per_rank.get(r, {}).get(s)
            if c is None:
                cells.append(f'<td class="none{" at" if s == at else ""}">—</td>')
                continue
            ref = next((per_rank[q][s] for q in ranks if q != r and s in per_rank.get(q, {})), None)
            cls = ["at"] if s == at else []
            if ref is not None and hard_signature(ref.ev) != hard_signature(c.ev):  # a site alone: a pairing
                cls.append("mismatch")
            if c.ev.get("state") != "completed":
                cls.append("open")
            ev = c.ev
            cells.append(
                f'<td class="{" ".join(cls)}"><span class="cell-op">{esc(ev["op"])}</span> '
                f"{esc(ev.get('ro') or '')} {esc(ev.get('state') if ev.get('state') != 'completed' else '')}"
                f'<span class="cell-site">{esc(ev.get("site") or "-")}</span>'
                f'<span class="cell-site">{esc(ev.get("fn") or "")}</span></td>'
            )
        rows.append(
            f'<tr class="{"culprit" if r in culprits else ""}" data-rank="{r}"><td class="rank">rank {r}</td>'
            f"{''.join(cells)}</tr>"
        )
    rows.append("</table></div>")
    note = (
        ""
        if at is None
        else (
            '<p class="dim">Calls of one group pair by position: seq N on one rank met seq N on '
            "the others. Red: not the same call as the other rank's.</p>"
        )
    )
    return "\n".join(rows) + note


def _zoom_window(tl: Timeline, first: Divergence | None) -> tuple[float, float] | None:
    """The calls of the lanes table on the time axis: from LANE_BEFORE calls before the
    divergence in its group (or the last ZOOM_CALLS calls of each rank) to a little after it."""
    starts, ats = [], []
    for _r, cs in tl.calls.items():
        if first:
            mine = [c for c in cs if c.channel == first.group and first.seq - LANE_BEFORE <= c.seq <= first.seq]
        else:
            mine = cs[-ZOOM_CALLS:]
        times = [c.ev["w"] for c in mine if c.ev.get("w") is not None]
        if times:
            starts.append(min(times))
            ats.append(max(times))
    if not starts:
        return None
    lo, at = min(starts), max(ats)
    return lo, at + max(0.25 * (at - lo), 0.002)


def timelines(tl: Timeline, marks: list[Mark], first: Divergence | None, name: str) -> str:
    times = [c.ev["w"] for cs in tl.calls.values() for c in cs if c.ev.get("w") is not None]
    times += [m.ts for m in marks]
    if not times:
        return '<p class="dim">no calls recorded</p>'
    origin = min(times)
    end = max([tl.end_wall or origin, *times])
    slug = "".join(ch if ch.isalnum() else "-" for ch in name)
    out = [
        f"<h3>Timeline: the whole run ({end - origin:.1f} s)</h3>",
        timeline_svg(tl, marks, origin, end, origin, divergence=first, css_id=f"timeline-{slug}"),
    ]
    zoom = _zoom_window(tl, first)
    if zoom:
        what = "around the first divergence" if first else "the last calls"
        out += [
            f"<h3>Timeline: {what} ({(zoom[1] - zoom[0]) * 1000:.0f} ms), lines join the calls that paired</h3>",
            timeline_svg(tl, marks, zoom[0], zoom[1], origin, pairs=True, divergence=first, css_id=f"zoom-{slug}"),
        ]
    if tl.thinned:
        out.append(f'<p class="dim">Calls thinned to fit the page: {esc(tl.rule())}.</p>')
    out.append('<p class="dim">Hover a call for its details; click it to outline the calls it paired with.</p>')
    return "\n".join(out)


def counts_table(report: Report) -> str:
    counts = report.counts
    ops = sorted({op for c in counts.values() for op in c})
    if not ops:
        return '<p class="dim">no counts</p>'
    head = "".join(f"<th>{esc(op)}</th>" for op in ops)
    rows = "".join(
        f'<tr><td class="rank">rank {esc(r)}</td>'
        + "".join(f"<td>{c.get(op, 0)}</td>" for op in ops)
        + f"<td>{sum(c.values())}</td></tr>"
        for r, c in counts.items()
    )
    return f'<table class="counts"><tr><th></th>{head}<th>total</th></tr>{rows}</table>'


MANY = 8  # beyond this many ranks, the page shows classes of ranks and one stack per class


def classes_block(report: Report) -> str:
    """Ranks folded into classes, STAT-style: by calls per op and by stack, odd ones first."""
    from hctool.consensus.classes import tree, tree_lines

    parts = []
    cc = report.count_classes()
    if 1 < len(cc) < len(report.counts) or len(report.counts) > MANY:  # as the text: only where ranks fold
        rows = "".join(
            f'<tr class="{"odd" if i < len(cc) - 1 else ""}"><td class="rank">{esc(c.to_json()["ranks"])}</td>'
            f"<td>{len(c.ranks)}</td><td>{esc(c.words().split(': ', 1)[1])}</td></tr>"
            for i, c in enumerate(cc[:50])
        )
        parts.append(
            f'<h3>Ranks by calls ({len(cc)} classes, odd first)</h3><table class="classes counts-classes">'
            f"<tr><th>ranks</th><th>how many</th><th>calls</th></tr>{rows}</table>"
        )
    sc = report.stack_classes()
    if sc and (1 < len(sc) < len(report.stacks) or len(report.stacks) > MANY):
        rows = "".join(
            f'<tr><td class="rank">{esc(c.to_json()["ranks"])}</td><td>{len(c.ranks)}</td>'
            f'<td class="site">{esc(" <- ".join(c.frames[:8]) or "(no frame)")}</td></tr>'
            for c in sc[:50]
        )
        merged = "\n".join(tree_lines(tree(sc))[:60])
        parts.append(
            f'<h3>Ranks by stack ({len(sc)} classes, odd first)</h3><table class="classes stack-classes">'
            f"<tr><th>ranks</th><th>how many</th><th>frames, innermost first</th></tr>{rows}</table>"
            f"<details><summary>merged tree (ranks per frame, outermost first)</summary><pre>{esc(merged)}</pre>"
            f"</details>"
        )
    return "\n".join(parts)


def stacks_block(report: Report) -> str:
    stacks = report.stacks
    if not stacks:
        return '<p class="dim">no stacks (they are taken when a run hangs or diverges while its ranks are alive)</p>'
    if len(stacks) > MANY:  # one rank of each stack class
        reps = {str(c.ranks[0]) for c in report.stack_classes()}
        stacks = {r: t for r, t in stacks.items() if r in reps}
    culprits = set(report.first_divergence.culprit_ranks if report.first_divergence else [])
    key = lambda kv: (int(kv[0]) not in culprits, int(kv[0]) if str(kv[0]).isdigit() else 0)  # noqa: E731
    return "\n".join(
        f'<details class="stack" data-rank="{esc(r)}" open><summary>rank {esc(r)}'
        f"{' (culprit)' if str(r).isdigit() and int(r) in culprits else ''}</summary><pre>{esc(text)}</pre></details>"
        for r, text in sorted(stacks.items(), key=key)
    )


def run_section(
    name: str,
    report: Report,
    tl: Timeline,
    marks: list[Mark],
    extra: str = "",
    said_above: frozenset[str] = frozenset(),
) -> str:
    first = report.first_divergence
    slug = "".join(ch if ch.isalnum() else "-" for ch in name)
    shown = report.extra.get("runner_verdict") or report.verdict.value  # repro's and chaos's own words win
    parts = [f'<section class="run" id="run-{esc(slug)}"><h2>{esc(name)} {verdict_badge(shown)}</h2>']
    if first:
        parts.append(cause_block(first, said_above))
    else:
        parts.append(f'<p class="headline">{esc(headline(report))}</p>')
    parts.append(extra)
    if first:
        if first.deadlock:
            parts.append(f"<p><b>Wait cycle across groups:</b> {esc(first.deadlock)}</p>")
        parts.append(divergence_table(first))
    parts += [
        "<h3>Calls aligned by sequence number</h3>",
        lanes_table(tl, first),
        timelines(tl, marks, first, name),
        classes_block(report),
        *(("<h3>Calls per rank</h3>", counts_table(report)) if len(report.counts) <= MANY else ()),
        "<h3>Stacks</h3>",
        stacks_block(report),
        "</section>",
    ]
    return "\n".join(parts)
