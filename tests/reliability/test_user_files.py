"""Files a user names (a chaos schedule or report, a gate's pyproject.toml, a run folder's
report.json) are read through the one safe reader (hctool/protocol/safefile.py read_named:
non-blocking, a regular file, a size cap): a FIFO or a link to /dev/zero is one `Error:` line and
exit 2 at once; a report.json of the wrong types is the FolderError `hctool report` promises;
`hctool report` writes report.html by name-and-rename; a run whose script name is not UTF-8 keeps
its HTML report. Real hctool processes, real FIFOs, links and files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.helpers import REPO, child_env, one_error

PROGRAMS = REPO / "tests" / "consensus" / "programs"
HOSTILE = ["fifo", "dev-zero"]


def _hctool(*args: str, cwd: Path = REPO, timeout: float = 60, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hctool", *args],
        cwd=cwd,
        env={**child_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _plant(path: Path, how: str) -> Path:
    if how == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize("how", HOSTILE)
@pytest.mark.parametrize("command", ["run", "shrink"])
def test_a_chaos_schedule_that_is_a_fifo_or_dev_zero_is_refused_at_once(tmp_path, command, how, no_leftover_processes):
    """Before: a FIFO was waited on forever; /dev/zero was read until memory ran out."""
    sched = _plant(tmp_path / "sched.toml", how)
    proc = _hctool("chaos", command, str(sched), "--scenario", "30760", "--artifacts", str(tmp_path / "art"))
    one_error(proc, "sched.toml is not a regular file")
    assert not (tmp_path / "art").exists() or not any((tmp_path / "art").glob("*/"))


@pytest.mark.parametrize("how", HOSTILE)
def test_chaos_merge_of_a_fifo_or_dev_zero_is_refused_at_once(tmp_path, how, no_leftover_processes):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"verdict": "valid", "anomalies": [], "runs": [], "target": "t", "schedules": 1}))
    proc = _hctool("chaos", "merge", str(good), str(_plant(tmp_path / "shard.json", how)))
    one_error(proc, "shard.json is not a regular file")


@pytest.mark.parametrize(
    "doc",
    [
        {"verdict": "valid", "anomalies": 5},
        {"verdict": ["valid"], "anomalies": []},
        {"verdict": "valid", "anomalies": [1]},
        {"verdict": "valid", "anomalies": [], "runs": {"a": 1}},
        {"verdict": "valid", "anomalies": [], "target": ["a"]},
        [1, 2],
    ],
)
def test_chaos_merge_of_a_report_of_wrong_types_isone_error(tmp_path, doc):
    bad = tmp_path / "shard.json"
    bad.write_text(json.dumps(doc))
    one_error(_hctool("chaos", "merge", str(bad)), "shard.json")


@pytest.mark.parametrize("how", HOSTILE)
def test_a_gate_pyproject_that_is_a_fifo_or_dev_zero_is_refused_at_once(tmp_path, how, no_leftover_processes):
    """Before: `hctool gate` waited on the FIFO forever, or read /dev/zero until memory ran out."""
    _plant(tmp_path / "pyproject.toml", how)
    one_error(_hctool("gate", cwd=tmp_path), "is not a regular file")


# -- hctool report -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """One real 2-rank run (ticker.py), copied by each test that changes it."""
    trace = tmp_path_factory.mktemp("run") / "trace"
    proc = _hctool(
        "check-consensus",
        "run",
        "--nproc",
        "2",
        "--timeout",
        "60",
        "--trace-dir",
        str(trace),
        "--",
        str(PROGRAMS / "ticker.py"),
        timeout=120,
        TICKER_SECONDS="0.5",
    )
    assert proc.returncode == 0, proc.stderr
    return trace


def _copy(run_folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run_folder, dst, ignore=shutil.ignore_patterns("report.html", "hctool.lock"))
    return dst


def test_hctool_report_replaces_a_link_planted_at_report_html(run_folder, tmp_path):
    """Before: `hctool report RUN_DIR` wrote through the link (the victim outside was overwritten)."""
    run = _copy(run_folder, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own bytes\n")
    (run / "report.html").symlink_to(victim)
    proc = _hctool("report", str(run))
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "the victim's own bytes\n"
    assert not (run / "report.html").is_symlink() and "<!DOCTYPE html>" in (run / "report.html").read_text()


@pytest.mark.parametrize(
    "doc",
    [
        {"verdict": ["consistent"]},
        {"variants": [1, 2]},
        {"variants": [{"name": "v", "expected": 3}]},
        {"runs": [1], "anomalies": []},
        {"runs": [], "anomalies": [1]},
        {"incidents": [1]},
        {"name": ["x"]},
        {"reason": {"a": 1}},
        {"schedule": 5},
        {"stacks": [1]},
        {"first_divergence": "x"},
        {"runs": [{"name": "r", "artifacts": "x", "schedule": 3}], "anomalies": []},
    ],
)
def test_a_report_json_of_wrong_types_is_one_folder_error(run_folder, tmp_path, doc):
    """Before: TypeError, KeyError or AttributeError: `Error: internal error`."""
    run = _copy(run_folder, tmp_path)
    (run / "report.json").write_text(json.dumps(doc))
    one_error(_hctool("report", str(run)), "report.json")


@pytest.mark.parametrize("how", HOSTILE)
def test_a_report_json_that_is_a_fifo_or_dev_zero_is_one_folder_error(run_folder, tmp_path, how):
    run = _copy(run_folder, tmp_path)
    _plant(run / "report.json", how)
    one_error(_hctool("report", str(run)), "report.json")


def test_a_script_name_that_is_not_utf8_keeps_the_html_report(tmp_path, no_leftover_processes):
    """Before: the run's report.html was lost (UnicodeEncodeError) and `hctool report` was an internal error."""
    folder = tmp_path / "prog"
    folder.mkdir()
    shutil.copy(PROGRAMS / "common.py", folder / "common.py")
    script = os.fsdecode(bytes(folder) + b"/tick\xff.py")
    shutil.copy(PROGRAMS / "ticker.py", script)
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
        "--",
        script,
        timeout=120,
        TICKER_SECONDS="0.3",
    )
    assert proc.returncode == 0, proc.stderr
    assert "no HTML report" not in proc.stderr
    page = (trace / "report.html").read_bytes().decode("utf-8")  # valid UTF-8 throughout
    assert "tick\\udcff.py" in page
    (trace / "report.html").unlink()
    again = _hctool("report", str(trace))
    assert again.returncode == 0, again.stderr
    assert "tick\\udcff.py" in (trace / "report.html").read_text(encoding="utf-8")


def test_the_chrome_export_is_strict_json_whatever_the_folder_holds(run_folder, tmp_path):
    """A chaos history whose fault window ends at 1e308 s: before, the export said `"dur":Infinity`
    (as a fault window of duration_s=1e303 did), which JSON parsers refuse."""
    run = _copy(run_folder, tmp_path)
    start = json.loads((run / "hctool-run.json").read_text()).get("started_at") or 0
    (run / "chaos").mkdir()
    (run / "chaos" / "t0").write_text(f"{start}\n")
    (tmp_path / "history.jsonl").write_text(
        "\n".join(
            json.dumps(e)
            for e in [
                {"event": "invoke", "run": run.name},
                {"event": "fault-on", "fault": "clock-skew:ms=5", "at_s": 0.1},
                {"event": "fault-off", "fault": "clock-skew:ms=5", "at_s": 1e308},
                {"event": "verdict"},
            ]
        )
        + "\n"
    )
    proc = _hctool("check-consensus", "export", str(run), "-o", str(tmp_path / "trace.json"))
    assert proc.returncode == 0, proc.stderr

    def refuse(constant):
        raise AssertionError(f"not JSON: {constant}")

    doc = json.loads((tmp_path / "trace.json").read_text(), parse_constant=refuse)
    assert any(e.get("cat") == "fault" for e in doc["traceEvents"])


def test_python_m_hctool_never_imports_the_users_engine_py(tmp_path):
    """`python -m hctool` puts the working directory first on sys.path; a user's `engine.py` there
    (detr's repository has one) must not shadow hctool's `engine` package, nor run."""
    marker = tmp_path / "imported"
    (tmp_path / "engine.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit('imported')\n")
    (tmp_path / "train.py").write_text("import torch.distributed as dist\n\ndist.barrier()\n")
    done = _hctool("lint", ".", "-q", "--no-cache", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert not marker.exists()
