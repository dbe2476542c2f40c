"""One real divergent run shared by the report tests (2 ranks, a few seconds)."""

from __future__ import annotations

import pytest

from tests.consensus.helpers import run_check


@pytest.fixture(scope="session")
def vote_run(tmp_path_factory):
    """vote_loop.py (the #30760 shape: rank 0 votes once more) under check-consensus run:
    (trace folder, the --json report, stderr)."""
    tmp = tmp_path_factory.mktemp("vote")
    code, report, stderr = run_check("vote_loop.py", tmp)
    assert code == 1 and report["first_divergence"]["culprit_ranks"] == [0], stderr[-2000:]
    return tmp / "trace", report, stderr
