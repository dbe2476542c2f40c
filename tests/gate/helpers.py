"""Running pytest and hctool gate the way a user does, in real subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
CASES = FIXTURES / "plugin_cases" / "test_ranks.py"


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("GITHUB_ACTIONS", None)
    e.pop("PYTEST_ADDOPTS", None)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [e.get("PYTHONPATH")])])
    return e


def site_line(path: Path, tag: str) -> int:
    """The line of the `# site: TAG` comment in path."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.rstrip().endswith(f"# site: {tag}"):
            return n
    raise AssertionError(f"no '# site: {tag}' in {path}")


def run_pytest(
    args: list[str], junit: Path, cwd: Path, timeout: float = 240
) -> tuple[subprocess.CompletedProcess, dict]:
    """pytest with the plugin; returns the process and {test name: (outcome, text)}."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *args,
        "-p",
        "hctool.pytest_plugin",
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    results = {}
    if junit.exists():
        for tc in ET.parse(junit).getroot().iter("testcase"):
            outcome, text = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = tc.find(tag)
                if el is not None:
                    outcome, text = tag, (el.get("message", "") + "\n" + (el.text or ""))
            results[tc.get("name")] = (outcome, text)
    return proc, results


def junit_messages(junit: Path) -> dict[str, str]:
    """{test name: the message attribute of its <failure>}: the one line a CI's test view lists."""
    return {
        tc.get("name"): el.get("message", "")
        for tc in ET.parse(junit).getroot().iter("testcase")
        if (el := tc.find("failure")) is not None
    }


def failure_sections(stdout: str) -> dict[str, str]:
    """{test name: what pytest printed for its failure}, from the FAILURES part of pytest's
    terminal output (between the `____ name ____` rule and the next rule)."""
    sections: dict[str, list[str]] = {}
    current = None
    inside = False
    for line in stdout.splitlines():
        if line.startswith("=") and " FAILURES " in line:
            inside = True
            continue
        if not inside:
            continue
        if line.startswith("="):
            break
        if line.startswith("____") and line.endswith("____"):
            current = line.strip("_ ")
            sections[current] = []
        elif current is not None and not (line.startswith("----") and "generated xml file" in line):
            sections[current].append(line)
    return {name: "\n".join(lines).strip("\n") for name, lines in sections.items()}


def copy_project(tmp: Path) -> Path:
    dst = tmp / "project"
    shutil.copytree(FIXTURES / "gate_project", dst, ignore=shutil.ignore_patterns("__pycache__", "hctool-runs"))
    return dst


# The change the gate must stop: a collective that only rank 0 issues (to "log" a statistic).
RANK_LOCAL_CHANGE = (
    """        dist.all_reduce(out, group=self.group)
        return out""",
    """        dist.all_reduce(out, group=self.group)
        if dist.get_rank(self.group) == 0:  # log the largest activation of the job
            peak = out.abs().max().reshape(1)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=self.group)  # site: rank-local
        return out""",
)


def add_rank_local_collective(project: Path) -> tuple[Path, int]:
    path = project / "tpmini" / "layers.py"
    old, new = RANK_LOCAL_CHANGE
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path, site_line(path, "rank-local")


def gate(project: Path, *args: str, extra_env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    e = env()
    e.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "hctool", "gate", *args],
        cwd=project,
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
