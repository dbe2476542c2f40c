"""The published JSON Schemas of every `--json` document (docs/schemas/, docs/contracts.md): made
from the typed models and current, and every command's output, run as a user runs it, valid
against its schema. The schemas are closed (a key no model names fails), so a producer that
drops, renames or adds a field fails here until its model and docs/schemas/ say so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import jsonschema
import pytest
import typer

from hctool.commands.schema import SCHEMAS, schema_text

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO / "docs" / "schemas"
CONSENSUS_PROGRAMS = REPO / "tests" / "consensus" / "programs"
CHAOS_PROGRAMS = REPO / "tests" / "chaos" / "programs"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

# every command with a --json option, and the schema of what it prints
JSON_COMMANDS = {
    "check-consensus run": "check-consensus",
    "check-consensus analyze": "check-consensus",
    "repro list": "repro-list",
    "repro run": "repro",
    "repro all": "repro-all",
    "lint": "lint",
    "chaos run": "chaos",
    "chaos explore": "chaos",
    "chaos shrink": "chaos",
    "chaos merge": "chaos",
    "gate": "gate",
}


def validate(name: str, document: object) -> None:
    """Against the file as published (not a schema made afresh: users read the file)."""
    schema = json.loads((PUBLISHED / f"{name}.schema.json").read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(document), key=lambda e: list(e.path))
    # an anyOf (a value or null, a report or a baseline failure) fails as a whole: show each branch's errors
    errors = [c for e in errors for c in (e.context or [e])]
    assert not errors, f"{name}: " + "\n".join(f"{list(e.absolute_path)}: {e.message[:200]}" for e in errors[:12])


def hctool(*args: str, cwd: Path, timeout: float = 240) -> tuple[int, object, str]:
    """`hctool ARGS` in a real process: (exit code, stdout parsed as one JSON document, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        raise AssertionError(
            f"stdout is not one JSON document: {proc.stdout[:2000]!r}\n{proc.stderr[-3000:]}"
        ) from None


# -- the schemas themselves ---------------------------------------------------------------------


def test_published_schemas_are_the_ones_the_models_make():
    stale = [n for n in SCHEMAS if (PUBLISHED / f"{n}.schema.json").read_text() != schema_text(n)]
    assert stale == [], f"stale: {stale}; regenerate with `hctool schema --write docs/schemas`"
    assert sorted(p.name for p in PUBLISHED.iterdir()) == sorted(f"{n}.schema.json" for n in SCHEMAS)


def test_every_command_with_json_output_has_a_schema():
    def walk(command, path: str):  # typer's own click: a group has commands, an option opts
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, f"{path} {name}".strip())
        elif any("--json" in getattr(p, "opts", ()) for p in command.params):
            yield path

    from hctool.cli import app

    assert sorted(walk(typer.main.get_command(app), "")) == sorted(JSON_COMMANDS)
    assert set(JSON_COMMANDS.values()) == set(SCHEMAS)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_schema_is_a_valid_closed_draft_2020_12_schema(name):
    schema = json.loads((PUBLISHED / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    objects = [d for d in schema.get("$defs", {}).values() if d.get("type") == "object"]
    assert objects and all(d["additionalProperties"] is False for d in objects if "properties" in d)


def test_the_schema_command_is_the_published_file(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hctool", "schema", "gate"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == (PUBLISHED / "gate.schema.json").read_text()
    proc = subprocess.run([sys.executable, "-m", "hctool", "schema", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("Error: no schema named 'nope'\n")
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_hand_kept_enums_of_the_models_match_their_sources():
    """Where a model lists values that live elsewhere as a tuple, the two stay one."""
    from dataclasses import fields

    from hctool.chaos import command, invariants
    from hctool.chaos.model import FaultJSON, FaultKindName, Invariant
    from hctool.gate import model as gate_model
    from hctool.gate import steps
    from hctool.lint import model as lint_model
    from hctool.lint.rules import RULES
    from hctool.lint.sources import LEVELS
    from hctool.protocol.faults import FAULT_KINDS, Fault
    from hctool.repro.model import ReproVerdict
    from hctool.repro.scenario import VERDICTS

    assert set(get_args(Invariant)) == set(invariants.CHECKERS) | set(command.COMMAND_CHECKERS)
    assert {k.value for k in FaultKindName} == set(FAULT_KINDS)
    # Fault.to_dict() writes every field but rank
    assert set(FaultJSON.__annotations__) == {f.name for f in fields(Fault)} - {"rank"}
    assert set(get_args(ReproVerdict)) == set(VERDICTS)
    assert set(get_args(lint_model.RuleCode)) == set(RULES)
    assert set(get_args(lint_model.Severity)) == set(LEVELS)
    assert set(get_args(gate_model.Status)) == {steps.PASSED, steps.FAILED, steps.ERROR, steps.SKIPPED}


def test_a_document_with_a_field_dropped_renamed_or_added_is_refused():
    """What makes the output checks below able to fail."""
    good = {"exit_code": 0, "artifacts": "a", "steps": []}
    validate("gate", good)
    for bad in ({"exit_code": 0, "artifacts": "a"}, {"exit_code": 0, "artefacts": "a", "steps": []}, dict(good, x=1)):
        with pytest.raises(AssertionError):
            validate("gate", bad)
    with pytest.raises(AssertionError):
        validate("gate", dict(good, exit_code=3))  # an enum is an enum


# -- every command's --json, as a user runs it ---------------------------------------------------


@pytest.mark.timeout(120)
def test_lint_json(tmp_path):
    fixture = REPO / "tests" / "lint" / "fixtures" / "corpus"  # every rule and role of a related line
    code, findings, err = hctool("lint", "--json", "--no-cache", str(fixture), cwd=tmp_path)
    assert code == 1 and findings, err[-2000:]
    assert any(f["related"] for f in findings)
    validate("lint", findings)
    code, same, _ = hctool("lint", "--format", "json", "--no-cache", str(fixture), cwd=tmp_path)
    assert same == findings


@pytest.mark.timeout(120)
def test_repro_list_and_an_empty_shard_of_repro_all(tmp_path):
    code, entries, err = hctool("repro", "list", "--json", cwd=tmp_path)
    assert code == 0 and entries, err[-2000:]
    validate("repro-list", entries)
    # a shard past the last incident runs nothing: the document's frame, in a second
    code, result, err = hctool(
        "repro", "all", "--shard", "99/99", "--json", "--artifacts", str(tmp_path / "all"), cwd=tmp_path
    )
    assert code == 0 and result["incidents"] == [], err[-2000:]
    validate("repro-all", result)


@pytest.mark.timeout(300)
def test_gate_json(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(REPO / "tests" / "fixtures" / "gate_project", project)
    code, summary, err = hctool("gate", "--only", "lint", "--json", "--artifacts", str(tmp_path / "gate"), cwd=project)
    assert code in (0, 1) and summary["steps"][0]["name"] == "lint", err[-2000:]
    validate("gate", summary)


@pytest.mark.timeout(180)
def test_check_consensus_run_and_analyze_json(tmp_path, no_leftover_processes):
    trace = tmp_path / "trace"
    code, report, err = hctool(
        "check-consensus",
        "run",
        "--nproc",
        "2",
        "--timeout",
        "60",
        "--json",
        "--trace-dir",
        str(trace),
        "--",
        str(CONSENSUS_PROGRAMS / "extra_same_shape.py"),
        cwd=tmp_path,
    )
    assert code == 1 and report["verdict"] == "diverged" and report["first_divergence"]["cause"], err[-3000:]
    validate("check-consensus", report)
    code, analyzed, err = hctool("check-consensus", "analyze", str(trace), "--json", cwd=tmp_path)
    assert code == 1 and analyzed["verdict"] == "diverged", err[-3000:]
    validate("check-consensus", analyzed)


# A program that times its own sleep: a fast clock on rank 1 (clock-skew gains ms per second)
# makes that rank exit 1, which chaos's `exits` invariant names, with no torch to start.
SLEEPER = """import sys
import time

t0 = time.monotonic()
time.sleep(0.3)
sys.exit(1 if time.monotonic() - t0 > 1.0 else 0)
"""
FAST_CLOCK = '[[faults]]\nkind = "clock-skew"\nrank = 1\nms = 5000\n'


@pytest.mark.timeout(120)
def test_chaos_run_and_merge_json(tmp_path, no_leftover_processes):
    """An anomaly found and replayed (the report's richest shape), then its report merged."""
    program, sched = tmp_path / "sleeper.py", tmp_path / "sched.toml"
    program.write_text(SLEEPER)
    sched.write_text(FAST_CLOCK)
    code, report, err = hctool(
        "chaos", "run", str(sched), "--json", "--artifacts", str(tmp_path / "run"), "--", str(program), cwd=tmp_path
    )
    assert code == 1 and report["anomalies"][0]["invariant"] == "exits", err[-3000:]
    validate("chaos", report)
    code, merged, err = hctool("chaos", "merge", str(tmp_path / "run" / "report.json"), "--json", cwd=tmp_path)
    assert code == 1 and merged["anomalies"] == report["anomalies"], err[-3000:]
    validate("chaos", merged)


@pytest.mark.timeout(120)
def test_chaos_json_of_a_program_that_fails_without_faults(tmp_path, no_leftover_processes):
    program = tmp_path / "fails.py"
    program.write_text("import sys\nsys.exit(3)\n")
    sched = tmp_path / "sched.toml"
    sched.write_text('[[faults]]\nkind = "clock-skew"\nrank = 1\nms = 500\n')
    code, report, err = hctool(
        "chaos", "run", str(sched), "--json", "--artifacts", str(tmp_path / "run"), "--", str(program), cwd=tmp_path
    )
    assert code == 1 and report.get("without_faults") is True, err[-3000:]
    validate("chaos", report)


# -- the heavy ones: the engine, exploring and shrinking -----------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_repro_json(tmp_path, no_leftover_processes):
    # every variant of 30760 on the engine: about 5 minutes on 2 busy cores
    code, result, err = hctool(
        "repro", "30760", "--json", "--artifacts", str(tmp_path / "repro"), cwd=tmp_path, timeout=860
    )
    assert code == 0 and result["variants"], err[-3000:]
    assert any(v["first_divergence"] for v in result["variants"])
    validate("repro", result)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_json_on_torch_ranks(tmp_path, no_leftover_processes):
    """run (a consensus anomaly and its evidence), explore and shrink on a torchrun program."""
    sched = tmp_path / "sched.toml"
    sched.write_text('[[faults]]\nkind = "clock-skew"\nrank = 1\nms = 500\n')
    code, report, err = hctool(
        "chaos",
        "run",
        str(sched),
        "--json",
        "--artifacts",
        str(tmp_path / "run"),
        "--",
        *TORCHRUN,
        str(CHAOS_PROGRAMS / "budget_stop.py"),
        cwd=tmp_path,
        timeout=280,
    )
    assert code == 1 and report["anomalies"][0]["invariant"] == "consensus", err[-3000:]
    validate("chaos", report)
    code, report, err = hctool(
        "chaos",
        "explore",
        "--json",
        "--kinds",
        "clock-skew",
        "--max-schedules",
        "3",
        "--budget",
        "200",
        "--replays",
        "2",
        "--artifacts",
        str(tmp_path / "explore"),
        "--",
        *TORCHRUN,
        str(CHAOS_PROGRAMS / "budget_stop.py"),
        cwd=tmp_path,
        timeout=280,
    )
    assert code in (0, 1), err[-3000:]
    validate("chaos", report)
    code, shrunk, err = hctool(
        "chaos",
        "shrink",
        str(sched),
        "--json",
        "--budget",
        "120",
        "--replays",
        "2",
        "--accept",
        "1/1",
        "--artifacts",
        str(tmp_path / "shrink"),
        "--",
        *TORCHRUN,
        str(CHAOS_PROGRAMS / "budget_stop.py"),
        cwd=tmp_path,
        timeout=280,
    )
    assert code == 1 and shrunk["anomalies"], err[-3000:]
    validate("chaos", shrunk)
