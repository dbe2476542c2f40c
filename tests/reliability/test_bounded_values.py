"""Numbers and text that reach a deadline, a sleep or a trace from a config file, a schedule, a
fault spec or a plugin option: one table (hctool/protocol/limits.py), finite and in range or one
line before anything runs; a fault's text value cannot carry the separator; the gate's JUnit is
well-formed whatever the names; a huge assert_same label is stored bounded; a rank's helper in a
session of its own does not outlive the run. Real hctool, pytest and rank processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from tests.reliability.helpers import REPO, child_env, one_error

TICKER = str(REPO / "tests" / "consensus" / "programs" / "ticker.py")


def _hctool(*args: str, cwd: Path = REPO, timeout: float = 60, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hctool", *args],
        cwd=cwd,
        env={**child_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "0"])
def test_gate_step_timeouts_that_are_not_a_finite_range_are_refused(tmp_path, value, no_leftover_processes):
    """Before: `timeouts = {tests = nan}` (or inf) passed the `<= 0` check and the step waited forever."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.hctool.gate]\ntests = ["tests"]\n\n[tool.hctool.gate.timeouts]\ntests = {value}\n'
    )
    one_error(_hctool("gate", cwd=tmp_path), "[tool.hctool.gate.timeouts] tests")
    assert not (tmp_path / "hctool-runs").exists()


MULTIRANK_TEST = """
import torch
import torch.distributed as dist
import pytest


@pytest.mark.world_size(2)
def test_sum(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
"""


@pytest.mark.parametrize("value", ["nan", "inf", "1e300"])
def test_the_plugin_refuses_a_timeout_that_is_not_finite_before_any_test_runs(tmp_path, value, no_leftover_processes):
    """Before: `--hctool-timeout nan` (or inf) failed a passing multi-rank test with a ValueError."""
    (tmp_path / "test_ranks.py").write_text(MULTIRANK_TEST)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "hctool.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "--hctool-timeout",
            value,
            "test_ranks.py",
        ],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out  # pytest's exit code for a usage error
    assert "--hctool-timeout must be" in out and "passed" not in out and "failed" not in out, out


@pytest.mark.parametrize("heal", ["nan", "inf", "1e300"])
def test_a_schedule_heal_that_is_not_finite_is_refused_before_the_baseline(tmp_path, heal, no_leftover_processes):
    """Before: `heal_s = nan` was an internal error after the baseline had run."""
    sched = tmp_path / "s.toml"
    sched.write_text(f'heal_s = {heal}\n\n[[faults]]\nkind = "clock-skew"\nms = 5\n')
    one_error(
        _hctool("chaos", "run", str(sched), "--scenario", "30760", "--artifacts", str(tmp_path / "art")),
        "heal_s must be",
    )


@pytest.mark.parametrize(
    "spec, words",
    [
        ("collective-delay:rank=1,ms=1e300", "ms must be between"),  # before: OverflowError in the rank
        ("clock-skew:rank=1,ms=5,duration_s=1e303", "duration_s must be"),  # before: "dur":Infinity in the export
        ("clock-skew:rank=1,ms=5,start_s=1e300", "start_s must be"),
        ("io-delay:rank=1,ms=5,path=/tmp/a;b", "without ';'"),  # before: two faults in the ranks, exit 2
        ("thread-slow:ms=5,thread=x;clock-skew", "without ';'"),
    ],
)
def test_a_fault_spec_out_of_bounds_or_with_the_separator_is_refused_before_anything_runs(
    tmp_path, spec, words, no_leftover_processes
):
    trace = tmp_path / "trace"
    proc = _hctool(
        "check-consensus",
        "run",
        "--nproc",
        "2",
        "--timeout",
        "60",
        "--trace-dir",
        str(trace),
        "--inject",
        spec,
        "--",
        TICKER,
        TICKER_SECONDS="0.3",
    )
    one_error(proc, "--inject", words)
    assert not list(trace.glob("rank*")) if trace.exists() else True


def test_a_schedule_fault_with_the_separator_in_a_text_value_is_refused(tmp_path):
    sched = tmp_path / "s.toml"
    sched.write_text('[[faults]]\nkind = "io-delay"\nms = 5\npath = "/tmp/a;clock-jump:ms=9000"\n')
    one_error(
        _hctool("chaos", "run", str(sched), "--scenario", "30760", "--artifacts", str(tmp_path / "art")), "without ';'"
    )


def test_gate_junit_is_well_formed_with_control_characters_in_file_names(tmp_path, no_leftover_processes):
    """Before: a test file named with \\x01 made pytest's JUnit (and the gate) fail: internal error."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a\x01b.py").write_text(
        "def test_ok():\n    pass\n\n\ndef test_bad():\n    assert False, 'x\\x01\\x1b y'\n"
    )
    (tmp_path / "pyproject.toml").write_text('[tool.hctool.gate]\ntests = ["tests"]\n')
    proc = _hctool("gate", "--junit", "out/junit.xml", cwd=tmp_path, timeout=240)
    assert proc.returncode == 1, proc.stderr  # one test fails: the gate fails, as it should
    assert "internal error" not in proc.stderr
    root = ET.parse(tmp_path / "out" / "junit.xml").getroot()  # well-formed
    files = {tc.get("file") for tc in root.iter("testcase")}
    assert "tests/test_a\\x01b.py" in files, files


LABELS = """
import sys
sys.path.insert(0, {folder!r})
from common import finish, init
from hctool.consensus import assert_same

rank, world = init()
assert_same("x" * 1_200_000, 1)           # the same huge label on both ranks: agreement
assert_same("y" * 1_200_000 + str(rank), 2)  # labels differing only at their end: still a divergence
finish()
"""


def test_a_huge_assert_same_label_is_stored_bounded_and_still_compared(tmp_path, no_leftover_processes):
    """Before: a 1.2 MB label made a side-table line the reader refused ("line too long"): no verdict."""
    prog = tmp_path / "labels.py"
    prog.write_text(LABELS.format(folder=str(REPO / "tests" / "consensus" / "programs")))
    proc = _hctool(
        "check-consensus",
        "run",
        "--nproc",
        "2",
        "--timeout",
        "60",
        "--trace-dir",
        str(tmp_path / "t"),
        "--json",
        "--",
        str(prog),
        timeout=120,
    )
    assert "line too long" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "diverged", proc.stderr
    labels = [e["label"] for e in report["first_divergence"]["ranks"].values()]
    assert all(len(lb) <= 256 and "1200001 chars" in lb for lb in labels), labels
    assert len(set(labels)) == 2  # the digest of the whole label tells them apart


HELPER = """
import subprocess, sys
sys.path.insert(0, {folder!r})
import torch.distributed as dist
from common import finish, init, ones

rank, world = init()
dist.all_reduce(ones())
if rank == 1:  # a helper in a session of its own, which the rank does not wait for
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with open({pidfile!r}, "w") as f:
        f.write(str(p.pid))
finish()
"""


def test_a_helper_a_rank_starts_in_its_own_session_does_not_outlive_the_run(tmp_path, no_leftover_processes):
    """Before: the rank ended, its `sleep` (start_new_session) was re-parented to init and ran on."""
    pidfile = tmp_path / "helper.pid"
    prog = tmp_path / "helper.py"
    prog.write_text(HELPER.format(folder=str(REPO / "tests" / "consensus" / "programs"), pidfile=str(pidfile)))
    proc = _hctool(
        "check-consensus",
        "run",
        "--nproc",
        "2",
        "--timeout",
        "60",
        "--trace-dir",
        str(tmp_path / "t"),
        "--",
        str(prog),
        timeout=120,
    )
    pid = int(pidfile.read_text())
    try:
        assert proc.returncode == 0, proc.stderr
        end = time.monotonic() + 10
        while time.monotonic() < end and _running(pid):
            time.sleep(0.05)
        assert not _running(pid), "the rank's helper outlived the run"
    finally:
        if _running(pid):
            psutil.Process(pid).kill()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and "sleep" in psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return False
