"""Verdicts come from what the processes did."""

from __future__ import annotations

import pytest

from hctool.consensus.model import Report
from hctool.repro.verdict import Observation, derive_verdict


def _report(verdict: str, states: tuple[str, ...] | None) -> Report:
    first = (
        None
        if states is None
        else {
            "group": "0:[0,1]",
            "seq": 3,
            "kind": "extra",
            "culprit_ranks": [0],
            "ranks": {str(r): {"op": "all_reduce", "state": s} for r, s in enumerate(states)},
        }
    )
    return Report.from_json({"verdict": verdict, "world_size": 2, "first_divergence": first})


BLOCKED = _report("diverged", ("blocked", "blocked"))
PAIRED = _report("diverged", ("completed", "completed"))
CONSISTENT = _report("consistent", None)


def obs(**kw):
    base = dict(
        outcome="done",
        rank_died=None,
        watcher_report=None,
        final_report=CONSISTENT,
        sent=10,
        succeeded=10,
        outputs_match=True,
    )
    return Observation(**{**base, **kw})


@pytest.mark.parametrize(
    "o, verdict",
    [
        (obs(), "healthy"),
        (obs(outcome="death", rank_died="rank 1 died (exit code 1)", final_report=BLOCKED), "crashed"),
        (obs(outcome="stalled", succeeded=7), "deadlocked"),
        (obs(outcome="deadline", succeeded=9), "deadlocked"),
        (obs(outcome="watcher", watcher_report=BLOCKED, succeeded=3), "deadlocked"),
        (obs(outcome="watcher", watcher_report=_report("hung", None)), "deadlocked"),
        (obs(outcome="watcher", watcher_report=PAIRED, succeeded=3), "diverged"),
        (obs(final_report=PAIRED), "diverged"),
        (obs(outputs_match=False), "diverged"),
        (obs(succeeded=9), "diverged"),
        (obs(succeeded=8, aborted=2), "healthy"),  # the server's own waiting timeout answered 408
        (obs(succeeded=7, aborted=2), "diverged"),
    ],
)
def test_derive_verdict(o, verdict):
    assert derive_verdict(o)[0] == verdict


def test_wrong_answers_are_counted_in_the_reason():
    verdict, reason = derive_verdict(obs(outputs_match=False, outputs_differing=3))
    assert verdict == "diverged" and reason == "3 of 10 answers differ from the no-cache reference"
