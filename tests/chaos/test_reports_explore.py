"""Acceptance of `chaos explore` on a command (issue 36): timing bugs written from public
reports by someone who did not read hctool (tests/chaos/reports/, their README cites each
report). Explore finds each with its default kinds, shrinks it to at most two faults, and the
shrunk schedule replays at least 8 times in 10; the anomaly's cause names the line the
program marks as the divergent collective. Several minutes each: slow. Figures: docs/chaos.md."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPORTS = Path(__file__).parent / "reports"
# the collective each program marks (# MARKER) as where the ranks part, how (a skip or an extra
# call) and by whom: the rank the shrunk fault hit, or its peer (reports/README.md's last column)
DIVERGENT = {
    "t01_abort_timeout.py": (("FORWARD",), "skipped", "faulted"),  # the paused rank aborts, skips the forward
    "t02_ckpt_exists.py": (("LOAD-BCAST",), "skipped", "peer"),  # rank 0 writes late: rank 1 skips load
    "t03_prefetch_progress.py": (("VOTE",), "extra", "faulted"),  # the slow thread's rank votes once more
    "t04_async_save_reap.py": (("FINALIZE",), "skipped", "faulted"),  # the slow writer's rank skips finalize
}


def _marked_lines(program: Path, markers) -> set[str]:
    return {
        f"{program.name}:{n}"
        for n, line in enumerate(program.read_text().splitlines(), 1)
        if any(line.rstrip().endswith(f"# {m}") for m in markers)
    }


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(DIVERGENT))
def test_explore_finds_shrinks_and_replays(tmp_path, name, no_leftover_processes):
    program = REPORTS / name
    cmd = [sys.executable, "-m", "hctool", "chaos", "explore", "--budget", "480", "--seed", "0", "--json"]
    cmd += ["--artifacts", str(tmp_path / "runs"), "--", "torchrun", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run([*cmd, str(program)], capture_output=True, text=True, timeout=850, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (anomaly,) = report["anomalies"]
    final = anomaly["shrunk"] or anomaly["schedule"]
    assert 1 <= len(final) <= 2, final
    hits, runs = (int(x) for x in anomaly["reproduced"].split("/"))
    assert runs == 10 and hits >= 8, anomaly["reproduced"]
    markers, how, who = DIVERGENT[name]
    cause = anomaly["evidence"]["cause"]
    assert any(site in cause for site in _marked_lines(program, markers)), cause
    faulted = {int(f["target"].removeprefix("rank:")) for f in final if f["target"].startswith("rank:")}
    culprits = set(anomaly["evidence"]["first_divergence"]["culprit_ranks"])
    assert culprits == (faulted if who == "faulted" else {0, 1} - faulted), (cause, final)
    assert (" skipped the " in cause) == (how == "skipped"), cause


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fault_free_run_tells_a_skip_from_an_extra_call(tmp_path, no_leftover_processes):
    """t02: rank 0 writes its checkpoint late, rank 1 finds no file and skips load()'s broadcast.
    This run's traces alone read "rank 0, extra broadcast"; the fault-free run, where every rank
    made that broadcast there, says rank 1 skipped it."""
    schedule = tmp_path / "s.toml"
    schedule.write_text('seed = 0\n[[faults]]\nkind = "io-delay"\ntarget = "rank:0"\nms = 15\npath = "*"\n')
    cmd = [sys.executable, "-m", "hctool", "chaos", "run", str(schedule), "--json", "--artifacts", str(tmp_path / "r")]
    cmd += ["--", "torchrun", "--standalone", "--nproc-per-node", "2", str(REPORTS / "t02_ckpt_exists.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (anomaly,) = json.loads(proc.stdout)["anomalies"]
    cause = anomaly["evidence"]["cause"]
    assert cause.startswith("cause: rank 1 skipped the broadcast_object_list at t02_ckpt_exists.py:81"), cause
    assert "fault-free run" in anomaly["evidence"]["first_divergence"]["basis"]
