"""check-consensus beyond the corpus: torchrun-wrapped runs, Flight Recorder
dumps, the analyze command, usage errors, and the live watcher on a long run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from hctool.cli import app
from hctool.consensus.live import LiveWatcher
from hctool.supervise.procs import ProcessSet, free_port, inject_env, torchrun_env
from tests.conftest import REPO
from tests.consensus.helpers import PROGRAMS, run_check, site


def _torchrun(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]


@pytest.mark.parametrize(
    "program,seq,kind,culprits,marker0",
    [
        ("vote_loop.py", 9, "extra", [0], "vote"),
        pytest.param("extra_same_shape.py", 3, "extra", [0], "extra", marks=pytest.mark.slow),
        pytest.param("never_joins.py", 2, "missing", [1], "reduce", marks=pytest.mark.slow),
    ],
)
def test_through_torchrun(program, seq, kind, culprits, marker0, tmp_path, no_leftover_processes):
    code, report, stderr = run_check(program, tmp_path, wrapper=_torchrun(free_port()))
    first = report["first_divergence"]
    assert code == 1, stderr[-2000:]
    assert (first["seq"], first["kind"], first["culprit_ranks"]) == (seq, kind, culprits), first
    assert first["ranks"]["0"]["site"] == site(program, marker0)
    assert report["world_size"] == 2


def test_clean_program_through_torchrun(tmp_path, no_leftover_processes):
    env = dict(os.environ, PROG_FIX="1", PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        "-m",
        "hctool",
        "check-consensus",
        "run",
        "--json",
        "--trace-dir",
        str(tmp_path / "t"),
        "--",
        *_torchrun(free_port()),
        str(PROGRAMS / "extra_same_shape.py"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["verdict"] == "consistent"


def test_flight_recorder_dump_is_analyzed(tmp_path, no_leftover_processes):
    fr = tmp_path / "fr"
    fr.mkdir()
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="1000", TORCH_FR_DUMP_TEMP_FILE=str(fr / "rank"))
    proc = subprocess.run(
        [*_torchrun(free_port()), str(PROGRAMS / "fr_dump.py")], env=env, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = CliRunner().invoke(app, ["check-consensus", "analyze", str(fr), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    first = report["first_divergence"]
    assert report["verdict"] == "diverged" and report["world_size"] == 2
    # the evidence is the dtype the transport paired at seq 3; its cause is rank 0's inserted call there
    assert (first["seq"], first["kind"], first["culprit_ranks"]) == (3, "extra", [0]), first
    assert first["cause"]["site"] == first["ranks"]["0"]["site"] == site("fr_dump.py", "extra0")
    assert first["ranks"]["1"]["site"] == site("fr_dump.py", "loop")


def test_analyze_after_run_gives_the_same_report(tmp_path, no_leftover_processes):
    code, report, _ = run_check("extra_same_shape.py", tmp_path)
    result = CliRunner().invoke(app, ["check-consensus", "analyze", str(tmp_path / "trace"), "--json"])
    again = json.loads(result.stdout)
    assert result.exit_code == code == 1
    assert again["first_divergence"] == report["first_divergence"]
    human = CliRunner().invoke(app, ["check-consensus", "analyze", str(tmp_path / "trace")])
    assert "DIVERGED" in human.stdout and site("extra_same_shape.py", "extra") in human.stdout


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["check-consensus", "run"], "no program given"),
        (["check-consensus", "run", "--", "missing_script.py"], "script not found"),
        (["check-consensus", "run", "--timout", "5", "--", "x.py"], "no such option: --timout"),
        (["check-consensus", "run", "--nproc-per-node", "2", "--", "x.py"], "no such option: --nproc-per-node"),
        (["check-consensus", "run", "--", "no-such-command-here", "x"], "command not found"),
        (["check-consensus", "run", "--", "pyproject.toml"], "neither a Python script"),
        (["check-consensus", "run", "--on-divergence", "maybe", "--", "x.py"], "--on-divergence"),
        (["check-consensus", "analyze", "/nonexistent/dir"], "not a folder"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, needle, hctool_cmd, clean_env, tmp_path):
    if "pyproject.toml" in argv:
        argv = [a.replace("pyproject.toml", str(REPO / "pyproject.toml")) for a in argv]
    proc = subprocess.run([*hctool_cmd, *argv], capture_output=True, text=True, env=clean_env, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("Error: ") and needle in proc.stderr.splitlines()[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "hctool-runs").exists()  # nothing was run: no run folder is left behind


def _steady_watch(tmp_path, seconds: float) -> tuple[LiveWatcher, list[int], float]:
    """Run ticker.py (50 broadcasts/s per rank) under a LiveWatcher polled every 0.2 s."""
    trace = tmp_path / "trace"
    port = free_port()
    env = inject_env(dict(os.environ), TRACE_DIR=str(trace))
    env["TICKER_SECONDS"] = str(seconds)
    watcher = LiveWatcher(trace, 2, hang_after=5.0)
    pending, check_s = [], 0.0
    with ProcessSet() as ps:
        for r in range(2):
            ps.start(
                f"rank{r}",
                [sys.executable, str(PROGRAMS / "ticker.py")],
                env=dict(env, **torchrun_env(r, 2, "127.0.0.1", port)),
                log_path=tmp_path / f"r{r}.log",
            )
        deadline = time.monotonic() + seconds + 60
        while ps.alive() and time.monotonic() < deadline:
            t0 = time.perf_counter()
            assert watcher.check() is None
            check_s += time.perf_counter() - t0
            pending.append(watcher.pending())
            time.sleep(0.2)
        assert not ps.alive()
    assert watcher.check() is None
    return watcher, pending, check_s


def test_live_watcher_stays_bounded_on_a_steady_run(tmp_path, no_leftover_processes):
    watcher, pending, check_s = _steady_watch(tmp_path, 4.0)
    print(
        f"\nlive watcher: {watcher.events_seen} events, max pending {max(pending)}, "
        f"{1000 * check_s / len(pending):.2f} ms per check"
    )
    assert watcher.events_seen > 100
    assert max(pending) < 200  # what every rank agreed on is dropped as it goes


def test_what_is_shown_ends_where_hctool_ended_the_job(tmp_path, no_leftover_processes):
    """Under torchrun a divergence used to end with torchrun's SignalException traceback: the
    SIGTERM of hctool's own teardown, not the program's doing."""
    cmd = [sys.executable, "-m", "hctool", "check-consensus", "run", "--trace-dir", str(tmp_path / "t"), "--"]
    cmd += [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, str(REPO / "examples" / "extra_call.py")], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert proc.returncode == 1 and "DIVERGED" in proc.stdout, proc.stderr[-2000:]
    assert "SignalException" not in proc.stderr
    assert "SignalException" in (tmp_path / "t" / "cmd.log").read_text()  # it is in the log, whole


PRINTS = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("rank", dist.get_rank(), "sum", t.item())
print("a last line without its newline", end="")
dist.destroy_process_group()
"""


def test_the_programs_output_is_shown_as_torchrun_shows_it(tmp_path, no_leftover_processes):
    """On stderr, each line once, a script's ranks prefixed; stdout stays the report alone."""
    program = tmp_path / "prints.py"
    program.write_text(PRINTS)
    cmd = [sys.executable, "-m", "hctool", "check-consensus", "run", "--json", "--trace-dir", str(tmp_path / "t")]
    proc = subprocess.run([*cmd, "--", str(program)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["verdict"] == "consistent", proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    for rank in (0, 1):
        assert lines.count(f"[rank{rank}] rank {rank} sum 2.0") == 1, proc.stderr
        assert lines.count(f"[rank{rank}] a last line without its newline") == 1, proc.stderr
