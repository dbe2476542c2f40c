"""./hctool-runs/ stays out of the user's way (hctool/console/runs.py): it never shows in `git status`
(it holds a .gitignore of `*`, as .pytest_cache does), and a command's new run removes that
command's oldest runs beyond HCTOOL_KEEP_RUNS, only folders hctool made and marked, never one
whose creator still runs. Before: no .gitignore, no retention (159 MB after four chaos runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hctool.console import runs

NOOP = 'print("hello from a rank")\n'


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _old_run(root: Path, name: str, command: str, created: float, pid: int) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / runs.MARKER).write_text(json.dumps({"command": command, "pid": pid, "created": created}))
    (folder / "rank0.log").write_text("old\n")
    return folder


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.mark.timeout(120)
def test_a_run_keeps_git_status_clean_and_removes_the_oldest_marked_runs(tmp_path, no_leftover_processes):
    repo = tmp_path / "project"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "noop.py").write_text(NOOP)
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "noop.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a program")
    root = repo / "hctool-runs"
    dead = _dead_pid()
    oldest = _old_run(root, "consensus-20260101-000000-1", "consensus", 1.0, dead)
    older = _old_run(root, "consensus-20260102-000000-2", "consensus", 2.0, dead)
    other_command = _old_run(root, "chaos-explore-20260101-000000-3", "chaos", 0.5, dead)
    users_own = root / "keep-me"  # no marker: not hctool's to remove
    users_own.mkdir()
    (root / "a-link").symlink_to(oldest, target_is_directory=True)
    env = dict(os.environ, HCTOOL_KEEP_RUNS="2")
    env.pop("HCTOOL_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "run", "--", "noop.py"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 1, proc.stderr  # no process group: a finding, not a usage error
    assert "removed 1 older consensus run(s)" in proc.stderr, proc.stderr
    assert not oldest.exists() and older.exists()  # the newest 2 of consensus: the one made now and `older`
    assert other_command.exists() and users_own.exists() and (root / "a-link").is_symlink()
    new = [p for p in root.glob("consensus-*") if p not in (older,)]
    assert len(new) == 1 and (new[0] / runs.MARKER).is_file() and (new[0] / "rank0.log").is_file()
    assert (root / ".gitignore").read_text().splitlines()[-1] == "*"
    assert _git(repo, "status", "--porcelain") == "", "hctool-runs shows in git status"


def test_retention_leaves_what_is_not_its_own(tmp_path, monkeypatch):
    root = tmp_path / "hctool-runs"
    dead = _dead_pid()
    olds = [_old_run(root, f"consensus-old-{i}", "consensus", float(i), dead) for i in range(runs.DEFAULT_KEEP + 1)]
    running = _old_run(root, "consensus-running", "consensus", 0.0, os.getpid())  # its creator still runs
    linked_marker = root / "consensus-linked-marker"
    linked_marker.mkdir()
    (linked_marker / runs.MARKER).symlink_to(olds[0] / runs.MARKER)
    (root / ".gitignore").write_text("!important\n")  # the user's own: left as it is
    monkeypatch.delenv(runs.KEEP_RUNS_ENV, raising=False)
    folder = runs.new_run_folder("consensus", root=root)
    # DEFAULT_KEEP in all: the new one and the newest older ones whose creator has ended
    assert [o.exists() for o in olds] == [False, False] + [True] * (runs.DEFAULT_KEEP - 1)
    assert folder.exists() and running.exists() and linked_marker.exists()
    assert (root / ".gitignore").read_text() == "!important\n"


def test_keep_zero_keeps_every_run(tmp_path, monkeypatch):
    root = tmp_path / "hctool-runs"
    dead = _dead_pid()
    olds = [_old_run(root, f"repro-old-{i}", "repro", float(i), dead) for i in range(8)]
    monkeypatch.setenv(runs.KEEP_RUNS_ENV, "0")
    runs.new_run_folder("repro", "repro-30760", root=root)
    assert all(o.exists() for o in olds)


@pytest.mark.timeout(60)
def test_a_bad_keep_setting_is_a_usage_error_before_any_folder(tmp_path):
    (tmp_path / "noop.py").write_text(NOOP)
    env = dict(os.environ, HCTOOL_KEEP_RUNS="lots")
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "run", "--", "noop.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("Error: HCTOOL_KEEP_RUNS must be"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "hctool-runs").exists()
