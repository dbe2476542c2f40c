"""Traces that a full trace folder cut short (the recorder's `trace_truncated` mark, written when
the folder could take no more: agent/capture/tracefile.py).

After the mark a rank records nothing, while its program runs on: its calls from there on are
unknown, not absent. So every channel the rank belongs to is compared only as far as the rank
recorded it (the other ranks' later calls are set aside), and the report says where the
comparison stopped: `incomplete`, one entry per such rank.
"""

from __future__ import annotations

REASONS = {"ENOSPC": "trace disk full", "EDQUOT": "trace disk quota exceeded", "EFBIG": "trace file too large"}


def cut(tracker, reader_ranks: dict) -> list[dict]:
    """Drop from `tracker`'s channels every call beyond what a truncated rank recorded there;
    returns the `incomplete` entries ([] when no trace was cut short)."""
    truncated = {r: rt.truncated for r, rt in reader_ranks.items() if rt.truncated}
    if not truncated:
        return []
    ranks = tracker.all_ranks()
    where: dict[int, tuple[int, str]] = {}  # rank -> (calls compared, channel) in its busiest channel
    for key, ch in tracker.channels.items():
        members = ch.member_ranks(ranks)
        recorded = {r: ch.base + len(ch.seqs.get(r, ())) for r in truncated if r in members}
        if not recorded:
            continue
        n = min(recorded.values())
        for seq in ch.seqs.values():
            while seq and ch.base + len(seq) > n:
                seq.pop()
        for r, count in recorded.items():
            if count >= where.get(r, (-1, ""))[0]:
                where[r] = (count, key)
    out = []
    for r, mark in sorted(truncated.items()):
        seq, group = where.get(r, (0, None))
        out.append(
            {
                "rank": r,
                "reason": REASONS.get(mark["why"], f"trace not writable ({mark['why']})"),
                "errno": mark["why"],
                "group": group,
                "seq": seq,
            }
        )
    return out


def describe(entry: dict) -> str:
    """`incomplete: trace disk full at seq N ...`, the line the report prints."""
    where = f" of group {entry['group']}" if entry.get("group") else ""
    return (
        f"incomplete: {entry['reason']} at seq {entry['seq']}{where} on rank {entry['rank']} "
        f"(its later calls were not recorded, nor compared)"
    )
