"""The human output of a chaos report: faults as they are written on the command line, evidence
one fact per line, and text that rich would take for markup printed as it is."""

from __future__ import annotations

from rich.console import Console

from hctool.chaos.report import render
from hctool.protocol.faults import parse_fault


def _text(report: dict) -> str:
    console = Console(record=True, width=200)
    render(report, console)
    return console.export_text()


def test_anomalies_read_as_text_not_as_json_or_reprs():
    shrunk = [parse_fault("clock-skew:rank=0,ms=200").to_dict()]
    report = {
        "target": "budget_stop.py",
        "verdict": "invalid",
        "schedules": 1,
        "runs": [],
        "anomalies": [
            {
                "invariant": "liveness",
                "evidence": {"blocked": "rank 0 in all_reduce [/__w/pytorch/gloo/pair.cc:537]", "seconds": 12.5},
                "shrunk": shrunk,
                "reproduced": "9/10",
                "replay": "hctool chaos run anomaly-1.toml -- budget_stop.py",
            }
        ],
        "history": "/tmp/x[/y]/history.jsonl",
    }
    text = _text(report)
    assert "shrunk to 1 fault(s): clock-skew:rank=0,ms=200" in text
    assert "  blocked: rank 0 in all_reduce [/__w/pytorch/gloo/pair.cc:537]" in text
    assert "  seconds: 12.5" in text
    assert "{'kind'" not in text and '{"blocked"' not in text
    assert "history: /tmp/x[/y]/history.jsonl" in text
