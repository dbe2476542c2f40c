"""`hctool repro list | ID`: reproduce known incidents and show each variant's verdict."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer
from typer.core import TyperGroup

from hctool.errors import UsageError


class _ReproGroup(TyperGroup):
    """`hctool repro 30760` means `hctool repro run 30760`."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().resolve_command(ctx, args)


app = typer.Typer(cls=_ReproGroup, no_args_is_help=True,
                  help="Reproduce known incidents (hctool repro list; hctool repro ID).")

CatalogueOpt = typer.Option([], "--catalogue", help="Also load scenarios from this folder (<id>/scenario.toml).")


def _catalogue(dirs: list[Path]):
    from hctool.repro.catalogue import load_catalogue
    from hctool.repro.scenario import ScenarioError
    try:
        return load_catalogue(dirs)
    except ScenarioError as exc:
        raise UsageError(str(exc), "fix the scenario file, see docs/repros.md") from None


@app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON only."),
             catalogue: list[Path] = CatalogueOpt) -> None:
    """List the incidents in the catalogue."""
    entries = [{"id": s.id, "title": s.title, "upstream": s.upstream, "topology": {"prefill_tp": s.prefill_tp, "decode_tp": s.tp} if s.pd else {"tp": s.tp},
                "faults": list(s.faults),
                "variants": [{"name": v.name, "expected": list(v.expected), "description": v.description}
                             for v in s.variants], "path": str(s.path)}
               for s in _catalogue(catalogue).values()]
    if as_json:
        print(json.dumps(entries, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    table = Table()
    for col in ("id", "title", "upstream", "TP", "variants (expected)"):
        table.add_column(col, overflow="fold")
    for e in entries:
        up = e["upstream"]
        refs = " ".join([f"#{i}" for i in up.get("issues", [])] + [f"PR #{p}" for p in up.get("prs", [])])
        table.add_row(e["id"], e["title"], f"{up.get('project', '')} {refs}".strip(), _topology_cell(e["topology"]),
                      "\n".join(f"{v['name']}: {' | '.join(v['expected'])}" for v in e["variants"]))
    Console().print(table)


@app.command("run")
def run_cmd(
    incident: str = typer.Argument(..., metavar="ID", help="Incident id, e.g. 30760 (see `hctool repro list`)."),
    variant: list[str] = typer.Option([], "--variant", help="Run only this variant (repeatable)."),
    tp: int = typer.Option(None, "--tp", help="Tensor-parallel ranks (default: the scenario's)."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON report on stdout."),
    artifacts: Path = typer.Option(None, "--artifacts", help="Run directory (default ./hctool-runs/repro-ID-TIME)."),
    timeout: float = typer.Option(None, "--timeout", help="Seconds a variant's workload may take (default: the scenario's)."),
    runs: int = typer.Option(1, "--runs", min=1, help="Repeat every variant K times and count the reproductions."),
    catalogue: list[Path] = CatalogueOpt,
) -> None:
    """Run every variant (or the chosen ones) of one incident; exit 0 iff each verdict is an expected one."""
    from hctool.procs import sigterm_as_interrupt
    from hctool.repro.harness import HarnessOptions, ReproHarness

    scenarios = _catalogue(catalogue)
    if incident not in scenarios:
        raise UsageError(f"no incident {incident!r} in the catalogue", f"known: {', '.join(sorted(scenarios))}; see `hctool repro list`")
    scenario = scenarios[incident]
    names = [v.name for v in scenario.variants]
    unknown = [v for v in variant if v not in names]
    if unknown:
        raise UsageError(f"incident {incident} has no variant {unknown[0]!r}", f"variants: {', '.join(names)}")
    if tp is not None and (tp < 1 or scenario.server_args(scenario.variants[0]).model.num_heads % tp):
        raise UsageError(f"--tp {tp} must be a positive divisor of the model's heads", "try --tp 1, 2 or 4")
    chosen = [scenario.variant(n) for n in (variant or names)]
    root = artifacts or Path("hctool-runs") / f"repro-{incident}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    print(f"repro {incident}: artifacts in {root}", file=sys.stderr)
    harness = ReproHarness(scenario, HarnessOptions(artifacts=root, tp=tp, runs=runs, timeout=timeout))
    with sigterm_as_interrupt():
        result = harness.run(chosen)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        _render(result)
    raise typer.Exit(0 if all(v["ok"] for v in result["variants"]) else 1)


def _topology_cell(t: dict) -> str:
    return f"PD: prefill TP{t['prefill_tp']} + decode TP{t['decode_tp']}" if "decode_tp" in t else str(t["tp"])


def _site_cell(fd: dict | None) -> str:
    if not fd:
        return "-"
    return "\n".join(f"rank {r}: {e.get('op') or 'absent'} @ {e.get('site') or e.get('last_seen') or '-'}"
                     f"{' (' + e['function'] + ')' if e.get('function') else ''}"
                     for r, e in sorted(fd["ranks"].items()))


def _render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from hctool.consensus.report import render

    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(Text(f"{result['id']}: {result['title']}", style="bold"))
    table = Table()
    for col in ("variant", "expected", "verdict", "ok", "requests", "seconds", "first divergence"):
        table.add_column(col, overflow="fold")
    for v in result["variants"]:
        verdict = v["verdict"] if "runs" not in v else f"{v['verdict']} ({v['ok_runs']}/{v['runs']} as expected)"
        req = v["requests"]
        table.add_row(v["name"], " | ".join(v["expected"]), verdict, "yes" if v["ok"] else "NO",
                      f"{req['succeeded']}/{req['sent']}", f"{v['seconds']:.1f}", _site_cell(v["first_divergence"]),
                      style=None if v["ok"] else "red")
    console.print(table)
    for v in result["variants"]:
        if v["first_divergence"] or v["stacks"]:
            console.print(Text(f"\n{v['name']}: {v['verdict']}: {v.get('reason', '')}", style="bold"))
            report = {"verdict": v["verdict"], "world_size": len(v["first_divergence"]["ranks"]) if v["first_divergence"] else 0,
                      "first_divergence": v["first_divergence"], "stacks": _main_threads(v["stacks"])}
            render(report, console)
    console.print(f"artifacts: {result['artifacts']}")


def _main_threads(stacks: dict) -> dict:
    """Only each rank's main thread: the full dumps are in the artifacts."""
    out = {}
    for rank, text in stacks.items():
        lines, keep = text.splitlines(), []
        for line in lines:
            if line.startswith("Thread ") and keep:
                break
            if line.startswith("Thread ") or keep:
                keep.append(line)
        out[rank] = "\n".join(keep[:14]) or text[:1000]
    return out


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="repro")
