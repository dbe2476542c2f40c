"""Reports carry no machine paths: a real diverging run whose program is given by its absolute
path, from the folder it lives in; its --json report, its run record, its HTML page and its
export show the program relative to that folder and the interpreter by its name, and still
name the culprit's line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hctool.console.paths import short_frame, short_path, tidy_stack_text
from tests.consensus.helpers import PROGRAMS, site

PREFIXES = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), os.path.expanduser("~")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """vote_loop.py copied into a fresh folder and run from there, named by its absolute path:
    (folder, --json report)."""
    work = tmp_path_factory.mktemp("paths")
    for name in ("vote_loop.py", "common.py"):
        shutil.copy(PROGRAMS / name, work / name)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    env.pop("HCTOOL_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "run", "--nproc", "2", "--hang-after", "1.5"]
        + ["--timeout", "60", "--json", "--trace-dir", "trace", "--", str(work / "vote_loop.py")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    return work, json.loads(proc.stdout)


def _machine_paths(text: str, work: Path) -> list[str]:
    found = [p for p in PREFIXES if p and p != "/" and p in text]
    return found + ([str(work)] if str(work) in text else [])


@pytest.mark.timeout(180)
def test_the_reports_stacks_have_no_machine_paths(run):
    work, report = run
    assert report["first_divergence"]["ranks"]["0"]["site"] == site("vote_loop.py", "vote")
    stacks = report["stacks"]
    assert set(stacks) == {"0", "1"}
    for text in stacks.values():
        assert _machine_paths(text, work) == [], text[:600]
        if "(faulthandler)" not in text:  # py-spy's header: the command as typed from the folder
            assert "Process " in text and ": python" in text and " vote_loop.py" in text, text[:300]
    assert "vote_loop.py:" in stacks["0"]  # what the user needs to open the file is still there
    record = (work / "trace" / "hctool-run.json").read_text()
    assert _machine_paths(json.dumps(json.loads(record)["stacks"]), work) == []


@pytest.mark.timeout(180)
def test_the_page_and_the_export_have_no_machine_paths(run, tmp_path):
    work, _ = run
    page = (work / "trace" / "report.html").read_text()
    assert _machine_paths(page, work) == []
    out = tmp_path / "t.json"
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "export", "trace", "-o", str(out)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    stacks = [e["args"]["stack"] for e in doc["traceEvents"] if "stack" in e.get("args", {})]
    assert stacks and all(f.startswith("vote_loop.py:") for s in stacks for f in s), stacks
    assert _machine_paths(out.read_text(), work) == []


def test_paths_outside_the_folder_stay_whole(tmp_path):
    inside = tmp_path / "pkg" / "mod.py"
    assert short_path(str(inside), str(tmp_path)) == os.path.join("pkg", "mod.py")
    assert short_path("/nonexistent-dir/x.py", str(tmp_path), roots=[]) == "/nonexistent-dir/x.py"
    assert short_frame(f"{inside}:7 fn", str(tmp_path)) == os.path.join("pkg", "mod.py") + ":7 fn"
    assert short_frame("mod.py:7 fn", str(tmp_path)) == "mod.py:7 fn"
    # an installed package's file from the package down, as py-spy shows it
    assert short_path(json.__file__, str(tmp_path)) == os.path.join("json", "__init__.py")


def test_a_real_faulthandler_dump_is_shortened(tmp_path):
    # what the recorder's SIGUSR1 handler writes when py-spy may not attach: faulthandler's format
    script = tmp_path / "hang.py"
    script.write_text(
        "import faulthandler, json, sys\n\ndef f():\n    faulthandler.dump_traceback(sys.stdout)\n\nf()\n"
    )
    text = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    ).stdout
    assert str(script) in text  # faulthandler writes whole paths
    tidy = tidy_stack_text("(faulthandler)\n" + text, str(tmp_path))
    assert str(tmp_path) not in tidy and 'File "hang.py", line 4 in f' in tidy, tidy
