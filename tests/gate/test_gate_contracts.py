"""The gate against its neighbours' contracts: lint's --baseline and --diff
(branch lint) and chaos explore's JSON (branch chaos). Each case skips, naming
the missing piece, until the command it drives has it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.gate.helpers import add_rank_local_collective, copy_project, env, gate
from tests.gate.schemas import junit_errors, sarif_errors

pytestmark = pytest.mark.timeout(500)


def _help(*cmd: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hctool", *cmd, "--help"], env=env(), capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else ""


def _git(project, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=project, check=True, capture_output=True
    )


def test_baseline_keeps_known_findings_out(tmp_path, no_leftover_processes):
    if "--baseline" not in _help("lint"):
        pytest.skip("this hctool lint has no --baseline/--write-baseline yet (branch lint)")
    project = copy_project(tmp_path)
    add_rank_local_collective(project)
    base = subprocess.run(
        [sys.executable, "-m", "hctool", "lint", "tpmini", "--write-baseline", "lint-baseline.json"],
        cwd=project,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert base.returncode == 0, base.stderr
    text = (project / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(
        text.replace('lint = ["tpmini"]', 'lint = ["tpmini"]\nlint_baseline = "lint-baseline.json"')
    )
    res = gate(project, "--only", "lint", "--sarif", "lint.sarif", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sarif_errors(json.loads((project / "lint.sarif").read_text())) == []


def test_changed_since_lints_only_changed_lines(tmp_path, no_leftover_processes):
    if "--diff" not in _help("lint"):
        pytest.skip("this hctool lint has no --diff yet (branch lint)")
    project = copy_project(tmp_path)
    add_rank_local_collective(project)  # committed: old news for --changed-since HEAD
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "base")
    assert gate(project, "--only", "lint", "--changed-since", "HEAD").returncode == 0
    layers = project / "tpmini" / "layers.py"
    layers.write_text(
        layers.read_text().replace(
            "        return max_steps",
            "        if dist.get_rank() == 1:\n            dist.barrier()\n        return max_steps",
        )
    )
    res = gate(project, "--only", "lint", "--changed-since", "HEAD", "--junit", "j.xml", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    failed = [c for c in json.loads(res.stdout)["steps"][0]["cases"] if c["status"] == "failed"]
    assert len(failed) == 1 and "barrier" in failed[0]["message"]
    assert junit_errors((project / "j.xml").read_text()) == []


@pytest.mark.slow
def test_chaos_step_reports_the_explore_verdict(tmp_path, no_leftover_processes):
    if "--budget" not in _help("chaos", "explore"):
        pytest.skip("this hctool has no `chaos explore` yet (branch chaos)")
    # A project whose gate explores one of the catalogue's fixed variants for a short budget.
    (tmp_path / "pyproject.toml").write_text(
        '[tool.hctool.gate]\nchaos = { target = "--scenario 26921 --variant packed --shrink-budget 30", '
        "budget = 40, seed = 0 }\n[tool.hctool.gate.timeouts]\nchaos = 300\n"
    )
    res = gate(
        tmp_path,
        "--only",
        "chaos",
        "--junit",
        str(tmp_path / "j.xml"),
        "--json",
        "--artifacts",
        str(tmp_path / "runs"),
        timeout=450,
    )
    assert res.returncode in (0, 1), res.stderr[-3000:]
    step = json.loads(res.stdout)["steps"][0]
    assert step["name"] == "chaos" and step["cases"]
    assert junit_errors((tmp_path / "j.xml").read_text()) == []
