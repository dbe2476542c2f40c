"""`check-consensus run --probe/--inject` on a program of its own, as a user runs it: real
torchrun ranks (the faults and probes reach them through the agent), the report names the
function each rank's divergent call was entered from, faults count how often they fired, and
a name that does not resolve stops the run before anything starts (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.consensus.helpers import PROGRAMS, run_check, site

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


@pytest.mark.timeout(240)
def test_probes_name_each_ranks_caller_and_faults_count_their_firings(tmp_path):
    code, report, err = run_check(
        "probed_retry.py",
        tmp_path,
        wrapper=TORCHRUN,
        extra=[
            "--probe",
            "__main__:vote",
            "--inject",
            "delay:fn=__main__:admit,rank=0,ms=20",
            "--inject",
            "clock-skew:rank=1,ms=100",
        ],
    )
    assert code == 1 and report["verdict"] == "diverged", err
    fd = report["first_divergence"]
    assert (fd["seq"], fd["kind"], fd["culprit_ranks"]) == (3, "extra", [1])
    ranks = fd["ranks"]
    assert ranks["0"]["site"] == ranks["1"]["site"] == site("probed_retry.py", "vote")
    # the seeds' checker read this way: the same all_reduce, entered from two functions
    assert ranks["0"]["probe"]["caller"].startswith("admit:") and ranks["1"]["probe"]["caller"].startswith("retry:")
    assert report["probes"]["0"]["vote"] == 4 and report["probes"]["1"]["vote"] == 5  # its retry entered it once more
    fired = {f["spec"]: f for f in report["faults"]}
    assert fired["delay:rank=0,fn=__main__:admit,ms=20"]["fired"] == {"0": 4}
    assert fired["delay:rank=0,fn=__main__:admit,ms=20"]["resolved"] == {"0": "wrapped"}
    assert fired["clock-skew:rank=1,ms=100"]["fired"] == {"1": 1}


@pytest.mark.parametrize(
    "args, words",
    [
        (["--probe", "__main__:nosuch"], "defines no 'nosuch'"),
        (["--probe", "vote"], "bad --probe"),
        (["--inject", "delay:fn=__main__:admit.inner,ms=1"], "is not a class"),
        (["--inject", "free-delay:ms=3"], "acts on hctool's own engine"),
        (["--inject", "clock-skew:ms=nan"], "ms must be a finite number"),
        (["--inject", "delay:fn=no_such_module_here:f,ms=1"], "no module 'no_such_module_here'"),
    ],
)
def test_a_name_that_does_not_resolve_is_a_usage_error(tmp_path, args, words):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--trace-dir",
            str(tmp_path / "t"),
            *args,
            "--",
            str(PROGRAMS / "probed_retry.py"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("Error: ") and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "t").exists() or not any((tmp_path / "t").glob("rank*"))
