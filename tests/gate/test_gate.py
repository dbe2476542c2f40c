"""`hctool gate` on the sample downstream project (tests/fixtures/gate_project), in
copies of it: the change that adds a rank-local collective is stopped by lint and
by the multi-rank test, in JUnit, SARIF and GitHub annotations."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import psutil
import pytest

from tests.gate.helpers import add_rank_local_collective, copy_project, gate
from tests.gate.schemas import junit_errors, sarif_errors

pytestmark = pytest.mark.timeout(500)


def _cases(junit_path) -> dict[str, dict]:
    out = {}
    for suite in ET.parse(junit_path).getroot():
        for tc in suite.iter("testcase"):
            el = next((c for c in tc if c.tag in ("failure", "error", "skipped")), None)
            out[f"{suite.get('name')}/{tc.get('name')}"] = {
                "outcome": el.tag if el is not None else "passed",
                "text": "" if el is None else (el.text or ""),
                "message": "" if el is None else el.get("message", ""),
                "file": tc.get("file"),
                "line": tc.get("line"),
            }
    return out


def test_gate_stops_a_collective_under_a_rank_local_branch(tmp_path, no_leftover_processes):
    project = copy_project(tmp_path)
    path, line = add_rank_local_collective(project)
    source = line - 2  # lint reports the rank-local source, `if dist.get_rank(self.group) == 0:`
    step_summary = tmp_path / "summary.md"
    res = gate(
        project,
        "--junit",
        "out/junit.xml",
        "--sarif",
        "out/lint.sarif",
        extra_env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step_summary)},
    )
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]

    junit = (project / "out" / "junit.xml").read_text()
    assert junit_errors(junit) == []
    cases = _cases(project / "out" / "junit.xml")
    lint = cases[f"lint/HC102 tpmini/layers.py:{source}"]
    assert lint["outcome"] == "failure" and lint["file"] == "tpmini/layers.py" and lint["line"] == str(source)
    assert "dist.get_rank()" in lint["text"]
    test = cases["tests/test_tp_mlp_matches_the_unsplit_mlp"]
    # the multi-rank test names the divergent call on rank 0, by file, line and function
    assert test["outcome"] == "failure" and f"rank 0: all_reduce @ layers.py:{line} (forward)" in test["text"]
    # the message a CI's test list shows is the cause: the culprit rank and its extra call, one line
    cause = f"ranks diverged: cause: rank 0, extra all_reduce at layers.py:{line} (forward)"
    assert test["message"].startswith(cause) and "\n" not in test["message"], test["message"]
    assert cases["tests/test_reference_shape"]["outcome"] == "passed"

    sarif = json.loads((project / "out" / "lint.sarif").read_text())
    assert sarif_errors(sarif) == []
    [result] = sarif["runs"][0]["results"]
    region = result["locations"][0]["physicalLocation"]
    assert result["ruleId"] == "HC102" and region["artifactLocation"]["uri"] == "tpmini/layers.py"
    assert region["region"]["startLine"] == source

    # GitHub: workflow commands on stdout, at the finding's file and line, and a step summary
    assert f"::error file=tpmini/layers.py,line={source},title=hctool gate lint%3A HC102" in res.stdout
    test_line = (project / "tests" / "test_tp.py").read_text().splitlines().index("@pytest.mark.world_size(2)") + 1
    assert f"::error file=tests/test_tp.py,line={test_line},title=hctool gate tests%3A test_tp_mlp" in res.stdout
    summary = step_summary.read_text()
    assert "| lint | ❌ failed |" in summary
    assert f"tests: `test_tp_mlp_matches_the_unsplit_mlp`: {cause}" in summary  # the answer on the job's page
    assert "object at 0x" not in res.stdout + summary


@pytest.mark.slow
def test_gate_passes_the_sample_project(tmp_path, no_leftover_processes):
    project = copy_project(tmp_path)
    res = gate(project, "--junit", "junit.xml", "--sarif", "lint.sarif")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "hctool gate: exit 0" in res.stdout and "2 passed" in res.stdout
    assert junit_errors((project / "junit.xml").read_text()) == []
    sarif = json.loads((project / "lint.sarif").read_text())
    assert sarif_errors(sarif) == [] and sarif["runs"][0]["results"] == []


def test_a_step_past_its_deadline_is_ended_with_its_processes(tmp_path, no_leftover_processes):
    project = copy_project(tmp_path)
    (project / "tests" / "test_slow.py").write_text(
        "import subprocess, sys, time\n\ndef test_sleeps():\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        "    time.sleep(600)\n"
    )
    text = (project / "pyproject.toml").read_text().replace("tests = 300", "tests = 4")
    (project / "pyproject.toml").write_text(text)
    res = gate(project, "--only", "tests", "--junit", "junit.xml", "--json")
    assert res.returncode == 2, res.stderr[-2000:]
    report = json.loads(res.stdout)
    [case] = [c for c in report["steps"][0]["cases"] if c["status"] == "error"]
    assert "deadline passed" in case["message"]
    assert junit_errors((project / "junit.xml").read_text()) == []
    # the test's own orphan (a new session, so not in the step's process group) was ended too
    left = [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(600)" in " ".join(p.info["cmdline"] or [])]
    assert left == []


@pytest.mark.parametrize(
    "table, needle",
    [
        ("", "has no [tool.hctool.gate] table"),
        ("[tool.hctool.gate]\nlint = ['tpmini']\nbogus = 1\n", "unknown key(s) in [tool.hctool.gate]: bogus"),
        ("[tool.hctool.gate]\ntests = ['nowhere']\n", "tests: 'nowhere' does not exist"),
        ("[tool.hctool.gate]\nlint = ['tpmini']\ntimeouts = {lint = -1}\n", "timeouts] lint must be between 0.1 and"),
        ("[tool.hctool.gate]\nchaos = {target = 'x'}\n", "chaos needs a target and a positive budget"),
        ("[tool.hctool.gate\n", "invalid TOML"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path, table, needle):
    (tmp_path / "tpmini").mkdir()
    (tmp_path / "pyproject.toml").write_text(table)
    res = gate(tmp_path, timeout=60)
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("Error: ")


def test_a_step_that_cannot_run_is_exit_2_with_its_reason(tmp_path, no_leftover_processes):
    project = copy_project(tmp_path)
    text = (project / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(text.replace('tests = ["tests"]', 'repro = ["no-such-incident"]'))
    res = gate(project, "--only", "repro", "--junit", "j.xml", "--json", timeout=120)
    assert res.returncode == 2
    [case] = json.loads(res.stdout)["steps"][0]["cases"]
    assert case["status"] == "error" and "no-such-incident" in case["text"]
    assert junit_errors((project / "j.xml").read_text()) == []
