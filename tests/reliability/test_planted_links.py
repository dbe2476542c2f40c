"""Files hctool makes in a folder someone else can write into (a shared --trace-dir): a link or a
FIFO planted there under a name hctool will use is refused or replaced, never written through,
never blocked on. Real hctool runs, real links, real FIFOs; the victim is a file outside the
folder that must come out unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hctool.supervise.procs import inject_env
from tests.reliability.helpers import REPO, child_env

PROGRAMS = Path(__file__).resolve().parent / "programs"
TICKER = str(REPO / "tests" / "consensus" / "programs" / "ticker.py")
VICTIM_TEXT = "the victim's own bytes\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    return victim


def _run(trace: Path, *extra: str, timeout: float = 120, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--nproc",
            "2",
            "--timeout",
            "60",
            "--trace-dir",
            str(trace),
            *extra,
            "--",
            TICKER,
        ],
        cwd=REPO,
        env={**child_env(), "TICKER_SECONDS": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_link_planted_at_a_rank_log_is_refused(tmp_path, no_leftover_processes):
    victim, trace = _victim(tmp_path), tmp_path / "trace"
    trace.mkdir()
    (trace / "rank0.log").symlink_to(victim)
    proc = _run(trace)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    errors = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "rank0.log is a symbolic link" in errors[0], err
    assert victim.read_text() == VICTIM_TEXT


def test_a_fifo_planted_at_a_rank_log_is_refused_not_waited_on(tmp_path, no_leftover_processes):
    trace = tmp_path / "trace"
    trace.mkdir()
    os.mkfifo(trace / "rank1.log")
    proc = _run(trace)
    try:
        out, err = proc.communicate(timeout=60)  # before: open() of the FIFO waited for a reader forever
    finally:
        proc.kill()
    assert proc.returncode == 2 and "rank1.log is not a regular file" in err, err


def test_links_planted_at_the_run_record_clock_and_report_names_are_replaced_not_followed(
    tmp_path, no_leftover_processes
):
    """hctool-run.json, the fault clock and report.html are written under a temporary name and
    renamed into place: before, the temporary name was `.NAME.<hctool pid>.tmp`, so a link
    planted there as soon as the pid is known took the write."""
    victim, trace = _victim(tmp_path), tmp_path / "trace"
    trace.mkdir()
    for name in ("hctool-run.json", "report.html", "fault-clock"):
        (trace / name).symlink_to(victim)
    proc = _run(trace, "--inject", "clock-skew:rank=1,ms=5")
    for name in ("hctool-run.json", "fault-clock"):  # the old temporary names, planted while it starts
        (trace / f".{name}.{proc.pid}.tmp").symlink_to(victim)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert victim.read_text() == VICTIM_TEXT
    for name in ("hctool-run.json", "report.html", "fault-clock"):
        assert not (trace / name).is_symlink() and (trace / name).is_file(), name
    assert '"exit_codes"' in (trace / "hctool-run.json").read_text()


def _agent_process(tmp_path: Path, code: str, **env) -> subprocess.CompletedProcess:
    full = inject_env(child_env(), **env)
    full.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60
    )


def _free_port() -> int:
    from hctool.supervise.procs import free_port

    return free_port()


def test_a_link_planted_at_a_trace_file_name_is_refused_and_the_program_runs_on(tmp_path):
    victim, trace = _victim(tmp_path), tmp_path / "trace"
    trace.mkdir()
    code = (
        f"import os; os.symlink({str(victim)!r}, os.path.join({str(trace)!r}, f'rank0-{{os.getpid()}}.jsonl'))\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo'); x = torch.ones(1); dist.all_reduce(x); print('result', int(x))\n"
    )
    done = _agent_process(tmp_path, code, TRACE_DIR=str(trace))
    assert done.returncode == 0 and "result 1" in done.stdout, done.stderr
    assert "hctool: recording is off in this process" in done.stderr
    assert victim.read_text() == VICTIM_TEXT


def test_a_fifo_as_the_fault_clock_never_blocks_a_rank(tmp_path):
    fifo = tmp_path / "fault-clock"
    os.mkfifo(fifo)
    code = "import time\nfor _ in range(3):\n    time.time(); time.sleep(0.15)\nprint('clock read')\n"
    try:
        done = _agent_process(tmp_path, code, FAULTS="clock-skew:ms=1000", FAULTS_T0=str(fifo))
    except subprocess.TimeoutExpired:
        raise AssertionError("the rank blocked opening the FIFO planted as its fault clock") from None
    assert done.returncode == 0 and "clock read" in done.stdout, done.stderr
