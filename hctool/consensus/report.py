"""Rich rendering of a check-consensus report (the JSON stays the data)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hctool.consensus.model import Call, Divergence, RankCall, Report
from hctool.consensus.truncation import describe
from hctool.protocol import faultcounts

_VERDICT_STYLE = {
    "consistent": "bold green",
    "diverged": "bold red",
    "hung": "bold yellow",
    "crashed": "bold red",
    "incomplete": "bold yellow",
    "no_collectives": "bold yellow",
    "no_process_group": "bold yellow",
}


def _chain(entry: Call) -> str:
    # "check_prefetch_progress <- get_new_batch_prefill": the call site's function and its callers
    names = [s.rsplit(" ", 1)[-1] for s in entry.stack[:3]]
    return " <- ".join(names)


MANY = 8  # beyond this many ranks, the text shows classes of ranks, not every rank


def classes_lines(report: Report) -> list[str]:
    """Ranks folded into classes (by calls per op, by stack), the odd ones first."""
    out = []
    cc = report.count_classes()
    # a class of one rank per rank says nothing the counts line does not
    if 1 < len(cc) < len(report.counts) or len(report.counts) > MANY:
        out.append(
            f"count classes ({len(cc)}): "
            + "; ".join(c.words() for c in cc[:8])
            + (f"; {len(cc) - 8} more" if len(cc) > 8 else "")
        )
    sc = report.stack_classes()
    if sc and (1 < len(sc) < len(report.stacks) or len(report.stacks) > MANY):
        from hctool.consensus.classes import tree, tree_lines

        out.append(f"stack classes ({len(sc)}), odd first:")
        out += [f"  {c.words()}" for c in sc[:8]]
        if len(report.stacks) > MANY:
            out.append("merged (ranks per frame, outermost first):")
            out += [f"  {line}" for line in tree_lines(tree(sc))[:24]]
    return out


def counts_line(report: Report | dict) -> str:
    """One line of evidence: what each rank was seen calling."""
    parts = []
    counts = report.counts if isinstance(report, Report) else report.get("counts", {})
    for rank, ops in counts.items():
        total = sum(ops.values())
        detail = ", ".join(f"{n} {op}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1]))
        parts.append(f"rank {rank}: {total}" + (f" ({detail})" if detail else ""))
    return "counts: " + ("; ".join(parts) if parts else "no calls recorded")


def probe_cell(entry: RankCall | dict) -> str:
    """`loading_check (probe) from _process_hicache_local_restores:285`"""
    p = entry.probe if isinstance(entry, RankCall) else entry.get("probe")
    return f"{p['name']} (probe) from {p['caller']}" if p else "-"


def pairings_line(report: Report | dict, shown: int = 3) -> str | None:
    """Calls that paired across call sites, and whether each was judged legitimate."""
    pairings = report.cross_site_pairings if isinstance(report, Report) else report.get("cross_site_pairings") or []
    if not pairings:
        return None
    legit = sum(p["legitimate"] for p in pairings)
    parts = [
        f"{p['group']} seq {p['seq']}"
        + (f" (x{p['count']})" if p["count"] > 1 else "")
        + ": "
        + " / ".join(f"rank {r} {e['site']}" for r, e in p["ranks"].items())
        + ("" if p["legitimate"] else " [the divergence]")
        for p in pairings[:shown]
    ]
    more = f"; {len(pairings) - shown} more" if len(pairings) > shown else ""
    return f"cross-site pairings: {len(pairings)}, {legit} legitimate: " + "; ".join(parts) + more


def cycle_line(first: Divergence | dict) -> str | None:
    """Every rank of a wait cycle and the call it waits in."""
    cycle = first.cycle if isinstance(first, Divergence) else first.get("cycle") or []
    if not cycle:
        return None
    return "ranks in the cycle: " + "; ".join(
        f"rank {e['rank']} in {e['group']} seq {e['seq']} at {e['site']}" for e in cycle
    )


def render(report: Report, console: Console, label: str | None = None) -> None:
    """Verdict and cause first (the line to fix and the rank that deviated), then the symptom,
    the evidence of what was checked, the per-rank table and the stacks. label: the word a runner
    uses for the verdict (repro's `deadlocked`), in place of the consensus one."""
    verdict = report.verdict.value
    line = Text(f"{(label or verdict).upper()}", style=_VERDICT_STYLE.get(verdict, "bold yellow"))
    first = report.first_divergence
    if first:
        line.append(f"  {first.cause_line()}", style="bold")
    elif report.reason:
        line.append(f"  {report.reason}", style="default")
    else:
        line.append(f"  {report.world_size} rank(s), every call agreed", style="default")
    console.print(line, soft_wrap=True)
    if first:
        if first.symptom_line():
            console.print(Text(first.symptom_line()), soft_wrap=True)
        sure = (
            f"confidence {first.confidence.value}: {first.basis}"
            if first.basis
            else f"confidence {first.confidence.value}"
        )
        if first.alternative:
            sure += f" (the other reading: {first.alternative})"
        console.print(Text(sure, style="dim"), soft_wrap=True)
        console.print(
            Text(
                f"first divergence: group {first.group}, seq {first.seq}, kind {first.kind.value}, "
                f"culprit rank(s) {', '.join(map(str, first.culprit_ranks))}",
                style="dim",
            ),
            soft_wrap=True,
        )
    if first and first.deadlock:
        console.print(Text(f"wait cycle across groups: {first.deadlock}", style="bold red"), soft_wrap=True)
        if cycle_line(first):
            console.print(Text(cycle_line(first)), soft_wrap=True)
    if len(report.counts) <= MANY:
        console.print(Text(counts_line(report), style="dim"), soft_wrap=True)
    for line in classes_lines(report):
        console.print(Text(line, style="dim"), soft_wrap=True)
    if pairings_line(report):
        console.print(Text(pairings_line(report), style="dim"), soft_wrap=True)
    for entry in report.incomplete:
        console.print(Text(describe(entry), style="bold yellow"), soft_wrap=True)
    codes_map = report.exit_codes or {}
    if (codes_map and (report.incomplete or any(c for c in codes_map.values()))) or report.command_exit_code:
        codes = ", ".join(f"rank {r}: {c}" for r, c in codes_map.items())
        if report.command_exit_code:
            codes = f"command: {report.command_exit_code}" + (f", {codes}" if codes else "")
        console.print(Text(f"exit codes: {codes}"))
    if first:
        table = Table(show_lines=False)
        probed = any(e.probe for e in first.ranks.values())
        for col in ("rank", "state", "call", "call site", "callers", *(("last probe",) if probed else ())):
            table.add_column(col, overflow="fold")
        for rank, e in first.ranks.items():
            style = "red" if rank in first.culprit_ranks else None
            probe = (probe_cell(e),) if probed else ()
            if e.state == "absent":
                table.add_row(
                    str(rank), "absent", "-", f"last: {e.last_seen}" if e.last_seen else "-", "-", *probe, style=style
                )
                continue
            table.add_row(str(rank), e.state, e.describe(), e.site or "-", _chain(e) or "-", *probe, style=style)
        console.print(table)
    if report.faults:
        console.print(
            Text("faults: " + "; ".join(faultcounts.describe(f) for f in report.faults), style="dim"),
            soft_wrap=True,
        )
    shown = report.stacks
    if len(shown) > MANY:  # one rank of each stack class: the classes above say which ranks share it
        reps = {str(c.ranks[0]) for c in report.stack_classes()}
        shown = {r: t for r, t in shown.items() if r in reps}
    for rank, text in sorted(shown.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        console.print(Text(f"--- stack of rank {rank} ---", style="bold"))
        console.print(Text(text))
