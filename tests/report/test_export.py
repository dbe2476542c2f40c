"""`hctool check-consensus export --format chrome` on real runs: the file obeys
the trace-event format, and the first divergence is marked on the culprit's track."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from hctool.supervise.procs import free_port
from tests.consensus.helpers import PROGRAMS, run_check, site
from tests.report.trace_format import check


def export(folder, out, *extra) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "hctool",
        "check-consensus",
        "export",
        str(folder),
        "--format",
        "chrome",
        "-o",
        str(out),
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _by_name(doc, name):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == name}


def test_export_is_a_well_formed_trace(vote_run, tmp_path):
    folder, report, _ = vote_run
    proc = export(folder, tmp_path / "t.json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    assert check(doc) == []
    procs = {pid: name for (pid, _), name in _by_name(doc, "process_name").items()}
    assert procs == {1: "rank 0", 2: "rank 1"}
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "collective"]
    assert {(e["pid"], e["args"]["op"]) for e in slices} >= {(1, "all_reduce"), (2, "broadcast_object_list")}
    # one slice per recorded call, as the report counts them
    for rank, ops in report["counts"].items():
        assert sum(1 for e in slices if e["pid"] == int(rank) + 1) == sum(ops.values())
    assert all({"op", "seq", "shapes", "dtypes", "site", "group"} <= set(e["args"]) for e in slices)
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert flows and {e["cat"] for e in flows} == {"pair"}
    # every arrow starts no later than it ends, on whichever rank entered first (a viewer that
    # reads events in time order drops an end whose start it has not seen)
    start = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = [e for e in flows if e["ph"] == "f"]
    assert ends and all(start[e["id"]]["ts"] <= e["ts"] for e in ends), ends
    assert doc["otherData"]["hctool"]["verdict"] == "diverged"
    assert "open it in" in proc.stderr


def test_divergence_marker_on_the_culprit_track(vote_run, tmp_path):
    folder, report, _ = vote_run
    assert export(folder, tmp_path / "t.json").returncode == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    threads = _by_name(doc, "thread_name")
    markers = [e for e in doc["traceEvents"] if e.get("cat") == "divergence"]
    culprit = [m for m in markers if m["pid"] == 1]
    assert len(culprit) == 1 and "culprit" in culprit[0]["name"], markers
    m = culprit[0]
    assert threads[(m["pid"], m["tid"])] == "group 0:[0,1]"
    assert m["args"]["site"] == site("vote_loop.py", "vote")
    # the marker sits on the divergent call itself: rank 0's extra all_reduce at seq 9
    under = [
        e
        for e in doc["traceEvents"]
        if e["ph"] == "X"
        and (e["pid"], e["tid"]) == (1, m["tid"])
        and e["ts"] <= m["ts"] <= e["ts"] + e["dur"]
        and e["args"]["seq"] == 9
    ]
    assert under and under[0]["args"]["site"] == site("vote_loop.py", "vote")
    assert under[0]["args"]["first_divergence"]["culprit_ranks"] == [0]
    assert {x["pid"] for x in markers} == {1, 2}  # the peer is marked too
    # the transport paired rank 0's extra vote with rank 1's broadcast: a mismatched pair
    bad = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f") and e["name"].startswith("paired, mismatched")]
    assert any(e["pid"] == 1 and under[0]["ts"] < e["ts"] < under[0]["ts"] + under[0]["dur"] for e in bad), bad


def test_a_limit_keeps_the_divergence_and_says_so(vote_run, tmp_path):
    folder, _, _ = vote_run
    proc = export(folder, tmp_path / "t.json", "--max-calls-per-rank", "6")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    assert check(doc) == []
    info = doc["otherData"]["hctool"]
    assert all(n <= 6 for n in info["calls_kept"].values()) and info["calls_seen"]["0"] == 10
    assert info["stride"] > 1 and "multiple of the stride" in info["rule"]
    assert "thinned" in proc.stderr
    assert any(e["name"].startswith("hctool: calls thinned") for e in doc["traceEvents"])
    assert any(e.get("cat") == "divergence" and e["pid"] == 1 for e in doc["traceEvents"])


def test_the_checker_catches_broken_traces(vote_run, tmp_path):
    folder, _, _ = vote_run
    assert export(folder, tmp_path / "t.json").returncode == 0
    good = json.loads((tmp_path / "t.json").read_text())
    no_names = copy.deepcopy(good)
    no_names["traceEvents"] = [e for e in no_names["traceEvents"] if e.get("name") != "thread_name"]
    assert any("no thread_name" in x for x in check(no_names))
    lonely = copy.deepcopy(good)
    lonely["traceEvents"] = [e for e in lonely["traceEvents"] if e["ph"] != "f"]
    assert any("wants one s and one f" in x for x in check(lonely))
    no_dur = copy.deepcopy(good)
    next(e for e in no_dur["traceEvents"] if e["ph"] == "X").pop("dur")
    assert any("X without a dur" in x for x in check(no_dur))


def test_flight_recorder_dumps_export(tmp_path, no_leftover_processes):
    fr = tmp_path / "fr"
    fr.mkdir()
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="1000", TORCH_FR_DUMP_TEMP_FILE=str(fr / "rank"))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(PROGRAMS / "fr_dump.py"),
    ]
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=90).returncode == 0
    proc = export(fr, tmp_path / "t.json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    assert check(doc) == [] and doc["otherData"]["hctool"]["source"] == "flight-recorder"
    # gloo's dumps carry no completion time: a call is a short slice, not one lasting to the end
    assert not any("#" in name for name in _by_name(doc, "thread_name").values())
    marker = [e for e in doc["traceEvents"] if e.get("cat") == "divergence" and e["pid"] == 1]
    assert marker and marker[0]["args"]["site"] == site("fr_dump.py", "extra0")


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["/nonexistent"], "not a folder"),
        (["{tmp}", "--format", "svg"], "unknown format"),
    ],
)
def test_bad_input_is_one_error_line(argv, needle, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "export", *argv, "-o", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("Error: ") and needle in proc.stderr and "Traceback" not in proc.stderr


def test_a_legitimate_cross_site_pairing_is_drawn_as_a_pairing(tmp_path):
    # rank-0-first barriers: the wait and the release meet from two lines, by design (consistent)
    code, report, err = run_check("main_first.py", tmp_path, fix=True)
    assert code == 0 and report["verdict"] == "consistent", err[-2000:]
    assert export(tmp_path / "trace", tmp_path / "t.json").returncode == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "pair"}
    assert "paired across call sites" in names and not any("mismatched" in n for n in names), names
    out = tmp_path / "r.html"
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "report", str(tmp_path / "trace"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "mismatched" not in page and 'class="mismatch' not in page and "paired across call sites" in page
