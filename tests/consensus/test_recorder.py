"""The recorder for real: a rank process writes its binary trace through the
injected sitecustomize, is SIGKILLed, and the trace still holds every call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hctool.consensus import analyze_dir
from hctool.consensus.trace import TraceDirReader
from hctool.supervise.procs import inject_env, torchrun_env
from tests.consensus.helpers import PROGRAMS, site

pytestmark = pytest.mark.timeout(120)


def test_trace_survives_sigkill_with_every_field(tmp_path, no_leftover_processes):
    trace = tmp_path / "trace"
    env = inject_env(dict(os.environ, **torchrun_env(0, 1, "127.0.0.1", 0)), TRACE_DIR=str(trace))
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "killed_world1.py")], env=env, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    events = TraceDirReader(str(trace), strict=True).poll()
    created = [(e["op"], e["label"], e["state"]) for e in events if e["g"] == "groups"]
    assert created == [("new_group", "[0]", "completed")]  # the "groups" sequence: every new_group call
    events = [e for e in events if e["g"] != "groups"]
    got = [
        (e["op"], e["g"], e["sh"], e["dt"], e["ro"], e["root"], e["site"], e["state"], e["async"], e["th"])
        for e in events
    ]
    prog = "killed_world1.py"
    loop = (
        "all_reduce",
        "0:[0]",
        [[3]],
        ["float32"],
        "MAX",
        None,
        site(prog, "loop"),
        "completed",
        False,
        "MainThread",
    )
    assert got == [
        loop,
        loop,
        loop,
        ("broadcast", "0:[0]", [[3]], ["float32"], None, 0, site(prog, "bcast"), "completed", False, "MainThread"),
        ("all_reduce", "1:[0]", [[3]], ["float32"], "SUM", None, site(prog, "async"), "completed", True, "MainThread"),
        (
            "reduce_scatter_tensor",
            "0:[0]",
            [[2]],
            ["int64"],
            None,
            None,
            site(prog, "frame"),
            "completed",
            False,
            "helper",
        ),
    ]
    assert all(e["t"] <= e["t_done"] for e in events)
    report = analyze_dir(trace).to_json()
    assert report["verdict"] == "crashed"  # no end record, no exit code: it was killed
    assert report["counts"] == {"0": {"all_reduce": 4, "broadcast": 1, "reduce_scatter_tensor": 1}}


def test_python_issued_calls_skip_the_dispatcher_kernel(tmp_path, no_leftover_processes):
    import json

    trace = tmp_path / "trace"
    env = inject_env(dict(os.environ, **torchrun_env(0, 1, "127.0.0.1", 0)), TRACE_DIR=str(trace))
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "kernel_entries.py")], env=env, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"python_issued": 0, "direct": 1}
    ops = [e["op"] for e in TraceDirReader(str(trace), strict=True).poll()]
    assert ops == ["all_reduce", "broadcast", "all_gather_into_tensor"] * 5 + ["all_reduce"]  # each once
