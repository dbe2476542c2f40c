"""The pytest plugin on real ranks: pass, divergence, an exception on one rank, a
hang, misuse, -k, -x and xdist, in real pytest subprocesses over
tests/fixtures/plugin_cases/test_ranks.py (one run covers every outcome)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.gate.helpers import CASES, failure_sections, junit_messages, run_pytest, site_line

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

    # What the user reads (--tb=auto): the answer first, the user's own frames only.
    sections = failure_sections(proc.stdout)
    first = {name: text.splitlines()[0] for name, text in sections.items()}
    assert first["test_diverge"].startswith("ranks diverged: cause: rank 0, extra all_reduce at test_ranks.py:")
    assert sections["test_diverge"].splitlines()[1].startswith("symptom: rank 0 ")
    mismatch = site_line(CASES, "mismatch")
    # a rank failing inside the collective first (rank 1: "Connection reset by peer", after gloo
    # aborted rank 0) still leads with the divergence that caused it
    assert first["test_mismatch_in_collective"] == (
        f"ranks diverged: cause: ranks 0, 1, all_reduce at test_ranks.py:{mismatch} "
        "(test_mismatch_in_collective) differs in shape"
    )
    assert "[[4]] float32" in sections["test_mismatch_in_collective"]  # each rank's shape, on its line
    assert first["test_raise"].startswith("rank 1 of 2 failed in call: ValueError: rank one is broken")
    for name, text in sections.items():
        # no frame of pytest, pluggy or hctool, and never torch's source (its `all_reduce` body)
        for noise in ("pluggy/", "_pytest/", "_multicall", "hctool/agent", "def all_reduce(", "work.wait()", "c10d"):
            assert noise not in text, f"{name} shows {noise!r}:\n{text}"
        assert "Captured stderr" not in text, text  # hctool's own progress and a second copy of the logs
    assert "frames of pytest, pluggy, hctool, torch.distributed and threading hidden" in sections["test_hang"]
    # each rank's log, once, in the failure
    logged = sections["test_mismatch_in_collective"]
    assert logged.count("rank 1 logs: about to reduce") == 1 and "--- last lines of rank 1's log ---" in logged
    assert "op.preamble.length <= op.nbytes" in logged  # why gloo aborted rank 0, from its log

    # JUnit: the failure's message is its first line, the cause; the text carries the rest
    messages = junit_messages(tmp_path / "j.xml")
    assert messages["test_diverge"] == first["test_diverge"]
    assert messages["test_mismatch_in_collective"] == first["test_mismatch_in_collective"]
    assert messages["test_raise"].startswith("rank 1 of 2 failed in call: ValueError: rank one is broken")
    assert all("\n" not in m and "object at 0x" not in m for m in messages.values()), messages


@pytest.mark.slow
def test_tb_short_and_line_shorten_the_failure(tmp_path, no_leftover_processes):
    """--tb=short: the cause, the symptom and one line per rank; --tb=line: one line per test."""
    picked = ["-k", "test_diverge or test_mismatch_in_collective or test_raise"]
    proc, _ = run_pytest([str(CASES), *picked, "--tb=short"], tmp_path / "s.xml", CASES.parent)
    sections = failure_sections(proc.stdout)
    assert set(sections) == {"test_diverge", "test_mismatch_in_collective", "test_raise"}, proc.stdout[-3000:]
    for name, text in sections.items():
        lines = text.splitlines()
        assert len(lines) <= 6, f"{name}:\n{text}"  # lead (1-2), symptom, rank 0, rank 1, where the logs are
        assert "--- stack of rank" not in text and "Traceback" not in text
    assert sections["test_diverge"].startswith("ranks diverged: cause: rank 0, extra all_reduce")
    raises = site_line(CASES, "raises")
    raised = f"rank 1: failed in call: ValueError: rank one is broken (at test_ranks.py:{raises} in test_raise)"
    assert raised in sections["test_raise"]

    proc, _ = run_pytest([str(CASES), *picked, "--tb=line"], tmp_path / "l.xml", CASES.parent)
    block = proc.stdout.split(" FAILURES ", 1)[1].split("\n", 1)[1].split("\n=", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.strip() and "generated xml file" not in ln]
    mismatch = site_line(CASES, "mismatch")
    assert len(lines) == 3, block
    assert f"test_ranks.py:{mismatch}: ranks diverged: cause: ranks 0, 1, all_reduce at test_ranks.py:{mismatch}" in (
        "\n".join(lines)
    )


@pytest.mark.slow
def test_k_selects_and_x_stops(tmp_path, no_leftover_processes):
    proc, res = run_pytest([str(CASES), "-k", "test_pass"], tmp_path / "k.xml", CASES.parent)
    assert proc.returncode == 0 and set(res) == {"test_pass"}, proc.stdout[-2000:]
    proc, res = run_pytest([str(CASES), "-x", "-k", "test_diverge or test_raise"], tmp_path / "x.xml", CASES.parent)
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
    # the finding crosses from the xdist worker to its controller whole: the cause is the message
    assert junit_messages(tmp_path / "n.xml")["test_diverge"].startswith("ranks diverged: cause: rank 0, extra")
