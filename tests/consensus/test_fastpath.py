"""The recorder's C hot path (hctool/agent/capture/_fastpath.c) records what the
Python path records: the same program, run by check-consensus with and without
it, leaves the same events, and the C path really served the repeated calls."""

from __future__ import annotations

import json

import pytest

from hctool.consensus.trace import TraceDirReader
from tests.consensus.helpers import run_check, site

pytestmark = pytest.mark.timeout(180)

_COMPARED = (
    "rank",
    "g",
    "op",
    "sh",
    "dt",
    "ro",
    "root",
    "dir",
    "peer",
    "site",
    "fn",
    "stack",
    "th",
    "state",
    "err",
    "async",
)


def _events(trace) -> list[tuple]:
    events = TraceDirReader(str(trace), strict=True).poll()
    return sorted(tuple(json.dumps(e.get(k)) for k in _COMPARED) + (str(e.get("s")),) for e in events)


def _run(path: str, tmp_path, monkeypatch) -> tuple[dict, list[tuple], dict]:
    out = tmp_path / path
    (out / "stats").mkdir(parents=True)
    monkeypatch.setenv("HCTOOL_FASTPATH", "1" if path == "c" else "0")
    monkeypatch.setenv("STATS_DIR", str(out / "stats"))
    code, report, stderr = run_check("call_forms.py", out)
    assert code == 0, stderr
    header = json.loads((next((out / "trace").glob("rank0-*.jsonl"))).read_text().splitlines()[0])
    stats = json.loads((out / "stats" / "rank0.json").read_text())
    return report | {"header": header}, _events(out / "trace"), stats


def test_c_path_records_what_the_python_path_records(tmp_path, monkeypatch, no_leftover_processes):
    try:
        from hctool.agent.capture import _fastpath  # noqa: F401
    except ImportError:
        pytest.fail(
            "hctool's C module is not loaded: not built (`pip install -e .` needs a C compiler) "
            "or turned off (HCTOOL_FASTPATH=0)"
        )
    c_report, c_events, c_stats = _run("c", tmp_path, monkeypatch)
    py_report, py_events, py_stats = _run("py", tmp_path, monkeypatch)
    assert c_report["verdict"] == py_report["verdict"] == "consistent"
    assert c_report["counts"] == py_report["counts"]
    assert c_events == py_events
    assert c_report["header"]["fastpath"] == "c+tls" and py_report["header"]["fastpath"] is False
    assert py_stats is None
    # Rank 0, per loop turn: 18 calls the C path can take; the first turn's new sites go to Python.
    assert c_stats["fast"] >= 2 * 18 and c_stats["dispatch_tls"]
    ops = {(json.loads(e[2]), json.loads(e[9])) for e in c_events}
    assert ("all_reduce", site("call_forms.py", "alternating")) in ops
    # Threads started after others ended get those threads' pthread idents; each is still
    # named as itself (busy: "left"/"right", in_turn: "first"/"second").
    names = {(json.loads(e[10]), json.loads(e[12])) for e in c_events if json.loads(e[10]) in ("busy", "in_turn")}
    assert names == {("busy", "left"), ("busy", "right"), ("in_turn", "first"), ("in_turn", "second")}, names
    failed = [e for e in c_events if json.loads(e[13]) == "failed"]
    assert len(failed) == 6 and all("invalid root rank" in json.loads(e[14]) for e in failed)


def test_dispatch_tls_is_kept_only_where_it_matches_torchs_guard(monkeypatch):
    """The C hooks write c10's excluded dispatch key set themselves only after
    checking, on this thread, that it leaves what torch's own guard leaves: a
    write of other keys (what a changed layout or mask would do) is refused and
    the hooks keep the pybind guard."""
    import torch
    from torch._C import DispatchKey, DispatchKeySet

    from hctool.agent.capture import wrappers

    fp = wrappers._fastpath
    if fp is None:
        pytest.fail(
            "hctool's C module is not loaded: not built (`pip install -e .` needs a C compiler) "
            "or turned off (HCTOOL_FASTPATH=0)"
        )
    assert wrappers._bind_dispatch_tls(torch) and fp.stats()["dispatch_tls"]
    real = fp.set_dispatch_tls
    extra = DispatchKeySet(DispatchKey.ADInplaceOrView).raw_repr()
    monkeypatch.setattr(fp, "set_dispatch_tls", lambda path, keys, default: real(path, keys | extra, default))
    assert not wrappers._bind_dispatch_tls(torch) and not fp.stats()["dispatch_tls"]
    monkeypatch.undo()
    assert wrappers._bind_dispatch_tls(torch) and fp.stats()["dispatch_tls"]
