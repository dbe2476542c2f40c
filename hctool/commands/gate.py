"""`hctool gate`: lint, multi-rank tests, repro smoke and chaos in one CI command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from hctool.console.errors import UsageError
from hctool.console.runs import RUNS_DIR, new_run_folder


def register(app: typer.Typer) -> None:
    @app.command("gate")
    def gate_command(
        junit: Path | None = typer.Option(
            None,
            "--junit",
            help="Write JUnit XML here (one test case per lint finding, test, repro variant, chaos anomaly).",
        ),
        sarif: Path | None = typer.Option(None, "--sarif", help="Write the lint findings as SARIF 2.1.0 here."),
        changed_since: str | None = typer.Option(
            None, "--changed-since", metavar="REF", help="Lint only lines changed since this git ref."
        ),
        config: Path = typer.Option(
            Path("pyproject.toml"),
            "--config",
            help="pyproject.toml with a tool.hctool.gate table; steps run from its folder.",
        ),
        only: list[str] | None = typer.Option(
            None, "--only", help="Run only this step (repeatable): lint, tests, repro, chaos."
        ),
        skip: list[str] | None = typer.Option(None, "--skip", help="Skip this step (repeatable)."),
        artifacts: Path | None = typer.Option(
            None, "--artifacts", help="Folder for step logs and repro runs (default ./hctool-runs/gate-TIME)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print only a JSON summary on stdout."),
    ) -> None:
        """Run the steps of pyproject.toml's tool.hctool.gate table; exit 0 clean, 1 findings, 2 a step could not run.

        Every step has a deadline (tool.hctool.gate.timeouts) and leaves no process behind.
        Under GITHUB_ACTIONS=true the findings are printed as workflow annotations.
        """
        from hctool.console import log, progress
        from hctool.gate.config import STEPS, load_gate_config
        from hctool.gate.report import github_annotations, markdown_summary, print_table, write_junit, write_sarif
        from hctool.gate.run import become_subreaper, reap_leftovers
        from hctool.gate.steps import ERROR, FAILED, chaos_step, lint_step, repro_step, tests_step
        from hctool.supervise.procs import sigterm_as_interrupt

        for name in (only or []) + (skip or []):
            if name not in STEPS:
                raise UsageError(f"unknown step {name!r}", f"steps: {', '.join(STEPS)}")
        cfg = load_gate_config(config.resolve())
        steps = [s for s in cfg.steps() if (not only or s in only) and s not in (skip or [])]
        if not steps:
            raise UsageError("no step to run", "configure lint, tests, repro or chaos in [tool.hctool.gate]")
        work = (artifacts or new_run_folder("gate", root=cfg.root / RUNS_DIR)).resolve()  # console/runs.py
        runners = {
            "lint": lambda t: lint_step(cfg, work, changed_since, t),
            "tests": lambda t: tests_step(cfg, work, t),
            "repro": lambda t: repro_step(cfg, work, t),
            "chaos": lambda t: chaos_step(cfg, work, t),
        }
        become_subreaper()
        results = []
        with sigterm_as_interrupt(), progress.task("hctool gate", total=len(steps)) as bar:
            try:
                for k, name in enumerate(steps):
                    bar.update(completed=k, text=f"step {k + 1}/{len(steps)}: {name}")
                    log.info(f"hctool gate: {name} (deadline {cfg.timeout(name):.0f} s) ...")
                    results.append(runners[name](cfg.timeout(name)))
                    left = reap_leftovers()
                    if left:
                        log.info(f"hctool gate: {name} left {len(left)} process(es) running; ended: {left}")
                    log.info(f"hctool gate: {name}: {results[-1].status}, {results[-1].summary}")
                bar.update(completed=len(steps))
            finally:
                reap_leftovers()
        states = {r.status for r in results}
        code = 2 if ERROR in states else 1 if FAILED in states else 0
        if junit:
            write_junit(results, junit)
        if sarif:
            write_sarif(results, sarif)
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
                f.write(markdown_summary(results, code))
        if as_json:
            print(
                json.dumps(
                    {
                        "exit_code": code,
                        "artifacts": str(work),
                        "steps": [
                            {
                                "name": r.name,
                                "status": r.status,
                                "seconds": round(r.seconds, 2),
                                "summary": r.summary,
                                "cases": [c._asdict() for c in r.cases],
                            }
                            for r in results
                        ],
                    },
                    indent=2,
                )
            )
        elif os.environ.get("GITHUB_ACTIONS") == "true":
            print("\n".join(github_annotations(results)))
            print(markdown_summary(results, code))
        else:
            from rich.console import Console

            print_table(results, code, Console())
        raise typer.Exit(code)
