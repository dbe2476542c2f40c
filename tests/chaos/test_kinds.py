"""A fault kind is one row (hctool/protocol/faults.py), one installer module or controller action,
one docs row and a behaviour test: adding a kind without any of them fails here. The behaviour
tests of kinds that had none elsewhere are below (real ranks, real seams, real processes)."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hctool.agent import faults as agent_faults
from hctool.protocol.faults import KIND, KINDS, Acts, Scope, parse_fault
from hctool.supervise.faults import FaultController

ROOT = Path(__file__).resolve().parents[2]

# kind -> the tests that show it acting (path::function); each must exist and name the kind.
BEHAVIOUR = {
    "clock-skew": ["tests/chaos/test_fault_hooks.py::test_skewed_clock_only_moves_forward"],
    "clock-jump": ["tests/chaos/test_fault_hooks.py::test_skewed_clock_only_moves_forward"],
    "clock-jitter": ["tests/chaos/test_fault_hooks.py::test_wall_clock_and_page_faults_share_the_hooks"],
    "thread-slow": ["tests/chaos/test_fault_hooks.py::test_thread_slow_holds_non_main_threads_only"],
    "collective-delay": ["tests/chaos/test_kinds.py::test_supervisor_and_rank_kinds_on_a_real_job"],
    "io-delay": ["tests/chaos/test_fault_hooks.py::test_io_delay_slows_reads_and_writes_of_matching_paths"],
    "cuda-sleep": ["tests/gpu/test_cuda_sleep_fault.py::test_cuda_sleep_waits_on_the_stream"],
    "delay": [
        "tests/consensus/test_inject_probe.py::test_probes_name_each_ranks_caller_and_faults_count_their_firings"
    ],
    "raise": ["tests/chaos/test_kinds.py::test_raise_and_kill_end_the_rank_they_name"],
    "h2d-sleep": ["tests/chaos/test_fault_hooks.py::test_seam_delays_follow_windows_and_probability"],
    "d2h-sleep": ["tests/chaos/test_fault_hooks.py::test_seam_delays_follow_windows_and_probability"],
    "free-delay": ["tests/chaos/test_fault_hooks.py::test_free_delay_defers_real_frees"],
    "host-pool-shrink": ["tests/chaos/test_fault_hooks.py::test_wall_clock_and_page_faults_share_the_hooks"],
    "storage-latency": ["tests/chaos/test_kinds.py::test_storage_latency_delays_real_reads"],
    "storage-error": ["tests/chaos/test_fault_hooks.py::test_storage_faults_on_a_real_file_store"],
    "storage-timeout": ["tests/chaos/test_fault_hooks.py::test_storage_faults_on_a_real_file_store"],
    "storage-partial": ["tests/chaos/test_fault_hooks.py::test_storage_faults_on_a_real_file_store"],
    "storage-miss": ["tests/chaos/test_fault_hooks.py::test_wall_clock_and_page_faults_share_the_hooks"],
    "kv-send-delay": ["tests/chaos/test_kinds.py::test_pd_kinds_reach_their_seams"],
    "kv-drop": ["tests/chaos/test_kinds.py::test_pd_kinds_reach_their_seams", "tests/engine/test_pd.py"],
    "bootstrap-delay": ["tests/chaos/test_kinds.py::test_pd_kinds_reach_their_seams"],
    "rank-pause": [
        "tests/chaos/test_kinds.py::test_supervisor_and_rank_kinds_on_a_real_job",
        "tests/engine/test_launch_inject.py::test_launch_inject_pauses_the_rank_it_names",
    ],
    "rank-kill": ["tests/chaos/test_kinds.py::test_raise_and_kill_end_the_rank_they_name"],
    "request-burst": ["tests/chaos/test_chaos_run.py"],
    "request-cancel": ["tests/chaos/test_kinds.py::test_workload_kinds_go_to_the_workload_with_their_n_and_ms"],
}


@pytest.mark.parametrize("kind", [k.name for k in KINDS if k.acts is Acts.RANK])
def test_every_rank_kind_has_its_installer(kind):
    module = agent_faults.family_module(KIND[kind].family)
    assert kind in module.KINDS and callable(module.install), f"hctool/agent/faults/{KIND[kind].family}.py"


def test_installer_modules_carry_only_their_family():
    folder = Path(agent_faults.__file__).parent
    for path in sorted(folder.glob("*.py")):
        if path.stem in ("__init__", "common"):
            continue
        module = agent_faults.family_module(path.stem)
        assert module.KINDS, path
        for kind in module.KINDS:
            assert KIND[kind].family == path.stem and KIND[kind].acts is Acts.RANK, (path, kind)


@pytest.mark.parametrize("kind", [k.name for k in KINDS if k.acts is not Acts.RANK])
def test_every_outside_kind_has_a_controller_action(kind):
    assert callable(getattr(FaultController, FaultController.ACTIONS[kind]))


@pytest.mark.parametrize("kind", [k.name for k in KINDS])
def test_every_drawable_kind_has_a_range(kind):
    row = KIND[kind]
    if row.by_name:  # exploration cannot make up a function of the program: refused, not drawn at 0
        assert row.draw is None and not row.drawn_for
        return
    assert row.draw is not None, f"{kind}: no draw range: exploration would draw it at 0"
    lo, hi = row.draw
    assert 0 <= lo <= hi and (hi > 0) == row.needs_magnitude, kind
    assert (row.count is not None) == row.needs_n, kind


def test_defaults_drawn_per_target_can_act_there():
    for scope in (Scope.ENGINE, Scope.ANY):
        for row in KINDS:
            if scope in row.drawn_for:
                assert scope is Scope.ENGINE or row.scope is Scope.ANY, row.name


@pytest.mark.parametrize("kind", [k.name for k in KINDS])
def test_every_kind_has_a_docs_row(kind):
    rows = [line for line in (ROOT / "docs" / "chaos.md").read_text().splitlines() if line.startswith("|")]
    assert any(f"`{kind}`" in line for line in rows), f"docs/chaos.md has no table row for {kind}"


@pytest.mark.parametrize("kind", [k.name for k in KINDS])
def test_every_kind_has_a_behaviour_test(kind):
    assert BEHAVIOUR.get(kind), f"{kind}: name the test that shows it acting in BEHAVIOUR"
    for ref in BEHAVIOUR[kind]:
        path, _, name = ref.partition("::")
        source = (ROOT / path).read_text()
        if name:
            fn = next(
                (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name), None
            )
            assert fn is not None, ref
            source = ast.get_source_segment(source, fn)
        assert kind in source, f"{ref} does not use {kind}"


# -- behaviour of kinds that had no test of their own ---------------------------------------------

JOB = """
import time, torch, torch.distributed as dist

def step(t):
    dist.all_reduce(t)

dist.init_process_group("gloo")
t = torch.ones(1)
for i in range(30):
    step(t)
    time.sleep(0.05)
print("sum", t.item())
dist.destroy_process_group()
"""


def _check(tmp_path, *inject: str, timeout: float = 120) -> tuple[int, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    program = tmp_path / "job.py"
    program.write_text(textwrap.dedent(JOB))
    args = [a for spec in inject for a in ("--inject", spec)]
    cmd = [sys.executable, "-m", "hctool", "check-consensus", "run", "--json", "--nproc", "2", "--hang-after", "3"]
    cmd += ["--timeout", "60", "--trace-dir", str(tmp_path / "trace"), *args, "--", str(program)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    assert proc.stdout.startswith("{"), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def _fired(report: dict) -> dict[str, dict]:
    return {f["spec"].split(":")[0]: f["fired"] for f in report["faults"]}


def test_supervisor_and_rank_kinds_on_a_real_job(tmp_path, no_leftover_processes):
    """collective-delay acts before each of rank 1's collectives only; rank-pause stops rank 0
    once, from the supervisor; the job stays consistent (a fault is timing, never a collective)."""
    code, report = _check(tmp_path, "collective-delay:rank=1,ms=20", "rank-pause:rank=0,start_s=0.2,ms=400")
    assert (code, report["verdict"]) == (0, "consistent"), report["reason"]
    fired = _fired(report)
    assert set(fired["collective-delay"]) == {"1"} and fired["collective-delay"]["1"] >= 30, fired
    assert fired["rank-pause"] == {"0": 1}, fired


@pytest.mark.slow
def test_raise_and_kill_end_the_rank_they_name(tmp_path, no_leftover_processes):
    code, report = _check(tmp_path / "raise", "raise:fn=__main__:step,exc=RuntimeError,rank=1,start_s=0.3")
    assert (code, report["verdict"]) == (1, "crashed") and _fired(report)["raise"] == {"1": 1}, report
    # a killed rank ends the job at once (as torchrun ends it), not at --timeout
    code, report = _check(tmp_path / "kill", "rank-kill:rank=1,start_s=0.3")
    assert (code, report["verdict"], report["exit_codes"]["1"]) == (1, "crashed", -9), report
    assert _fired(report)["rank-kill"] == {"1": 1}


@pytest.fixture
def fault_clock(tmp_path, monkeypatch):
    clock = tmp_path / "t0"
    monkeypatch.setenv("HCTOOL_FAULTS_T0", str(clock))
    clock.write_text(repr(time.time()))
    yield
    from engine.lab.seams import SEAMS
    from hctool.agent import names

    SEAMS.reset()
    names.reset()


def test_pd_kinds_reach_their_seams(fault_clock):
    from engine.lab.seams import SEAMS

    faults = [parse_fault(s) for s in ("kv-send-delay:ms=40", "kv-drop:start_s=60", "bootstrap-delay:ms=70")]
    agent_faults.install_with(agent_faults.FaultClock(faults, 0), faults)
    assert (SEAMS.kv_send_delay_ms(), SEAMS.kv_dropped(), SEAMS.bootstrap_delay_ms()) == (40, False, 70)
    faults = [parse_fault("kv-drop")]
    agent_faults.install_with(agent_faults.FaultClock(faults, 0), faults)
    assert SEAMS.kv_dropped() is True


def test_storage_latency_delays_real_reads(fault_clock, tmp_path):
    import torch

    from engine.mem_cache import hicache_storage as storage
    from engine.mem_cache.memory_pool import KVPool

    cls = storage.HiCacheFile
    saved = cls.batch_get, cls.batch_exists
    pool = KVPool(4, 4, 1, 1, 2, torch.device("cpu"))
    store = cls(str(tmp_path / "store"), 0, 1)
    store.batch_set(["a"], pool, [0])
    try:
        faults = [parse_fault("storage-latency:ms=150")]
        agent_faults.install_with(agent_faults.FaultClock(faults, 0), faults)
        t = time.monotonic()
        store.batch_get(["a"], pool, [1])
        assert time.monotonic() - t >= 0.15
        t = time.monotonic()
        store.batch_exists(["a"])  # only reads wait
        assert time.monotonic() - t < 0.15
    finally:
        cls.batch_get, cls.batch_exists = saved


def test_workload_kinds_go_to_the_workload_with_their_n_and_ms(tmp_path):
    sent = []
    faults = [parse_fault("request-cancel:n=3,ms=80"), parse_fault("request-burst:n=2,p=0")]
    fc = FaultController(faults, tmp_path / "clock", seed=1, workload=sent.append)
    fc.started()
    fc.tick({})  # no rank needed: the client side sends them
    assert [(f.kind, f.n, f.ms) for f in sent] == [("request-cancel", 3, 80.0)]  # p=0: never
    assert {c["spec"]: c["fired"] for c in fc.counts()} == {faults[0].spec(): {"client": 1}, faults[1].spec(): {}}


def test_a_pause_without_a_rank_stops_every_rank_and_release_continues_them(tmp_path):
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        import psutil

        fc = FaultController([parse_fault("rank-pause:ms=60000")], tmp_path / "clock")
        fc.started()
        fc.tick({0: sleepers[0].pid, 1: sleepers[1].pid})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            psutil.Process(p.pid).status() != psutil.STATUS_STOPPED for p in sleepers
        ):
            time.sleep(0.05)
        assert [psutil.Process(p.pid).status() for p in sleepers] == [psutil.STATUS_STOPPED] * 2
        fc.release()
        time.sleep(0.2)
        assert psutil.STATUS_STOPPED not in [psutil.Process(p.pid).status() for p in sleepers]
    finally:
        for p in sleepers:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
