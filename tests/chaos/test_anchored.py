"""Faults anchored to the program's own events (at_call=K): they act at the rank's K-th
collective, whatever the start took, in the rank (a clock jump) and from the supervisor (a
pause, for which the rank waits at that call). Real ranks under check-consensus run."""

import json
import subprocess
import sys
import textwrap

import pytest

JOB = """
import json, sys, time, torch, torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
wall, mono = [], []
for i in range(16):
    dist.all_reduce(t)                  # call i+1 of this rank
    wall.append(time.time())            # this rank's (possibly faulted) clock after the call
    mono.append(time.monotonic())
    time.sleep(0.02)
print(json.dumps({"rank": rank, "wall": wall, "mono": mono}), flush=True)
dist.destroy_process_group()
"""


def _run(tmp_path, *inject):
    program = tmp_path / "job.py"
    program.write_text(textwrap.dedent(JOB))
    args = [a for spec in inject for a in ("--inject", spec)]
    cmd = [sys.executable, "-m", "hctool", "check-consensus", "run", "--json", "--nproc", "2", "--hang-after", "8"]
    cmd += ["--timeout", "90", "--trace-dir", str(tmp_path / "trace"), *args, "--", str(program)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert proc.stdout.startswith("{"), proc.stderr[-2000:]
    lines = {}
    for f in sorted((tmp_path / "trace").glob("rank*.stdout")) + sorted((tmp_path / "trace").glob("rank*.log")):
        for line in f.read_text().splitlines():
            if line.startswith('{"rank"'):
                row = json.loads(line)
                lines[row["rank"]] = row
    return proc.returncode, json.loads(proc.stdout), lines


@pytest.mark.timeout(200)
def test_anchored_faults_act_at_the_named_call(tmp_path, no_leftover_processes):
    code, report, seen = _run(tmp_path, "clock-jump:rank=1,ms=100000,at_call=5", "rank-pause:rank=0,ms=3000,at_call=11")
    assert (code, report["verdict"]) == (0, "consistent"), report.get("reason")
    fired = {f["spec"].split(":")[0]: f["fired"] for f in report["faults"]}
    assert fired == {"clock-jump": {"1": 1}, "rank-pause": {"0": 1}}, fired
    # rank 1's clock jumped 100 s between its 4th and its 5th call's readings, and only there
    steps = [b - a for a, b in zip(seen[1]["wall"], seen[1]["wall"][1:])]
    assert [i for i, d in enumerate(steps) if d > 50] == [3], steps
    assert all(b - a < 50 for a, b in zip(seen[0]["wall"], seen[0]["wall"][1:])), "rank 0's clock moved"
    # rank 0 was stopped at its 11th call: the longest gap of its loop is the one into that call
    gaps = [b - a for a, b in zip(seen[0]["mono"], seen[0]["mono"][1:])]
    assert max(range(len(gaps)), key=gaps.__getitem__) == 9, gaps
    assert (tmp_path / "trace" / "anchor-rank0-call11.done").exists()


def test_anchors_are_refused_where_no_rank_could_say_when(tmp_path):
    program = tmp_path / "job.py"
    program.write_text("print(1)\n")
    cmd = [sys.executable, "-m", "hctool", "check-consensus", "run", "--inject", "thread-slow:ms=5,at_call=0"]
    proc = subprocess.run([*cmd, "--", str(program)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("Error:") and "at_call" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
