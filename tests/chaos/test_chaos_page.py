"""The chaos report as a user reads it: the anomaly in sentences (cause, then symptom), schedules
as the fault specs typed for --inject, the failing run's calls aligned by sequence number and its
timeline on the page, no raw JSON, no `None`, no machine path.

The default tests read a report recorded from a real run (`chaos run` of one clock-skew fault on
budget_stop.py under torchrun: rank 1's fast clock stops its loop one step early) and kept in
tests/fixtures/chaos_report/; the slow test makes a fresh one the same way and checks the same
things, and `python -m tests.chaos.test_chaos_page` records the fixture again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from tests.report.browser import Browser, find_chromium

PROGRAMS = Path(__file__).resolve().parent / "programs"
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "chaos_report" / "clock_skew_run.tar.gz"
FOLDER = "chaos-run"  # the run folder's name inside the recording
FAULT = "clock-skew:rank=1,ms=500"
# rank 1's clock runs 500 ms fast: it leaves the loop after 3 steps, rank 0 waits in a 4th all_reduce
CAUSE = "cause: rank 1 skipped the all_reduce at budget_stop.py:{line} that rank 0 made, after 3 calls"
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="no Chromium installed (apt-get install chromium)")


def _sync_line() -> int:
    """The line of budget_stop.py's all_reduce (the call the cause names)."""
    lines = (PROGRAMS / "budget_stop.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if "dist.all_reduce" in text)


def run_chaos(work: Path) -> subprocess.CompletedProcess:
    """`hctool chaos run` of the one-fault schedule, from `work`, as a user runs it."""
    for name in ("budget_stop.py", "common.py"):
        shutil.copy(PROGRAMS / name, work / name)
    (work / "sched.toml").write_text('[[faults]]\nkind = "clock-skew"\nrank = 1\nms = 500\n')
    # `torchrun` as a user types it (torch installs it beside this interpreter): the report's target
    # and replay line are the words typed, and an interpreter's path there would be the test's own
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("HCTOOL_DEBUG", None)
    torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2"]
    return subprocess.run(
        [sys.executable, "-m", "hctool", "chaos", "run", "sched.toml", "--artifacts", FOLDER, "--", *torchrun]
        + ["budget_stop.py"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def record(dest: Path) -> None:
    """A fresh run, kept as the fixture: its report, history and the run's folder (traces, run
    record), without the fault-free baseline's folder or the page (the tests draw it)."""
    with tempfile.TemporaryDirectory(prefix="hctool-chaos-page-") as tmp:
        proc = run_chaos(Path(tmp))
        assert proc.returncode == 1, proc.stderr[-3000:]
        root = Path(tmp) / FOLDER
        skip = {"report.html", "hctool.lock", "baseline", "cwd"}
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(dest, "w:gz") as tar:
            tar.add(
                root,
                arcname=FOLDER,
                filter=lambda info: None if Path(info.name).name in skip or info.name.endswith(".reserve") else info,
            )


@pytest.fixture
def recorded(tmp_path) -> Path:
    """The recorded run folder, unpacked in a fresh folder (the machine that recorded it is gone)."""
    with tarfile.open(RECORDED) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / FOLDER


def hctool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("HCTOOL_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "hctool", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def check_human_output(stdout: str, line: int) -> None:
    lines = stdout.splitlines()
    at = lines.index("anomaly 1: consensus, found by run run1")
    cause, symptom = lines[at + 1], lines[at + 2]
    assert cause.startswith(CAUSE.format(line=line)), cause
    assert symptom.startswith("symptom: ") and f"rank 1 ended after all_reduce at budget_stop.py:{line}" in symptom
    assert f"schedule: {FAULT}" in lines
    assert "reproduced: 1 of 1 run" in lines
    assert any(ln.startswith("replay: hctool chaos run sched.toml -- ") for ln in lines)
    # text, not data: no JSON object, no Python repr, no None
    assert not re.search(r"\{['\"]|\bNone\b|\bnull\b", stdout), stdout


def check_page(page_file: Path, line: int, machine_paths: list[str]) -> None:
    with Browser() as browser:
        page = browser.open(page_file.as_uri())
        text = page.eval("document.body.innerText")
        assert page.eval("document.getElementById('verdict').textContent") == "invalid"
        # the anomaly leads with its cause and symptom, its schedule as the fault specs typed for --inject
        cause = page.eval("document.querySelector('section.anomaly p.cause').textContent")
        assert cause.startswith(CAUSE.format(line=line)), cause
        assert page.eval("document.querySelector('section.anomaly p.symptom').textContent").startswith("symptom: ")
        assert page.eval("document.querySelector('table.anomaly-facts td.schedule').innerText") == FAULT
        # right below it, the run that found it, drawn as check-consensus draws a run
        run = "document.querySelector('section.anomaly').nextElementSibling"
        assert page.eval(f"{run}.id") == "run-run1"
        lanes = page.eval(
            f"Array.from({run}.querySelectorAll('table.seq-lanes tr[data-rank]')).map(r => "
            "[r.dataset.rank, r.className, r.querySelector('td.at').innerText.replace(/\\s+/g, ' ').trim()])"
        )
        assert lanes[0][0] == "0" and lanes[0][2].startswith("all_reduce SUM failed") and f":{line}" in lanes[0][2]
        assert lanes[1] == ["1", "culprit", "—"]  # the culprit never made the call its peer waits in
        assert page.eval(f"{run}.querySelectorAll('svg.timeline rect.call').length") >= 8  # 4 calls a rank
        assert page.eval(f"{run}.querySelectorAll('svg.timeline rect.call.div').length") >= 1
        assert FAULT in page.eval(f"{run}.querySelector('svg.timeline').textContent")  # the fault's window
        assert "Timeline: the whole run" in text
        # no raw JSON dump, no None/null cell, no machine path
        assert page.eval("document.querySelectorAll('pre').length") == page.eval(
            "document.querySelectorAll('details.stack pre').length"
        )
        cells = page.eval("Array.from(document.querySelectorAll('td, th')).map(c => c.innerText.trim())")
        assert not [c for c in cells if c in ("None", "null", "undefined", "NaN")]
        assert not re.search(r"\bNone\b|\bnull\b|\{\"", text), text
        assert not [p for p in machine_paths if p in text]
        runs = page.eval("Array.from(document.querySelectorAll('table.runs tr')).map(r => r.innerText)")
        assert len(runs) == 2 and FAULT in runs[1] and "\trun1" in runs[1].replace("\n", "\t")  # its folder
        assert page.console_errors() == []
        assert page.eval("document.body.dataset.ready") == "1"  # the page's script ran to its end


@needs_chromium
@pytest.mark.timeout(120)
def test_the_recorded_report_on_the_page(recorded, tmp_path):
    out = tmp_path / "page.html"
    proc = hctool("report", str(recorded), "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    recorded_at = json.loads((recorded / "run1" / "hctool-run.json").read_text())["command"][-1]
    machine = [str(tmp_path), str(Path(recorded_at).parent), sys.prefix, os.path.expanduser("~")]
    check_page(out, line=_recorded_line(recorded), machine_paths=machine)


@pytest.mark.timeout(60)
def test_the_recorded_report_in_the_terminal(recorded, tmp_path):
    """What `chaos run` printed, printed again from its report (`chaos merge` of the one report)."""
    proc = hctool("chaos", "merge", str(recorded / "report.json"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    check_human_output(proc.stdout, _recorded_line(recorded))


def _recorded_line(folder: Path) -> int:
    """The all_reduce's line as the recording has it (budget_stop.py may have moved since)."""
    cause = json.loads((folder / "report.json").read_text())["anomalies"][0]["evidence"]["cause"]
    return int(re.search(r"all_reduce at budget_stop\.py:(\d+)", cause).group(1))


@pytest.mark.slow
@needs_chromium
@pytest.mark.timeout(400)
def test_a_fresh_run_reads_the_same(tmp_path, no_leftover_processes):
    """The recording's maker, checked: a real run now prints and draws what the tests above read."""
    proc = run_chaos(tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    check_human_output(proc.stdout, _sync_line())
    check_page(tmp_path / FOLDER / "report.html", _sync_line(), [str(tmp_path), sys.prefix])
    history = (tmp_path / FOLDER / "history.jsonl").read_text()
    assert str(tmp_path) not in history


if __name__ == "__main__":  # python -m tests.chaos.test_chaos_page: record the fixture again
    record(RECORDED)
    print(RECORDED)
