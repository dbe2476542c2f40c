"""The pytest plugin on real ranks: pass, divergence, an exception on one rank, a
hang, misuse, -k, -x and xdist, in real pytest subprocesses over
tests/fixtures/plugin_cases/test_ranks.py (one run covers every outcome)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.gate.helpers import CASES, run_pytest, site_line

pytestmark = pytest.mark.timeout(400)


def test_outcomes_pass_diverge_raise_hang(tmp_path, no_leftover_processes):
    proc, res = run_pytest([str(CASES), "-k", "not past_timeout"], tmp_path / "j.xml", CASES.parent)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert res["test_pass"][0] == "passed" and res["test_plain_runs_in_process"][0] == "passed"

    outcome, text = res["test_diverge"]
    assert outcome == "failure" and "ranks diverged" in text
    # each rank's call site, by file and line: the culprit's extra call and its peer's
    assert f"rank 0: all_reduce @ test_ranks.py:{site_line(CASES, 'extra')} (test_diverge)" in text
    assert f"rank 1: all_reduce @ test_ranks.py:{site_line(CASES, 'common')} (test_diverge)" in text

    outcome, text = res["test_raise"]
    assert outcome == "failure" and text.index("rank 1 of 2 failed in call") < text.index(
        "ValueError: rank one is broken"
    )
    assert f"rank 0: all_reduce @ test_ranks.py:{site_line(CASES, 'waits')}" in text  # where its peer was left

    outcome, text = res["test_hang"]
    assert outcome == "failure" and "ranks hung" in text and "rank 1 never reached the all_reduce" in text
    assert f"rank 0: all_reduce @ test_ranks.py:{site_line(CASES, 'blocked')}" in text
    # the stacks: rank 1 is asleep in the test body, not in a collective
    assert "--- stack of rank 1 ---" in text and f"test_hang (test_ranks.py:{site_line(CASES, 'sleeps')})" in text

    # misuse: one clear line each, no ranks started
    assert "fixture 'rank' needs @pytest.mark.world_size(n)" in res["test_rank_fixture_without_marker"][1]
    assert "positive int rank count, got 0" in res["test_zero_ranks"][1]


@pytest.mark.slow
def test_k_selects_and_x_stops(tmp_path, no_leftover_processes):
    proc, res = run_pytest([str(CASES), "-k", "test_pass"], tmp_path / "k.xml", CASES.parent)
    assert proc.returncode == 0 and set(res) == {"test_pass"}, proc.stdout[-2000:]
    proc, res = run_pytest([str(CASES), "-x", "-k", "diverge or raise"], tmp_path / "x.xml", CASES.parent)
    assert proc.returncode == 1 and list(res) == ["test_diverge"], proc.stdout[-2000:]


@pytest.mark.slow
def test_no_collective_hang_fails_at_the_timeout_with_stacks(tmp_path, no_leftover_processes):
    proc, res = run_pytest([str(CASES), "-k", "past_timeout"], tmp_path / "t.xml", CASES.parent)
    outcome, text = res["test_sleep_past_timeout"]
    assert outcome == "failure" and "ranks did not finish within 45 s (rank(s) 0, 1 still running)" in text
    line = site_line(CASES, "asleep")
    rank0, rank1 = text.split("--- stack of rank 0 ---", 1)[1].split("--- stack of rank 1 ---", 1)
    assert f"test_sleep_past_timeout (test_ranks.py:{line})" in rank0  # each rank's own stack, at the sleep
    assert f"test_sleep_past_timeout (test_ranks.py:{line})" in rank1.split("--- stack of rank", 1)[0]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed (pip install -e '.[test]')"
)
def test_xdist_workers_run_their_own_ranks(tmp_path, no_leftover_processes):
    proc, res = run_pytest(
        [str(CASES), "-n", "2", "-k", "test_pass or diverge or plain"], tmp_path / "n.xml", CASES.parent
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert res["test_pass"][0] == "passed" and res["test_plain_runs_in_process"][0] == "passed"
    assert res["test_diverge"][0] == "failure"
    assert f"all_reduce @ test_ranks.py:{site_line(CASES, 'extra')}" in res["test_diverge"][1]
