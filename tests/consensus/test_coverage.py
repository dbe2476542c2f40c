"""Collectives torch issues itself (DDP's reducer, FSDP2, clip_grad_norm_,
distributed checkpoint) and the divergence classes that used to be misnamed,
run for real on gloo through `hctool check-consensus run`."""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.consensus.helpers import latency_ms, run_check, site

# These findings never wait for --hang-after (an exit, a cycle, a mismatch): a long one keeps
# a rank that starts seconds late on a loaded box from looking hung at its first call.
SLOW_START = ["--hang-after", "15"]


def _counts(report: dict, trace_dir) -> dict[str, dict[str, int]]:
    """Per rank per op, from the report (`counts`) or else from the traces."""
    if report.get("counts"):
        return report["counts"]
    from hctool.consensus.trace import TraceDirReader

    out: dict[str, collections.Counter] = {}
    for ev in TraceDirReader(str(trace_dir)).poll():
        out.setdefault(str(ev["rank"]), collections.Counter())[ev["op"]] += 1
    return {r: dict(c) for r, c in out.items()}


def _summary(report: dict) -> tuple:
    f = report["first_divergence"]
    return report["verdict"], f["group"], f["kind"], f["culprit_ranks"]


def _printed_reduces(trace_dir) -> int:
    """DDP's own bucket all-reduce count plus the program's all_reduces, as rank 0 printed them."""
    printed = (trace_dir / "rank0.log").read_text()
    m = re.search(r"ddp_bucket_allreduces=(\d+) user_allreduces=(\d+)", printed)
    assert m, printed[-2000:]
    assert int(m.group(1)) > 6  # several buckets per step: the reducer's calls, not one per step
    return int(m.group(1)) + int(m.group(2))


@pytest.mark.slow
def test_ddp_buckets_all_counted(tmp_path, no_leftover_processes):
    code, report, stderr = run_check("ddp_train.py", tmp_path, fix=True, extra=SLOW_START)
    assert (report["verdict"], code) == ("consistent", 0), stderr[-3000:]
    expected = _printed_reduces(tmp_path / "trace")
    counts = _counts(report, tmp_path / "trace")
    for rank in ("0", "1"):
        assert counts[rank]["all_reduce"] == expected, counts
        assert counts[rank]["broadcast"] >= 1, counts  # DDP's start-up parameter broadcast


def test_ddp_uneven_inputs_named_at_backward(tmp_path, no_leftover_processes):
    code, report, stderr = run_check("ddp_train.py", tmp_path, extra=SLOW_START)
    assert _summary(report) == ("diverged", "0:[0,1]", "extra", [1]), (report, stderr[-3000:])
    assert code == 1
    culprit = report["first_divergence"]["ranks"]["1"]
    assert (culprit["op"], culprit["site"]) == ("all_reduce", site("ddp_train.py", "backward")), culprit
    assert report["first_divergence"]["ranks"]["0"]["state"] == "absent"
    latency = latency_ms(stderr)
    assert latency is not None and latency < 2000, stderr[-2000:]
    # every bucket all-reduce of rank 0 (which ran to the end) is counted
    assert _counts(report, tmp_path / "trace")["0"]["all_reduce"] == _printed_reduces(tmp_path / "trace")


@pytest.mark.slow  # the same rule runs in the default suite on synthetic traces (test_align_pairs.py)
def test_outside_any_collective_is_missing(tmp_path, no_leftover_processes):
    """Rank 1 alive in a queue wait while rank 0 waits in a barrier at a new site."""
    code, report, stderr = run_check("outside_collective.py", tmp_path)
    assert _summary(report) == ("hung", "0:[0,1]", "missing", [1]), (report, stderr[-3000:])
    ranks = report["first_divergence"]["ranks"]
    assert ranks["1"]["state"] == "absent" and ranks["0"]["site"] == site("outside_collective.py", "barrier")
    # the absent rank's stack shows where it is instead
    assert f"outside_collective.py:{site('outside_collective.py', 'stall').split(':')[1]}" in report["stacks"]["1"]


def test_silent_pairing_names_inserter_and_cycle_is_immediate(tmp_path, no_leftover_processes):
    """The extra subgroup call pairs with the peer's next same-shape call; then the
    two ranks wait on each other across groups. Reported before --hang-after (1.5 s)."""
    code, report, stderr = run_check("subgroup_pairs.py", tmp_path, extra=SLOW_START)
    assert _summary(report) == ("diverged", "1:[0,1]", "extra", [0]), (report, stderr[-3000:])
    ranks = report["first_divergence"]["ranks"]
    assert "rank 0 waits in 1:[0,1]" in report["first_divergence"]["deadlock"], report["first_divergence"]
    assert ranks["0"]["site"] == site("subgroup_pairs.py", "extra")
    assert ranks["1"]["site"] == site("subgroup_pairs.py", "mlp")
    latency = latency_ms(stderr)
    assert latency is not None and latency < 1500, stderr[-2000:]
    # Gathered from several hosts: one subfolder per host, ranks from RANK; same finding.
    gathered = tmp_path / "gathered"
    for rank in (0, 1):
        host = gathered / f"host{rank}"
        host.mkdir(parents=True)
        for f in (tmp_path / "trace").glob(f"rank{rank}-*"):
            if not f.name.endswith(".log"):
                shutil.copy(f, host / f.name)
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "analyze", "--json", str(gathered)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.startswith("{"), proc.stderr[-2000:]
    offline = json.loads(proc.stdout)
    first = offline["first_divergence"]
    assert (offline["world_size"], first["group"], first["kind"], first["culprit_ranks"]) == (
        2,
        "1:[0,1]",
        "extra",
        [0],
    )


@pytest.mark.slow
def test_clean_twins_are_consistent(tmp_path, no_leftover_processes):
    for program in ("outside_collective.py", "subgroup_pairs.py"):
        code, report, stderr = run_check(program, tmp_path / program, fix=True, extra=SLOW_START)
        assert (report["verdict"], code) == ("consistent", 0), (program, stderr[-3000:])


@pytest.mark.slow
@pytest.mark.parametrize("fix", [pytest.param(True, id="clean"), pytest.param(False, id="extra-step")])
def test_fsdp2_every_collective_has_a_call_site(fix, tmp_path, no_leftover_processes):
    """FSDP2 on gloo: forward/backward all-gathers, backward reduce-scatters,
    clip_grad_norm_ over DTensor grads, distributed checkpoint save."""
    from hctool.consensus.trace import TraceDirReader

    code, report, stderr = run_check(
        "fsdp2_train.py", tmp_path, fix=fix, extra=SLOW_START, args=[str(tmp_path / "ckpt")]
    )
    trace = tmp_path / "trace"
    events = TraceDirReader(str(trace)).poll()
    lines = {m: site("fsdp2_train.py", m) for m in ("forward", "backward", "clip", "save")}
    by_site = collections.Counter((ev["rank"], ev["op"], ev["site"]) for ev in events)
    for rank in (0, 1):
        assert by_site[(rank, "all_gather_into_tensor", lines["forward"])] > 0, by_site
        assert by_site[(rank, "reduce_scatter_tensor", lines["backward"])] > 0, by_site
        assert by_site[(rank, "all_reduce", lines["clip"])] == 3, by_site  # one per clip_grad_norm_
        if fix:  # the divergent run is ended before the save
            assert any(s == lines["save"] for (r, _op, s) in by_site if r == rank), by_site
    assert all(ev["site"] and ev["site"].startswith("fsdp2_train.py:") for ev in events), [
        ev for ev in events if not (ev["site"] or "").startswith("fsdp2_train.py:")
    ][:3]
    if fix:
        assert (report["verdict"], code) == ("consistent", 0), stderr[-3000:]
    else:
        # Rank 0 is in the checkpoint's gather_object while rank 1 all-gathers for its extra
        # step: gloo fails both right there, so no later call says who inserted (on NCCL the
        # calls pair up and the block of the extra step names rank 1, docs/consensus.md).
        first = report["first_divergence"]
        assert report["verdict"] == "diverged" and 1 in first["culprit_ranks"], (report, stderr[-3000:])
        assert first["ranks"]["1"]["site"] == lines["forward"]


def _compiled_step_run(tmp_path, fix: bool) -> tuple[int, dict, str, dict]:
    code, report, stderr = run_check("compiled.py", tmp_path, fix=fix, extra=SLOW_START)
    return code, report, stderr, _counts(report, tmp_path / "trace")


def test_compiled_graph_collectives_are_seen(tmp_path, no_leftover_processes):
    """torch.compile(fullgraph=True) of a step holding dist.all_reduce and a functional
    all_reduce: the compiled graph's calls are recorded (2 a step), and rank 1's extra
    step is named at the compiled function, called from the step line."""
    code, report, stderr, counts = _compiled_step_run(tmp_path, fix=False)
    assert _summary(report) == ("diverged", "0:[0,1]", "extra", [1]), (report, stderr[-3000:])
    assert code == 1
    assert counts["0"] == {"all_reduce": 4} and counts["1"] == {"all_reduce": 5}, counts
    culprit = report["first_divergence"]["ranks"]["1"]
    assert culprit["site"].startswith("compiled.py:"), culprit
    assert any(s.startswith(site("compiled.py", "step") + " ") for s in culprit["stack"]), culprit


@pytest.mark.slow
def test_compiled_graph_clean_twin_is_consistent(tmp_path, no_leftover_processes):
    code, report, stderr, counts = _compiled_step_run(tmp_path, fix=True)
    assert (report["verdict"], code) == ("consistent", 0), stderr[-3000:]
    assert counts == {"0": {"all_reduce": 4}, "1": {"all_reduce": 4}}, counts


def test_cpp_issued_calls_complete_while_the_program_idles(tmp_path, no_leftover_processes):
    """A C++-issued call's record completes by polling its Work future; when no
    further call comes to poll at, the recorder's watcher thread does it."""
    _code, report, stderr = run_check("idle_after_cpp_call.py", tmp_path)
    assert report["verdict"] == "crashed", stderr[-2000:]  # it SIGKILLs itself, as it should
    for rank in (0, 1):
        log = (tmp_path / "trace" / f"rank{rank}.log").read_text()
        states = json.loads(log.split("STATES ", 1)[1].splitlines()[0])
        assert states == [["all_reduce", "completed"]] * 3, log[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_graph_collectives_are_seen_with_inductor(tmp_path, monkeypatch, no_leftover_processes):
    """The same step compiled by inductor (generated C++ for the arithmetic, the
    collectives still `_c10d_functional` ops): counted, and rank 1's extra step named.
    Slow: a cold inductor compile takes minutes on this box (7.9 s for the whole run warm)."""
    monkeypatch.setenv("PROG_BACKEND", "inductor")
    code, report, stderr = run_check(
        "compiled.py", tmp_path, extra=["--timeout", "800", "--hang-after", "60"], timeout=850
    )
    assert _summary(report) == ("diverged", "0:[0,1]", "extra", [1]), (report, stderr[-3000:])
    assert report["counts"] == {"0": {"all_reduce": 4}, "1": {"all_reduce": 5}}, report["counts"]
    culprit = report["first_divergence"]["ranks"]["1"]
    assert culprit["site"].startswith("compiled.py:"), culprit
    assert any(s.startswith(site("compiled.py", "step") + " ") for s in culprit["stack"]), culprit
