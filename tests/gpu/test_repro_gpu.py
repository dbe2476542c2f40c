"""`hctool repro ID --cuda` gives the verdicts the scenario expects, with the model and KV pools
on the GPU (ranks share one GPU through gloo where there is one; NCCL with a GPU per rank)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(600)
@pytest.mark.parametrize("incident", ["26921", "29483"])
def test_repro_on_cuda_matches_the_cpu_verdicts(incident, tmp_path, no_leftover_processes):
    out = subprocess.run(
        [sys.executable, "-m", "hctool", "repro", incident, "--cuda", "--json", "--artifacts", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=560,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for v in json.loads(out.stdout)["variants"]:
        assert v["ok"] and v["verdict"] in v["expected"], v
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*rank*.log"))
    assert "ready on cuda:" in logs and "ready on cpu" not in logs
