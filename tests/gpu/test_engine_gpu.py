"""The engine's correctness checks with --device cuda: TP=2 over NCCL equals TP=1, KV
round-trips exactly through real CUDA streams/events and pinned host memory, and
serving (every tier, the policy combinations of CI) gives the no-cache tokens."""

from __future__ import annotations

import pytest
import torch

from engine.model_executor.model import TinyTransformer
from engine.server_args import ModelConfig
from tests.engine import test_engine_cache as cache
from tests.engine import test_engine_serving as serving
from tests.engine.engine_tp_worker import compute_cases, run_tp_workers
from tests.engine.test_engine_cache import groups, tiers  # noqa: F401 - fixtures

CUDA = torch.device("cuda:0")


@pytest.mark.two_gpus
def test_tp2_nccl_matches_tp1(tmp_path, no_leftover_processes):
    ref_cpu = compute_cases(TinyTransformer(ModelConfig(), 0, 1, torch.device("cpu")), torch.device("cpu"))
    ref_gpu = compute_cases(TinyTransformer(ModelConfig(), 0, 1, CUDA), CUDA)
    ranks = run_tp_workers(tmp_path, world=2, kind="cuda")
    for name in ref_cpu:
        torch.testing.assert_close(ranks[0][name], ranks[1][name], rtol=0, atol=0)
        torch.testing.assert_close(ranks[0][name], ref_gpu[name], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(ref_gpu[name], ref_cpu[name], rtol=1e-3, atol=1e-3)
        assert torch.equal(ranks[0][name].argmax(-1), ref_gpu[name].argmax(-1)), name
    torch.testing.assert_close(ranks[0]["prefix_rest"][0], ranks[0]["full"][2], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_kv_roundtrip_device_host_device_cuda(tiers, policy):  # noqa: F811
    cache.test_kv_roundtrip_device_host_device(tiers, policy, device=CUDA)


@pytest.mark.parametrize("vote", ["per-tick", "bulk", "per-poll"])
def test_kv_roundtrip_through_storage_cuda(tiers, tmp_path, vote):  # noqa: F811
    cache.test_kv_roundtrip_through_storage(tiers, tmp_path, vote, device=CUDA)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return serving.reference_outputs(tmp_path_factory.mktemp("reference"), device="cuda")


def test_every_tier_serves_identical_tokens_cuda(tmp_path, reference, no_leftover_processes):
    print("tiers:", serving.run_tiers(tmp_path, reference, device="cuda"))


@pytest.mark.parametrize("write,prefetch,vote", serving.CI_COMBOS)
def test_policies_serve_32_concurrent_clients_cuda(tmp_path, reference, write, prefetch, vote, no_leftover_processes):
    totals = serving.run_policies(tmp_path, reference, write, prefetch, vote, device="cuda")
    print(f"{write}/{prefetch}/{vote}: cached tokens {totals}")
