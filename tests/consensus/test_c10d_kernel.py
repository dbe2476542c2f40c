"""The C++ capture kernel (hctool/agent/capture/_c10d_kernel.cpp) records what the Python
kernel records for C++-issued calls on threads that run no Python (DDP's reducer on
autograd's device thread; here TorchScript all-reduces forked onto the inter-op pool
while the main thread is in backward()), and really records the repeats itself."""

from __future__ import annotations

import json

import pytest

from hctool.consensus import kernel_build
from tests.consensus.helpers import run_check, site
from tests.consensus.test_fastpath import _COMPARED, _events

pytestmark = pytest.mark.timeout(240)
PROGRAM = "frameless_backward.py"


def _run(name: str, tmp_path, monkeypatch, **env: str) -> tuple[int, dict, str, list, dict | None]:
    out = tmp_path / name
    (out / "stats").mkdir(parents=True)
    monkeypatch.setenv("STATS_DIR", str(out / "stats"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, report, stderr = run_check(PROGRAM, out, timeout=180)
    header = json.loads(next((out / "trace").glob("rank0-*.jsonl")).read_text().splitlines()[0])
    stats = json.loads((out / "stats" / "rank0.json").read_text()) if (out / "stats" / "rank0.json").exists() else None
    return code, report | {"header": header}, stderr, _events(out / "trace"), stats


def _without_thread(events: list) -> list:
    # the pool threads are named Dummy-N in the order they first call: not part of the comparison
    th = _COMPARED.index("th")
    return sorted(e[:th] + e[th + 1 :] for e in events)


def test_cpp_kernel_records_what_the_python_kernel_records(tmp_path, monkeypatch, no_leftover_processes):
    path, why = kernel_build.ensure_built()
    assert path is not None, f"the C++ capture kernel could not be built here: {why}"
    code, cxx, _, cxx_events, stats = _run("cxx", tmp_path, monkeypatch)
    py_code, py, _, py_events, py_stats = _run("py", tmp_path, monkeypatch, HCTOOL_C10D_KERNEL="0")
    assert code == py_code == 0
    assert cxx["verdict"] == py["verdict"] == "consistent"
    assert cxx["counts"] == py["counts"] == {"0": {"all_reduce": 30}, "1": {"all_reduce": 30}}
    assert cxx["header"]["c10d_kernel"] == "c++" and py["header"]["c10d_kernel"] == "python"
    assert _without_thread(cxx_events) == _without_thread(py_events)
    sites = {json.loads(e[_COMPARED.index("site")]) for e in cxx_events}
    assert sites == {site(PROGRAM, "backward")}
    # each pool thread's first call is learned through Python; the repeats are recorded in C++
    assert py_stats is None and stats["fast"] >= 20 and stats["fast"] + stats["python"] == 30, stats


def test_extra_call_on_a_frameless_thread_is_named(tmp_path, monkeypatch, no_leftover_processes):
    code, report, stderr, _, stats = _run("extra", tmp_path, monkeypatch, PROG_EXTRA="1")
    assert code == 1 and report["verdict"] == "diverged", stderr
    first = report["first_divergence"]
    assert first["kind"] == "extra" and first["culprit_ranks"] == [1]
    assert first["ranks"]["1"]["site"] == site(PROGRAM, "backward")
    assert report["counts"] == {"0": {"all_reduce": 30}, "1": {"all_reduce": 31}}


def test_without_a_compiler_the_python_kernel_serves(tmp_path, monkeypatch, no_leftover_processes):
    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(tmp_path / "cache"))
    code, report, stderr, events, stats = _run("nocxx", tmp_path, monkeypatch, CXX="/bin/false")
    assert "go through the Python kernel" in stderr and "the build failed" in stderr, stderr
    assert code == 0 and report["verdict"] == "consistent"
    assert report["header"]["c10d_kernel"] == "python" and stats is None
    assert len(events) == 60
