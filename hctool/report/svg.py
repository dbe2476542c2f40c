"""The timeline as inline SVG: a block per rank, a row per process group (and
one for faults and other marks), a rectangle per call from enqueue to
completion, on one time axis. The zoomed view adds a line between the calls
the transport paired (same group, same seq), red where they differ.
Everything drawn comes from traces: every string is escaped."""

from __future__ import annotations

import html
import math
import zlib

from hctool.consensus.align import pair_label
from hctool.consensus.marks import Mark
from hctool.consensus.timeline import Call, Timeline, wall_done, wall_end

ROW, GAP, LEFT, RIGHT, TOP = 16, 10, 150, 20, 28
PALETTE = ("#9c755f", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#bab0ac", "#86bcb6", "#d4a6c8")
FIXED = {
    "all_reduce": "#4e79a7",
    "broadcast": "#59a14f",
    "broadcast_object_list": "#8cd17d",
    "barrier": "#bab0ac",
    "all_gather": "#f28e2b",
    "all_gather_into_tensor": "#f28e2b",
    "reduce_scatter_tensor": "#e15759",
    "assert_same": "#b07aa1",
    "isend": "#76b7b2",
    "irecv": "#499894",
    "send": "#76b7b2",
    "recv": "#499894",
}
MAX_MARK_ROWS = 6


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def colour(op: str) -> str:
    return FIXED.get(op) or PALETTE[zlib.crc32(op.encode()) % len(PALETTE)]


def _mark_rows(marks: list[Mark], rank: int) -> list[str]:
    """A row per window (fault) name on this rank, then one for instants."""
    names: list[str] = []
    instants = False
    for m in sorted(marks, key=lambda m: m.ts):
        if m.rank not in (None, rank):
            continue
        if m.dur is None and not m.until_end:
            instants = True
        elif m.name not in names:
            names.append(m.name)
    rows = names[:MAX_MARK_ROWS]
    return rows + (["events"] if instants or len(names) > MAX_MARK_ROWS else [])


def nice_step(span: float, ticks: int = 8) -> float:
    raw = span / max(1, ticks)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def tip(c: Call, rank: int) -> str:
    ev = c.ev
    lines = [
        f"rank {rank}: {ev['op']} seq {c.seq} in {ev['g']}",
        f"at {ev.get('site')} ({ev.get('fn')})",
        f"shapes {ev.get('sh')} {','.join(map(str, ev.get('dt', [])))}" + (f" op={ev['ro']}" if ev.get("ro") else ""),
        f"state {ev.get('state')}, thread {ev.get('th')}",
    ]
    done = wall_done(ev)
    if done is not None and ev.get("w") is not None:
        lines.append(f"took {(done - ev['w']) * 1000:.3f} ms")
    return "\n".join(lines)


def _groups(tl: Timeline) -> list[str]:
    seen = {c.ev["g"] for cs in tl.calls.values() for c in cs}
    return sorted(
        seen, key=lambda g: (g == "labels", int(g.split(":", 1)[0]) if g.split(":", 1)[0].isdigit() else 1 << 30, g)
    )


def timeline_svg(
    tl: Timeline,
    marks: list[Mark],
    lo: float,
    hi: float,
    origin: float,
    width: int = 1200,
    pairs: bool = False,
    divergence=None,
    css_id: str = "timeline",
) -> str:
    """Calls and marks between wall times lo and hi; the axis counts seconds from origin."""
    hi = max(hi, lo + 1e-6)
    plot = width - LEFT - RIGHT
    groups = _groups(tl)
    x = lambda t: LEFT + (t - lo) / (hi - lo) * plot  # noqa: E731
    rows: dict[tuple[int, str], float] = {}
    y, labels = TOP, []
    for r in tl.ranks:
        labels.append(f'<text class="rank" x="4" y="{y + 12}">rank {r}</text>')
        y += ROW
        for m in _mark_rows(marks, r):
            rows[(r, "mark:" + m)] = y
            short = m if len(m) <= 22 else m[:21] + "…"
            labels.append(f'<text class="row" x="14" y="{y + 11}"><title>{esc(m)}</title>{esc(short)}</text>')
            y += ROW
        for g in groups:
            rows[(r, g)] = y
            labels.append(
                f'<text class="row" x="14" y="{y + 11}">{esc(f"group {g}" if g != "labels" else "labels")}</text>'
            )
            y += ROW
        y += GAP
    height = y + 6
    out = [
        f'<svg id="{esc(css_id)}" class="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" role="img">'
    ]
    out += _axis(lo, hi, origin, x, height)
    out += labels
    out += _mark_shapes(marks, tl.ranks, rows, x, lo, hi)
    centres: dict[tuple[str, int], list[tuple[int, float, float, Call]]] = {}
    end = tl.end_wall or hi
    for r in tl.ranks:
        for c in tl.calls.get(r, []):
            ev = c.ev
            w0 = ev.get("w")
            if w0 is None:
                continue
            w1 = wall_end(ev, end)
            if w1 < lo or w0 > hi:
                continue
            x0, x1 = x(max(w0, lo)), x(min(max(w1, w0), hi))
            ry = rows[(r, ev["g"])]
            cls = "call div" if c.divergent else "call open" if ev.get("state") != "completed" else "call"
            out.append(
                f'<rect class="{cls}" x="{x0:.1f}" y="{ry + 2}" width="{max(1.0, x1 - x0):.1f}" height="{ROW - 4}" '
                f'fill="{colour(ev["op"])}" data-k="{esc(c.channel)}|{c.seq}"><title>{esc(tip(c, r))}</title></rect>'
            )
            if w1 > hi:
                out.append(
                    f'<text class="more" x="{x1 - 2:.1f}" y="{ry + 11}" text-anchor="end">'
                    f"&#8594; {esc(ev.get('state'))} {w1 - w0:.1f} s</text>"
                )
            centres.setdefault((c.channel, c.seq), []).append((r, x0, ry, c))
    if pairs:
        out += _pair_lines(centres)
    if divergence:
        out += _divergence_lines(centres, divergence, rows, x, lo, hi)
    out.append("</svg>")
    return "\n".join(out)


def _axis(lo: float, hi: float, origin: float, x, height: int) -> list[str]:
    step = nice_step(hi - lo)
    out = []
    t = math.ceil((lo - origin) / step) * step  # seconds since origin
    while origin + t <= hi + 1e-9:
        px = x(origin + t)
        label = (
            f"{t:.0f} s" if step >= 1 else f"{t:.3f} s" if step < 0.01 else f"{t:.2f} s" if step < 0.1 else f"{t:.1f} s"
        )
        out.append(
            f'<line class="tick" x1="{px:.1f}" y1="{TOP - 6}" x2="{px:.1f}" y2="{height}"/>'
            f'<text class="tick" x="{px:.1f}" y="{TOP - 10}" text-anchor="middle">{esc(label)}</text>'
        )
        t += step
    return out


def _mark_shapes(marks, ranks, rows, x, lo, hi) -> list[str]:
    out = []
    for m in marks:
        targets = [m.rank] if m.rank is not None else ranks
        for r in targets:
            y = rows.get((r, "mark:" + m.name), rows.get((r, "mark:events")))
            if y is None:
                continue
            desc = esc(f"{m.name}\n" + "\n".join(f"{k}: {v}" for k, v in m.args.items()))
            if m.dur is not None or m.until_end:
                end = hi if m.until_end else m.ts + (m.dur or 0)
                if end < lo or m.ts > hi:
                    continue
                x0, x1 = x(max(m.ts, lo)), x(min(end, hi))
                out.append(
                    f'<rect class="mark {esc(m.kind)}" x="{x0:.1f}" y="{y + 3}" width="{max(1.0, x1 - x0):.1f}" '
                    f'height="{ROW - 6}"><title>{desc}</title></rect>'
                    f'<text class="marklabel" x="{x0 + 3:.1f}" y="{y + 11}">{esc(m.name)}</text>'
                )
            elif lo <= m.ts <= hi:
                px = x(m.ts)
                out.append(
                    f'<path class="mark {esc(m.kind)}" d="M{px:.1f},{y + 2} l4,6 l-4,6 l-4,-6 z">'
                    f"<title>{desc}</title></path>"
                )
    return out


def _pair_lines(centres) -> list[str]:
    out = []
    for (channel, seq), sides in centres.items():
        sides = sorted(sides, key=lambda s: s[0])
        for (ra, xa, ya, ca), (rb, xb, yb, cb) in zip(sides, sides[1:]):
            same, what = pair_label(ca.ev, cb.ev)
            cls = "pair" if same else "pair bad"
            out.append(
                f'<line class="{cls}" x1="{xa:.1f}" y1="{ya + ROW - 2}" x2="{xb:.1f}" y2="{yb + 2}">'
                f"<title>{esc(f'{what}: {channel} seq {seq}, rank {ra} and rank {rb}')}</title></line>"
            )
    return out


def _divergence_lines(centres, divergence, rows, x, lo, hi) -> list[str]:
    out = []
    for r, x0, ry, _c in centres.get((divergence.group, divergence.seq), []):
        role = "culprit" if r in divergence.culprit_ranks else "peer"
        out.append(
            f'<g class="divmark {role}" data-rank="{r}"><line x1="{x0:.1f}" y1="{ry - 3}" x2="{x0:.1f}" '
            f'y2="{ry + ROW + 1}"/><text x="{x0 + 4:.1f}" y="{ry - 1}">first divergence ({role})</text></g>'
        )
    return out
