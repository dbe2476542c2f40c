"""`hctool repro 36928` (PD decode poll sized by rank-local queues) end to end."""

from __future__ import annotations

import json
import subprocess

import pytest

from hctool.repro.catalogue import builtin_dir
from hctool.repro.scenario import load_scenario


def test_builtin_36928_is_a_pd_scenario():
    s = load_scenario(builtin_dir() / "36928" / "scenario.toml")
    assert s.pd and s.prefill_tp == 1 and s.tp == 2
    assert s.server_args(s.variant("queue")).variants.decode_poll == "queue"
    assert s.server_args(s.variant("fixed")).variants.decode_poll == "fixed"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_repro_36928_bug_and_fix(hctool_cmd, clean_env, tmp_path, no_leftover_processes):
    out = subprocess.run(
        hctool_cmd + ["repro", "36928", "--json", "--artifacts", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=540,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    variants = {v["name"]: v for v in json.loads(out.stdout)["variants"]}
    bug = variants["queue"]
    assert bug["ok"] and bug["first_divergence"] is not None, bug
    functions = {e.get("function") for e in bug["first_divergence"]["ranks"].values()}
    assert "poll_and_all_reduce" in functions or "_poll_queue_sized" in functions, bug["first_divergence"]
    fixed = variants["fixed"]
    assert fixed["verdict"] == "healthy" and fixed["ok"], fixed
