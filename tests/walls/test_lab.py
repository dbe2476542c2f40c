"""engine.lab, the engine's one surface for the tool: every name it declares resolves in the
engine, every seam is called by the engine and installed by the agent, and the tick snapshot
feeds the agent's chaos observer from a real scheduler. A rename on either side fails here."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import time

import pytest
import torch.distributed as dist

import engine.lab as lab
from engine.lab.seams import DECLARED, POINTS, SEAMS
from hctool.supervise.procs import free_port
from tests.walls.imports import REPO


def _engine_source() -> str:
    return "\n".join(p.read_text() for p in (REPO / "engine").rglob("*.py") if "lab" not in p.parts)


def test_the_surface_lists_what_it_serves():
    for name in lab.__all__:
        assert getattr(lab, name) is not None, name
    # what a type checker sees (the TYPE_CHECKING imports) is what the lab serves, by the same names
    tree = ast.parse((REPO / "engine" / "lab" / "__init__.py").read_text())
    typed = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert typed == set(lab.__all__) - {"ENGINE_ROOT"} == set(lab._SURFACE)
    with pytest.raises(AttributeError, match="the surface is"):
        lab.HiRadixCache  # noqa: B018 - internals are not on the surface


@pytest.mark.parametrize("point", sorted(POINTS))
def test_every_point_resolves(point):
    target = POINTS[point]
    if ":" in target:
        module, qual = target.split(":")
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        assert callable(obj)
    elif "." in target:
        importlib.import_module(target)
    else:  # a thread the engine starts under this name
        assert re.search(rf'name="{re.escape(target)}"', _engine_source()), target


@pytest.mark.parametrize("seam", sorted(DECLARED))
def test_every_seam_is_called_by_the_engine(seam):
    assert re.search(rf"SEAMS\.{seam}\(", _engine_source()), f"the engine never calls SEAMS.{seam}"


def test_the_agent_installs_every_seam_by_its_declared_name(tmp_path, monkeypatch):
    from hctool.agent import faults as agent_faults
    from hctool.agent import names
    from hctool.protocol.faults import ENGINE, parse_fault

    monkeypatch.setenv("HCTOOL_FAULTS_T0", str(tmp_path / "t0"))
    specs = {k: f"{k}:pages=1" if k in ("host-pool-shrink", "storage-miss") else f"{k}:ms=1" for k in ENGINE}
    faults = [parse_fault(s) for s in specs.values()]
    try:
        agent_faults.install_with(agent_faults.FaultClock(faults, 0), faults)
        defaults = {name: default for name, (_, default) in DECLARED.items()}
        assert [n for n in DECLARED if getattr(SEAMS, n) is defaults[n]] == []
    finally:
        SEAMS.reset()
        names.reset()
    with pytest.raises(KeyError, match="no engine seam named"):
        SEAMS.install(copy_delay=lambda s: 0.0)


def test_variant_flags_come_from_the_one_table():
    from engine.lab import VARIANTS, ServerArgs

    help_text = ServerArgs.cli_help()
    for v in VARIANTS:
        assert v.flag in help_text and v.default == v.choices[0]
        assert ServerArgs.from_cli([v.flag, v.choices[-1]]).variants.non_default() == (
            {} if len(v.choices) == 1 else {v.name: v.choices[-1]}
        )


@pytest.fixture
def world_of_one():
    created = not dist.is_initialized()
    if created:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    if created:
        dist.destroy_process_group()


def test_a_real_schedulers_snapshot_feeds_the_chaos_observer(world_of_one, tmp_path):
    """One rank's Scheduler, in this process, running its real event loop on two requests that
    share a prefix, with the agent's chaos observer added as a tick observer: each snapshot is
    consistent (check_accounting), and the observer writes the accounting a chaos checker reads."""
    import torch

    from engine.lab import ServerArgs, add_tick_observer, check_accounting
    from engine.lab import snapshot as snapshot_module
    from engine.managers.io_struct import GenerateReqOutput, SamplingParams, ShutdownReq, TokenizedGenerateReqInput
    from engine.managers.scheduler import Scheduler
    from hctool.agent.chaos_observer import ChaosObserver

    cpu_group, io_group = world_of_one
    args = ServerArgs(
        enable_hierarchical_cache=True,
        hicache_ratio=4,
        max_total_tokens=512,
        page_size=16,
        hicache_storage_backend="file",
        hicache_storage_dir=str(tmp_path / "store"),
        run_dir=str(tmp_path),
    )
    requests = [
        TokenizedGenerateReqInput(
            f"r{i}", list(range(1, 49)) + [100 + i], SamplingParams(max_new_tokens=3, temperature=0.0)
        )
        for i in range(2)
    ]
    answers, checked = [], []
    quiesce = tmp_path / "quiesce-rank0.json"
    deadline = time.monotonic() + 60

    def recv(timeout):
        if requests:
            return [requests.pop(), requests.pop()]
        time.sleep(timeout)
        done = sum(isinstance(a, GenerateReqOutput) for a in answers) == 2
        settled = quiesce.exists() and json.loads(quiesce.read_text())["in_flight"] == 0
        return [ShutdownReq()] if (done and settled) or time.monotonic() > deadline else []

    observer = ChaosObserver(str(tmp_path), starve_ticks=1000)
    add_tick_observer(observer)
    add_tick_observer(lambda snap: (check_accounting(snap), checked.append(snap.tick)))
    s = Scheduler(
        args, 0, 1, cpu_group, io_group, torch.device("cpu"), recv_from_frontend=recv, send_to_frontend=answers.append
    )
    try:
        s.event_loop()
    finally:
        s.close()
        snapshot_module._OBSERVERS.clear()
    assert time.monotonic() < deadline and sum(isinstance(a, GenerateReqOutput) for a in answers) == 2, answers
    record = json.loads(quiesce.read_text())
    assert record["l1"]["free"] + record["l1"]["cached"] + record["l1"]["in_use"] == record["l1"]["total"]
    assert record["l2"]["free"] + record["l2"]["used"] == record["l2"]["total"]
    assert record["l1"]["cached"] >= 3 and not record["locked_nodes"] and record["in_flight"] == 0
    assert not observer.failed and len(checked) > 3
