"""Probes in a report (docs/contracts.md): per rank, how often each probed function was
entered ("probes"), and at the first divergence the last probe each rank entered before its
divergent call ("probe": {"name", "caller"}), found by the rank's own clock."""

from __future__ import annotations

import bisect


def annotate(report, ranks: dict, finding: dict | None):
    """Adds "probes" (only when some rank recorded one) and each divergent rank's "probe"
    (report: a consensus.model.Report)."""
    if not any(rt.probe_counts for rt in ranks.values()):
        return report
    report.probes = {str(r): dict(sorted(rt.probe_counts.items())) for r, rt in sorted(ranks.items())}
    first = report.first_divergence
    if not first or finding is None:
        return report
    for r, entry in first.ranks.items():
        ev, rt = finding["events"].get(int(r)), ranks.get(int(r))
        entry.probed, entry.probe = True, None
        if rt is None or not rt.probes:
            continue
        t = ev.get("t") if ev is not None else None
        times = [p[0] for p in rt.probes]
        i = len(times) if t is None else bisect.bisect_right(times, t)
        if i:
            _, name, site, fn = rt.probes[i - 1]
            entry.probe = {
                "name": name,
                "caller": f"{fn}:{site.rsplit(':', 1)[-1]}" if fn and site else site,
                "site": site,
            }
    return report
