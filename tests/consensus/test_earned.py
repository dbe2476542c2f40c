"""A verdict must be earned: `consistent` and exit 0 only for a run seen whole; a run hctool did
not (fully) see gets a verdict that says what was not seen, and exit 1. Real processes, as a
user runs them (docs/consensus.md "Verdicts")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.consensus.helpers import PROGRAMS, run_check


def _cli(tmp_path, *args, timeout: float = 120) -> tuple[int, dict, str]:
    cmd = [
        sys.executable,
        "-m",
        "hctool",
        "check-consensus",
        "run",
        "--json",
        "--trace-dir",
        str(tmp_path / "trace"),
        *args,
    ]
    env = dict(os.environ)
    env.pop("HCTOOL_DEBUG", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    assert proc.stdout.startswith("{"), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize(
    "args, verdict, says",
    [
        (["--", "ls"], "no_process_group", "no process group was formed"),
        (["--", sys.executable, "-c", "print(1)"], "no_process_group", "no process group was formed"),
        (["--nproc", "2", "--", str(PROGRAMS / "no_init.py")], "no_process_group", "init_process_group"),
    ],
)
def test_nothing_seen_is_not_consistent(tmp_path, no_leftover_processes, args, verdict, says):
    code, report, err = _cli(tmp_path, *args)
    assert (code, report["verdict"], report["first_divergence"]) == (1, verdict, None), err[-2000:]
    assert says in report["reason"], report["reason"]
    assert report["coverage"]["traced_ranks"] == []


def test_a_timeout_before_the_first_collective_is_incomplete(tmp_path, no_leftover_processes):
    code, report, err = _cli(tmp_path, "--nproc", "2", "--timeout", "20", "--", str(PROGRAMS / "before_first_call.py"))
    assert (code, report["verdict"]) == (1, "incomplete"), report
    assert "before any rank made a collective call" in report["reason"]
    # the ranks were seen (their process group formed), with no calls, and hctool ended them
    assert report["coverage"]["traced_ranks"] == [0, 1] and report["coverage"]["ranks_with_calls"] == []
    assert report["exit_codes"] == {"0": None, "1": None}


@pytest.mark.parametrize(
    "extra",
    [[], ["--probe", "json:dumps"], ["--inject", "delay:fn=json:dumps,ms=1"]],
    ids=["plain", "probe-on-the-recorders-json", "fault-on-the-recorders-json"],
)
def test_the_program_cannot_detach_or_blind_its_traces(tmp_path, no_leftover_processes, extra):
    # the program drops every HCTOOL_ variable, and the probe or fault sits on a function the recorder
    # itself uses: the traces still belong to the run and are read, and only the program's own
    # json.dumps call counts
    code, report, err = run_check("edits_env.py", tmp_path, extra=extra)
    assert (code, report["verdict"]) == (0, "consistent"), (report, err[-2000:])
    assert report["counts"] == {"0": {"all_reduce": 3}, "1": {"all_reduce": 3}}
    if "--probe" in extra:
        assert report["probes"] == {"0": {"dumps": 1}, "1": {"dumps": 1}}
    if "--inject" in extra:
        assert report["faults"][0]["fired"] == {"0": 1, "1": 1}


def test_the_flight_recorder_tutorial_names_rank_0_and_its_extra_call(tmp_path, no_leftover_processes):
    """PyTorch's Flight Recorder tutorial example (rank 0 issues one extra all_reduce), run under
    check-consensus, and its Flight Recorder dumps analyzed: both name rank 0 and the extra call's
    line, where torch's analyzer names rank 1 'missing' at the symptom."""
    from tests.consensus.helpers import site

    extra = site("fr_tutorial.py", "extra")
    fr = tmp_path / "fr"
    fr.mkdir()
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", TORCH_FR_DUMP_TEMP_FILE=str(fr / "rank"))
    env.pop("HCTOOL_DEBUG", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(PROGRAMS / "fr_tutorial.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sorted(p.name for p in fr.iterdir()) == ["rank0", "rank1"], proc.stderr[-2000:]
    out = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "analyze", "--json", str(fr)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    first = json.loads(out.stdout)["first_divergence"]
    assert (first["kind"], first["culprit_ranks"], first["cause"]["site"]) == ("extra", [0], extra), first
    code, report, err = run_check("fr_tutorial.py", tmp_path / "run", extra=["--hang-after", "10"])
    first = report["first_divergence"]
    assert (code, first["kind"], first["culprit_ranks"], first["cause"]["site"]) == (1, "extra", [0], extra), first


def test_the_text_leads_with_the_cause_and_the_symptom(tmp_path, no_leftover_processes):
    from tests.consensus.helpers import site

    env = dict(os.environ)
    env.pop("HCTOOL_DEBUG", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--nproc",
            "2",
            "--trace-dir",
            str(tmp_path / "trace"),
            "--",
            str(PROGRAMS / "extra_same_shape.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(
        "DIVERGED  cause: rank 0, extra all_reduce at " + site("extra_same_shape.py", "extra")
    ), lines[:3]
    assert lines[1].startswith("symptom: rank 0 ") and "rank 1 " in lines[1], lines[:3]
    assert lines[2].startswith("confidence "), lines[:3]
    # the page made at the end and the one `hctool report` makes later show the same answer and stacks
    later = subprocess.run(
        [sys.executable, "-m", "hctool", "report", str(tmp_path / "trace"), "-o", str(tmp_path / "later.html")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert later.returncode == 0, later.stderr
    first_page = (tmp_path / "trace" / "report.html").read_text()
    again = (tmp_path / "later.html").read_text()
    stacks = json.loads((tmp_path / "trace" / "hctool-run.json").read_text())["stacks"]
    assert stacks, "the ranks alive at the finding have stacks"
    for page in (first_page, again):
        assert 'id="cause">cause: rank 0, extra all_reduce' in page
        assert page.count('<details class="stack"') == len(stacks), page[-3000:]
        for rank in stacks:
            assert f'<details class="stack" data-rank="{rank}"' in page


@pytest.mark.slow
def test_sixty_four_ranks_fold_into_classes(tmp_path, no_leftover_processes):
    """64 real gloo ranks, one deviating: the culprit and its line, and the ranks folded into
    classes (by calls, by stack), odd first, in the JSON, the text and the page."""
    from tests.consensus.helpers import site

    code, report, err = run_check(
        "many_ranks.py", tmp_path, nproc=64, extra=["--hang-after", "30", "--timeout", "600"], timeout=900
    )
    first = report["first_divergence"]
    assert first is not None, (report["verdict"], report.get("reason"), report.get("coverage"), err[-3000:])
    assert (code, first["culprit_ranks"], first["cause"]["site"]) == (1, [37], site("many_ranks.py", "extra")), first
    counts = report["count_classes"]
    assert counts[0]["ranks"] == "37" and counts[0]["counts"] == {"all_reduce": 21}, counts
    assert counts[1]["ranks"] == "0-36,38-63" and counts[1]["size"] == 63, counts
    stacks = report["stack_classes"]
    assert stacks[0]["ranks"] == "37" and any("many_ranks.py:" in f for f in stacks[0]["frames"]), stacks
    assert sum(c["size"] for c in stacks) == len(report["stacks"]), stacks
    page = (tmp_path / "trace" / "report.html").read_text()
    assert "Ranks by calls (2 classes, odd first)" in page and "0-36,38-63" in page and "Ranks by stack" in page
    text = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "analyze", str(tmp_path / "trace")],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert "count classes (2): rank 37: 21 (21 all_reduce); ranks 0-36,38-63:" in text, text[:2000]
    assert "stack classes" in text and text.count("--- stack of rank") <= len(stacks), text[:3000]
