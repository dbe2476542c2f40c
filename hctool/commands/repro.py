"""`hctool repro list | ID`: reproduce known incidents and show each variant's verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from typer.core import TyperGroup

from hctool.console import log
from hctool.console.errors import UsageError
from hctool.console.runs import new_run_folder
from hctool.report import write_run_report
from hctool.supervise import runlock


class _ReproGroup(TyperGroup):
    """`hctool repro 30760` means `hctool repro run 30760`."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=_ReproGroup, no_args_is_help=True, help="Reproduce known incidents (hctool repro list; hctool repro ID)."
)

CatalogueOpt = typer.Option([], "--catalogue", help="Also load scenarios from this folder (<id>/scenario.toml).")


def _catalogue(dirs: list[Path]):
    from hctool.repro.catalogue import load_catalogue
    from hctool.repro.scenario import ScenarioError

    try:
        return load_catalogue(dirs)
    except ScenarioError as exc:
        raise UsageError(str(exc), "fix the scenario file, see docs/repros.md") from None


def _rate(measured: dict | None) -> str:
    if not measured:
        return "-"
    return f"{measured['as_expected']}/{measured['runs']}" + (f" ({measured['date']})" if measured["date"] else "")


@app.command("list")
def list_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON only."), catalogue: list[Path] = CatalogueOpt
) -> None:
    """List the incidents: id, title, upstream refs, topology, variants and the last measured rate of each."""
    entries = [
        {
            "id": s.id,
            "title": s.title,
            "upstream": s.upstream,
            "topology": {"prefill_tp": s.prefill_tp, "decode_tp": s.tp} if s.pd else {"tp": s.tp},
            "faults": [f.spec() for f in s.faults],
            "variants": [
                {
                    "name": v.name,
                    "expected": list(v.expected),
                    "description": v.description,
                    "mechanism": v.mechanism.describe() if v.mechanism else None,
                    "measured": v.measured,
                }
                for v in s.variants
            ],
            "path": str(s.path),
        }
        for s in _catalogue(catalogue).values()
    ]
    if as_json:
        print(json.dumps(entries, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in ("id", "title", "upstream", "TP", "variants: expected [measured]"):
        table.add_column(col, overflow="fold")
    for e in entries:
        up = e["upstream"]
        refs = " ".join([f"#{i}" for i in up.get("issues", [])] + [f"PR #{p}" for p in up.get("prs", [])])
        table.add_row(
            e["id"],
            e["title"],
            f"{up.get('project', '')} {refs}".strip(),
            _topology_cell(e["topology"]),
            "\n".join(f"{v['name']}: {' | '.join(v['expected'])} [{_rate(v['measured'])}]" for v in e["variants"]),
        )
    Console().print(table)


def _parse_shard(text: str) -> tuple[int, int]:
    i, _, n = text.partition("/")
    try:
        i, n = int(i), int(n)
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise UsageError(f"--shard {text!r} must be i/N with 1 <= i <= N", "e.g. --shard 1/4")
    return i, n


def shard_ids(ids: list[str], shard: tuple[int, int]) -> list[str]:
    """Deterministic split: the sorted ids, every N-th starting at i (no coordinator)."""
    i, n = shard
    return sorted(ids)[i - 1 :: n]


RunsOpt = typer.Option(1, "--runs", min=1, help="Repeat every variant K times and count the reproductions.")
TimeoutOpt = typer.Option(None, "--timeout", help="Seconds a variant's workload may take (default: the scenario's).")
CudaOpt = typer.Option(
    False,
    "--cuda",
    help="The model and KV pools on GPUs (NCCL for the model's group with a GPU "
    "per rank; gloo on CUDA tensors where ranks share one); same verdicts and JSON.",
)


def _device(cuda: bool) -> str:
    if not cuda:
        return "cpu"
    import torch  # only for --cuda: the CLI stays light otherwise

    if not torch.cuda.is_available():
        raise UsageError("--cuda but torch sees no CUDA device", "run without --cuda, or on a machine with a GPU")
    return "cuda"


@app.command("run")
def run_cmd(
    incident: str = typer.Argument(..., metavar="ID", help="Incident id, e.g. 30760 (see `hctool repro list`)."),
    variant: list[str] = typer.Option([], "--variant", help="Run only this variant (repeatable)."),
    tp: int = typer.Option(None, "--tp", help="Tensor-parallel ranks (default: the scenario's)."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON report on stdout."),
    artifacts: Path = typer.Option(None, "--artifacts", help="Run directory (default ./hctool-runs/repro-ID-TIME)."),
    timeout: float = TimeoutOpt,
    runs: int = RunsOpt,
    catalogue: list[Path] = CatalogueOpt,
    cuda: bool = CudaOpt,
) -> None:
    """Run every variant (or the chosen ones) of one incident; exit 0 iff each verdict is an expected one."""
    from hctool.supervise.procs import sigterm_as_interrupt

    scenarios = _catalogue(catalogue)
    if incident not in scenarios:
        raise UsageError(
            f"no incident {incident!r} in the catalogue",
            f"known: {', '.join(sorted(scenarios))}; see `hctool repro list`",
        )
    scenario = scenarios[incident]
    names = [v.name for v in scenario.variants]
    unknown = [v for v in variant if v not in names]
    if unknown:
        raise UsageError(f"incident {incident} has no variant {unknown[0]!r}", f"variants: {', '.join(names)}")
    if tp is not None and (tp < 1 or scenario.server_args(scenario.variants[0]).model.num_heads % tp):
        raise UsageError(f"--tp {tp} must be a positive divisor of the model's heads", "try --tp 1, 2 or 4")
    device = _device(cuda)  # no GPU: refused before a folder is made
    root = artifacts or new_run_folder("repro", f"repro-{incident}")  # kept out of git, pruned (console/runs.py)
    log.info(f"repro {incident}: artifacts in {root}")
    runlock.claim(root, f"repro {incident}")  # one run per folder: refused if another holds it
    with sigterm_as_interrupt():
        result = _run(scenario, [scenario.variant(n) for n in (variant or names)], root, tp, runs, timeout, device)
    write_run_report(root, result)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        _render(result)
    raise typer.Exit(0 if all(v["ok"] for v in result["variants"]) else 1)


def _topology_cell(t: dict) -> str:
    return f"PD: prefill TP{t['prefill_tp']} + decode TP{t['decode_tp']}" if "decode_tp" in t else str(t["tp"])


@app.command("all")
def all_cmd(
    shard: str = typer.Option("1/1", "--shard", help="i/N: run this machine's share of the incidents."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON report on stdout."),
    artifacts: Path = typer.Option(None, "--artifacts", help="Run directory (default ./hctool-runs/repro-all-TIME)."),
    timeout: float = TimeoutOpt,
    runs: int = RunsOpt,
    catalogue: list[Path] = CatalogueOpt,
    cuda: bool = CudaOpt,
) -> None:
    """Run every incident of the catalogue (or one shard of it) and print one table; exit 0 iff all as expected."""
    from hctool.supervise.procs import sigterm_as_interrupt

    device = _device(cuda)
    part = _parse_shard(shard)
    scenarios = _catalogue(catalogue)
    ids = shard_ids(list(scenarios), part)
    root = artifacts or new_run_folder("repro", "repro-all")
    log.info(f"repro all (shard {part[0]}/{part[1]}: {', '.join(ids) or 'nothing'}): artifacts in {root}")
    runlock.claim(root, "repro all")  # one run per folder: refused if another holds it
    results = []
    with sigterm_as_interrupt():
        for sid in ids:
            s = scenarios[sid]
            results.append(_run(s, list(s.variants), root / sid, None, runs, timeout, device))
    ok = all(v["ok"] for r in results for v in r["variants"])
    write_run_report(root, {"shard": f"{part[0]}/{part[1]}", "ok": ok, "incidents": results})
    if as_json:
        print(json.dumps({"shard": f"{part[0]}/{part[1]}", "ok": ok, "incidents": results}, indent=2))
    else:
        _render_all(results, root)
    raise typer.Exit(0 if ok else 1)


def _run(scenario, variants, root: Path, tp, runs: int, timeout, device: str = "cpu") -> dict:
    from hctool.repro.harness import HarnessOptions, ReproHarness

    harness = ReproHarness(scenario, HarnessOptions(artifacts=root, tp=tp, runs=runs, timeout=timeout, device=device))
    return harness.run(variants)


def _verdict_cell(v: dict) -> str:
    return v["verdict"] if "runs" not in v else f"{v['verdict']} ({v['ok_runs']}/{v['runs']} as expected)"


def _mechanism_cell(v: dict) -> str:
    m = v.get("mechanism")
    if not m:
        return "-"
    return ("seen" if m["seen"] else "NOT seen") + "\n" + "\n".join(m["evidence"])


def _render_all(results: list[dict], root: Path) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="hctool repro all")
    for col in ("incident", "variant", "expected", "verdict", "ok", "mechanism", "requests", "seconds"):
        table.add_column(col, overflow="fold")
    for r in results:
        for v in r["variants"]:
            req = v["requests"]
            cells = (
                r["id"],
                v["name"],
                " | ".join(v["expected"]),
                _verdict_cell(v),
                "yes" if v["ok"] else "NO",
                _mechanism_cell(v),
                f"{req['succeeded']}/{req['sent']}",
                f"{v['seconds']:.1f}",
            )
            # as text, never as markup: a reason quotes gloo's "[/path/pair.cc:537]", which rich
            # took for a closing tag and failed the whole command on
            table.add_row(*map(Text, cells), style=None if v["ok"] else "red")
    console.print(table)
    console.print(f"artifacts: {root}", markup=False)


def _site_cell(fd: dict | None) -> str:
    """The cause and the culprit first, then where each rank stopped."""
    from hctool.consensus.model import Divergence, ReportError

    if not fd:
        return "-"
    try:
        first = Divergence.from_json(fd)
    except ReportError as exc:
        return f"(unreadable: {exc})"
    return "\n".join([first.cause_line(), first.symptom_line()]).strip()


def variant_table(result: dict):
    """The variant table of `hctool repro ID` (README.md shows one: tests/test_readme.py)."""
    from rich.table import Table
    from rich.text import Text

    table = Table()
    for col in ("variant", "expected", "verdict", "ok", "mechanism", "requests", "seconds", "first divergence"):
        table.add_column(col, overflow="fold")
    for v in result["variants"]:
        req = v["requests"]
        cells = (
            v["name"],
            " | ".join(v["expected"]),
            _verdict_cell(v),
            "yes" if v["ok"] else "NO",
            _mechanism_cell(v),
            f"{req['succeeded']}/{req['sent']}",
            f"{v['seconds']:.1f}",
            _site_cell(v["first_divergence"]),
        )
        table.add_row(*map(Text, cells), style=None if v["ok"] else "red")  # text, never markup (see above)
    return table


def _render(result: dict) -> None:
    from rich.console import Console
    from rich.text import Text

    from hctool.consensus.model import Divergence, Report, Verdict
    from hctool.consensus.report import render
    from hctool.protocol import faultcounts

    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(Text(f"{result['id']}: {result['title']}", style="bold"))
    console.print(variant_table(result))
    for v in result["variants"]:
        if v.get("faults"):  # how often each fault fired, as check-consensus says it
            fired = "; ".join(faultcounts.describe(f) for f in v["faults"])
            console.print(Text(f"{v['name']}: faults: {fired}", style="dim"), soft_wrap=True)
    for v in result["variants"]:
        sd = v.get("state_divergence")
        if sd:
            console.print(
                Text(
                    f"\n{v['name']}: replicated state first differs in {sd['field']} at tick {sd['tick']}"
                    f" (differing: {', '.join(sd['differing_fields'])})",
                    style="bold",
                )
            )
            for rank, value in sd["ranks"].items():
                console.print(f"  rank {rank}: {value}", markup=False)
        if v["first_divergence"] or v["stacks"]:
            console.print(Text(f"\n{v['name']}: {v['verdict']}: {v.get('reason', '')}", style="bold"))
            fd = Divergence.from_json(v["first_divergence"]) if v["first_divergence"] else None
            report = Report(
                Verdict.DIVERGED if fd else Verdict.HUNG,
                len(fd.ranks) if fd else 0,
                fd,
                _main_threads(v["stacks"]),
                v.get("counts", {}),
            )
            render(report, console, label=v["verdict"])
    console.print(f"artifacts: {result['artifacts']}", markup=False)


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
