"""Rich rendering of a check-consensus report (the JSON stays the data)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hctool.consensus.truncation import describe

_VERDICT_STYLE = {"consistent": "bold green", "diverged": "bold red", "hung": "bold yellow", "crashed": "bold red"}


def _chain(entry: dict) -> str:
    # "check_prefetch_progress <- get_new_batch_prefill": the call site's function and its callers
    names = [s.rsplit(" ", 1)[-1] for s in entry.get("stack", [])[:3]]
    return " <- ".join(names)


def counts_line(report: dict) -> str:
    """One line of evidence: what each rank was seen calling."""
    parts = []
    for rank, ops in report.get("counts", {}).items():
        total = sum(ops.values())
        detail = ", ".join(f"{n} {op}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1]))
        parts.append(f"rank {rank}: {total}" + (f" ({detail})" if detail else ""))
    return "counts: " + ("; ".join(parts) if parts else "no calls recorded")


def probe_cell(entry: dict) -> str:
    """`loading_check (probe) from _process_hicache_local_restores:285`"""
    p = entry.get("probe")
    return f"{p['name']} (probe) from {p['caller']}" if p else "-"


def pairings_line(report: dict, shown: int = 3) -> str | None:
    """Calls that paired across call sites, and whether each was judged legitimate."""
    pairings = report.get("cross_site_pairings") or []
    if not pairings:
        return None
    legit = sum(p["legitimate"] for p in pairings)
    parts = [f"{p['group']} seq {p['seq']}" + (f" (x{p['count']})" if p["count"] > 1 else "") + ": "
             + " / ".join(f"rank {r} {e['site']}" for r, e in p["ranks"].items())
             + ("" if p["legitimate"] else " [the divergence]") for p in pairings[:shown]]
    more = f"; {len(pairings) - shown} more" if len(pairings) > shown else ""
    return f"cross-site pairings: {len(pairings)}, {legit} legitimate: " + "; ".join(parts) + more


def cycle_line(first: dict) -> str | None:
    """Every rank of a wait cycle and the call it waits in."""
    cycle = first.get("cycle") or []
    if not cycle:
        return None
    return "ranks in the cycle: " + "; ".join(f"rank {e['rank']} in {e['group']} seq {e['seq']} at {e['site']}"
                                               for e in cycle)


def render(report: dict, console: Console) -> None:
    verdict = report["verdict"]
    line = Text(f"{verdict.upper()}", style=_VERDICT_STYLE.get(verdict, "bold"))
    first = report.get("first_divergence")
    if first:
        line.append(f"  first divergence: group {first['group']}, seq {first['seq']}, kind {first['kind']}, "
                    f"culprit rank(s) {', '.join(map(str, first['culprit_ranks']))}", style="default")
    else:
        line.append(f"  {report['world_size']} rank(s), no divergent collective", style="default")
    console.print(line)
    if first and first.get("deadlock"):
        console.print(Text(f"wait cycle across groups: {first['deadlock']}", style="bold red"), soft_wrap=True)
        if cycle_line(first):
            console.print(Text(cycle_line(first)), soft_wrap=True)
    console.print(Text(counts_line(report), style="dim"), soft_wrap=True)
    if pairings_line(report):
        console.print(Text(pairings_line(report), style="dim"), soft_wrap=True)
    for entry in report.get("incomplete", []):
        console.print(Text(describe(entry), style="bold yellow"), soft_wrap=True)
    if (report.get("exit_codes") and (report.get("incomplete") or any(c for c in report["exit_codes"].values()))
            or report.get("command_exit_code")):
        codes = ", ".join(f"rank {r}: {c}" for r, c in report.get("exit_codes", {}).items())
        if report.get("command_exit_code"):
            codes = f"command: {report['command_exit_code']}" + (f", {codes}" if codes else "")
        console.print(Text(f"exit codes: {codes}"))
    if first:
        table = Table(show_lines=False)
        probed = any(e.get("probe") for e in first["ranks"].values())
        for col in ("rank", "state", "call", "call site", "callers", *(("last probe",) if probed else ())):
            table.add_column(col, overflow="fold")
        for rank, e in first["ranks"].items():
            style = "red" if int(rank) in first["culprit_ranks"] else None
            if e["state"] == "absent":
                table.add_row(rank, "absent", "-", e.get("last_seen", "-") and f"last: {e.get('last_seen', '-')}", "-",
                              *((probe_cell(e),) if probed else ()), style=style)
                continue
            call = f"{e['op']} {e['shapes']} {','.join(e['dtypes'])}"
            if e["reduce_op"]:
                call += f" op={e['reduce_op']}"
            if e["root"] is not None:
                call += f" root/peer={e['root']}"
            if e["label"]:
                call += f" label={e['label']!r}"
            table.add_row(rank, e["state"], call, e["site"] or "-", _chain(e) or "-",
                          *((probe_cell(e),) if probed else ()), style=style)
        console.print(table)
    if report.get("faults"):
        console.print(Text("faults: " + "; ".join(
            f"{f['spec']} fired {f['total']}x" + (f" ({', '.join(f'rank {r}: {n}' for r, n in sorted(f['fired'].items()))})"
                                                   if f["total"] else " (never fired)")
            for f in report["faults"]), style="dim"), soft_wrap=True)
    for rank, text in sorted(report.get("stacks", {}).items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        console.print(Text(f"--- stack of rank {rank} ---", style="bold"))
        console.print(Text(text))
