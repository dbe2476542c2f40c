"""`hctool repro 22607` (PP + HiCache stage divergence) and `hctool repro 28774` (a DP replica
with zero tokens skips coordinate_batch_across_dp) end to end: real ranks, real gloo."""

from __future__ import annotations

import json
import subprocess

import pytest

from hctool.repro.catalogue import builtin_dir
from hctool.repro.scenario import load_scenario


def test_builtin_22607_runs_two_stages_with_each_sync():
    s = load_scenario(builtin_dir() / "22607" / "scenario.toml")
    syncs = {v.name: s.server_args(v).variants.pp_hicache_sync for v in s.variants}
    assert syncs == {"per-stage": "per-stage", "stage0-authoritative": "stage0", "min-reduced": "min"}
    args = s.server_args(s.variants[0])
    assert (args.pp_size, args.tp_size, args.world_size) == (2, 1, 2)


def test_builtin_28774_runs_two_replicas_with_and_without_the_idle_step():
    s = load_scenario(builtin_dir() / "28774" / "scenario.toml")
    steps = {v.name: s.server_args(v).variants.dp_idle_step for v in s.variants}
    assert steps == {"skip": "skip", "idle-step": "idle"}
    assert s.server_args(s.variants[0]).world_size == 2


def run_repro(hctool_cmd, clean_env, tmp_path, rid: str) -> dict:
    out = subprocess.run(
        hctool_cmd + ["repro", rid, "--json", "--artifacts", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=540,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return {v["name"]: v for v in json.loads(out.stdout)["variants"]}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_repro_28774_skip_hangs_in_coordinate_and_the_idle_step_is_healthy(
    hctool_cmd, clean_env, tmp_path, no_leftover_processes
):
    variants = run_repro(hctool_cmd, clean_env, tmp_path, "28774")
    bug = variants["skip"]
    assert bug["ok"] and bug["verdict"] in ("deadlocked", "crashed", "diverged"), bug
    assert any("coordinate_batch_across_dp" in e for e in bug["mechanism"]["evidence"]), bug["mechanism"]
    fixed = variants["idle-step"]
    assert fixed["verdict"] == "healthy" and fixed["ok"], fixed


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_repro_22607_per_stage_parts_the_stages_and_both_fixes_are_healthy(
    hctool_cmd, clean_env, tmp_path, no_leftover_processes
):
    variants = run_repro(hctool_cmd, clean_env, tmp_path, "22607")
    bug = variants["per-stage"]
    assert bug["ok"] and bug["first_divergence"] is not None, bug
    shapes = {tuple(map(tuple, e["shapes"])) for e in bug["first_divergence"]["ranks"].values() if e.get("shapes")}
    assert any("recv_proxy_tensors" in e for e in bug["mechanism"]["evidence"]), bug["mechanism"]
    assert len(shapes) == 2, f"stage 0 sent one shape, stage 1 received another: {shapes}"
    for name in ("stage0-authoritative", "min-reduced"):
        assert variants[name]["verdict"] == "healthy" and variants[name]["ok"], variants[name]
