"""`hctool repro 29483` (PD decode local restore) end to end, as a user runs it:
a real PD topology (prefill TP1, decode TP2, router), real TCP KV transfer, real
gloo, the H2D fault on decode rank 1 and the observe-only phase probe."""

from __future__ import annotations

import json
import subprocess

import pytest

from hctool.repro.catalogue import builtin_dir
from hctool.repro.scenario import load_scenario


def test_builtin_29483_is_a_pd_scenario():
    s = load_scenario(builtin_dir() / "29483" / "scenario.toml")
    assert s.pd and s.prefill_tp == 1 and s.tp == 2 and s.require_load_back
    assert [v.name for v in s.variants] == ["event", "slot"]
    assert s.server_args(s.variant("event")).variants.decode_restore_gate == "event"
    assert s.server_args(s.variant("slot")).disaggregation_decode_enable_radix_cache


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_repro_29483_bug_and_fix(hctool_cmd, clean_env, tmp_path, no_leftover_processes):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        hctool_cmd + ["repro", "29483", "--json", "--artifacts", str(run_dir)],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=540,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    variants = {v["name"]: v for v in json.loads(out.stdout)["variants"]}

    bug = variants["event"]
    assert bug["ok"] and bug["verdict"] in ("crashed", "diverged", "deadlocked"), bug
    fd = bug["first_divergence"]
    assert fd is not None, bug
    sites = {e.get("site", "") for e in fd["ranks"].values()}
    # One rank entered loading_check from Phase A, the other from the Phase B gate.
    assert len(sites) == 2 and all(s.startswith("decode_hicache_mixin.py:") for s in sites), fd

    fixed = variants["slot"]
    assert fixed["verdict"] == "healthy" and fixed["ok"], fixed
    assert fixed["requests"]["succeeded"] == fixed["requests"]["sent"] > 0
    assert all(x > 0 for x in fixed["load_back_tokens_by_round"][1:]), fixed["load_back_tokens_by_round"]
    for name in variants:
        vdir = run_dir / name
        assert (vdir / "decode-rank1.log").exists() and (vdir / "router.log").exists()
        assert list((vdir / "traces").glob("rank*.jsonl"))
