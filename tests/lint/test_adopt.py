"""Adoption on an existing codebase: --write-baseline / --baseline, and --diff REF."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hctool.cli import app
from hctool.console.errors import UsageError

SRC = """\
import torch.distributed as dist
def on_copy_done(pool, event, pages):  # frees lag per rank: what a free-count finding rests on
    event.query() and pool.free(pages)
def f(pool, t):
    if pool.available_size() > 0:
        dist.all_reduce(t)


def g(ev, t):
    if not ev.query():
        return
    dist.barrier()
"""
NEW = """

def h(ev, t):
    if ev.query():
        dist.barrier()
"""


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text(SRC)
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git[:3], "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "add", "m.py"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-qm", "init"], check=True, timeout=30)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args):
    return CliRunner().invoke(app, ["lint", *args])


def rules_lines(res) -> list:
    return [(f["rule"], f["line"]) for f in json.loads(res.stdout)]


def test_baseline_survives_line_shifts_and_reports_only_new(repo: Path):
    res = run(".", "--write-baseline", "bl.json")
    assert res.exit_code == 0, res.output
    entries = json.loads((repo / "bl.json").read_text())["entries"]
    assert [(e["rule"], e["function"], e["condition"], e["count"]) for e in entries] == [
        ("HC102", "f", "if pool.available_size() > 0:", 1),
        ("HC103", "g", "if not ev.query():", 1),
    ]
    # Unrelated edits shift every line: still nothing new, exit 0.
    (repo / "m.py").write_text("# header\n# more\n" + SRC)
    res = run(".", "--baseline", "bl.json", "-f", "json")
    assert res.exit_code == 0 and json.loads(res.stdout) == []
    # A new finding is reported, alone, exit 1.
    (repo / "m.py").write_text("# header\n# more\n" + SRC + NEW)
    res = run(".", "--baseline", "bl.json", "-f", "json")
    assert res.exit_code == 1 and rules_lines(res) == [("HC102", 18)]


def test_baseline_entries_that_no_longer_match_are_reported_fixed(repo: Path):
    assert run(".", "--write-baseline", "bl.json").exit_code == 0
    (repo / "m.py").write_text(SRC.replace("    if not ev.query():\n        return\n", ""))
    res = run(".", "--baseline", "bl.json", "-f", "json")
    assert res.exit_code == 0 and json.loads(res.stdout) == []
    assert "fixed: HC103 m.py in g: if not ev.query():" in res.stderr


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "not JSON"),
        ('{"version": 2}', "missing key 'entries'"),
        ('{"version": 2, "entries": [{"rule": "HC102"}]}', "missing key"),
        (
            '{"version": 2, "entries": [{"rule": "a", "path": "b", "function": "c", "source": "d", '
            '"condition": "e", "count": 0}]}',
            "bad entry",
        ),
        ('{"version": 1, "entries": []}', "version 1"),  # keyed on collective lines: regenerate
    ],
)
def test_invalid_baseline_is_a_usage_error(tmp_path, content, needle):
    from hctool.console.errors import UsageError
    from hctool.lint.adopt import read_baseline

    (tmp_path / "bl.json").write_text(content)
    with pytest.raises(UsageError, match=needle):
        read_baseline(tmp_path / "bl.json")


def test_missing_baseline_is_exit_2_with_one_line(repo: Path, hctool_cmd, clean_env):
    res = subprocess.run(
        [*hctool_cmd, "lint", ".", "--baseline", "bl.json"],
        cwd=repo,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.startswith("Error: baseline file not found: bl.json") and "Traceback" not in res.stderr


def test_diff_limits_findings_to_changed_lines(repo: Path):
    res = run(".", "--diff", "HEAD", "-f", "json")
    assert res.exit_code == 0 and json.loads(res.stdout) == []  # nothing changed
    (repo / "m.py").write_text(SRC.replace("dist.barrier()", "dist.barrier()  # touched") + NEW)
    res = run(".", "--diff", "HEAD", "-f", "json")
    assert res.exit_code == 1 and rules_lines(res) == [("HC103", 10), ("HC102", 16)]
    (repo / "n.py").write_text(SRC)  # untracked: every line is new
    assert ("HC102", 5) in rules_lines(run("n.py", "--diff", "HEAD", "-f", "json"))


def test_diff_outside_git_or_unknown_ref_is_exit_2(repo: Path, tmp_path_factory):
    res = run(".", "--diff", "no-such-ref")
    assert isinstance(res.exception, UsageError) and "unknown git ref 'no-such-ref'" in str(res.exception)
    outside = tmp_path_factory.mktemp("nogit")
    (outside / "m.py").write_text(SRC)
    res = run(str(outside), "--diff", "HEAD")
    assert isinstance(res.exception, UsageError) and "needs a git repository" in str(res.exception)
