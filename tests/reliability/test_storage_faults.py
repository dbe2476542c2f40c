"""Storage that cannot work: a one-line error at start. Storage that fails at run
time: L3 writes are switched off on every rank in the same tick, with a warning in
the log and a /metrics gauge; every request is still answered, correctly."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.reliability.helpers import REPO, Server, child_env
from tests.reliability.test_storage_integrity import _prompts, flush, metric, storage_flags, wave


@pytest.mark.parametrize("make", ["file", pytest.param("under-a-file", marks=pytest.mark.slow)])
def test_unusable_storage_dir_is_a_one_line_error(tmp_path, make):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    store = blocker if make == "file" else blocker / "store"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "hctool",
            "launch",
            "--cpu",
            "--port",
            "0",
            "--run-dir",
            str(tmp_path / "run"),
            *storage_flags(store),
        ],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.startswith("Error: ") and str(store) in res.stderr.splitlines()[0], res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


def fail_storage_and_check_degrade(srv: Server, store: Path) -> None:
    """Replace the storage directory by a file under a serving launch: every later
    page write fails; L3 writes must go off on every rank, answers stay correct."""
    url = srv.url
    wave(url, _prompts(4)[:1])  # writes are on before the failure
    assert metric(url, "hicache_storage_writes_enabled") == 1
    shutil.rmtree(store)
    store.write_text("the disk went away")
    second = _prompts(5)
    answers = [a["output_ids"] for a in wave(url, second)]
    deadline = time.monotonic() + 30
    while metric(url, "hicache_storage_writes_enabled") != 0:
        assert time.monotonic() < deadline, "L3 writes still on after IO errors"
        time.sleep(0.1)
    flush(url)
    assert [a["output_ids"] for a in wave(url, second)] == answers  # recomputed: same tokens
    assert "storage writes failed" in srv.log()
    assert requests.get(url + "/health", timeout=10).status_code == 200


@pytest.mark.slow  # the default run does this at the end of test_storage_integrity.py
def test_storage_failing_at_run_time_turns_l3_writes_off(tmp_path):
    store = tmp_path / "store"
    srv = Server(tmp_path / "run", *storage_flags(store))
    try:
        srv.wait_ready()
        fail_storage_and_check_degrade(srv, store)
    finally:
        assert srv.close() == 0, "a rank died of a storage error: " + srv.log()[-3000:]
