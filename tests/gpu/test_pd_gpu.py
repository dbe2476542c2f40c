"""PD on CUDA: prefill TP1 on GPU 0, decode TP1 on GPU 1 (NCCL inside each side, KV over
TCP between them), with the decode keeping a radix cache and HiCache so the second
round restores prefixes from decode's L2 through real CUDA streams. Every answer must
equal a TP1 no-cache server's on CUDA."""

from __future__ import annotations

import pytest
import requests

from engine.server_args import ServerArgs
from hctool.launch import PDTopology, Topology
from tests.engine.test_pd import generate_all, pd_prompts


def load_back_tokens(url: str) -> int:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("hicache_load_back_tokens_total "):
            return int(float(line.split()[1]))
    return -1


@pytest.mark.two_gpus
def test_pd_prefill_gpu0_decode_gpu1_matches_tp1(tmp_path, no_leftover_processes):
    prompts = pd_prompts()
    ref_args = ServerArgs(tp_size=1, device="cuda", disable_radix_cache=True, max_total_tokens=2048)
    with Topology(ref_args, tmp_path / "ref") as topo:
        reference = [a["output_ids"] for a in generate_all(topo.start(timeout=240), prompts)]
    args = ServerArgs(
        device="cuda",
        max_total_tokens=256,
        disaggregation_decode_enable_radix_cache=True,
        enable_hierarchical_cache=True,
        hicache_ratio=4,
    )
    with PDTopology(args, 1, 1, tmp_path / "pd") as pd:
        url = pd.start(timeout=240)
        assert [a["output_ids"] for a in generate_all(url, prompts)] == reference, "round 1"
        # A long distinct prompt pushes round 1's prefixes out of decode's 16-page L1
        # (they stay in L2, backed up by write_through), so round 2 restores them locally.
        for seed in (1, 2):
            generate_all(url, [[(seed * 7919 + i) % 30000 + 1 for i in range(200)]])
        assert [a["output_ids"] for a in generate_all(url, prompts)] == reference, "round 2"
        loaded = load_back_tokens(url)
        print("decode load-back tokens:", loaded)
        assert loaded > 0, "round 2 restored nothing from decode L2"
        assert pd.dead() == []
    logs = (tmp_path / "pd" / "decode-rank0.log").read_text()
    assert "on cuda:1" in logs, logs[-2000:]
    assert "on cuda:0" in (tmp_path / "pd" / "prefill-rank0.log").read_text()
