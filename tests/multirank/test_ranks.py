"""This repository's own multi-rank tests, on real ranks through the pytest plugin
(@pytest.mark.world_size). `.ci/run` runs them in `hctool gate`; `pytest -m slow`
runs them too."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.mark.world_size(2)
def test_engine_tp2_logits_equal_tp1(rank, world_size, group):
    from tests.engine.engine_tp_worker import ModelConfig, TinyTransformer, compute_cases

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    tp2 = compute_cases(TinyTransformer(ModelConfig(), rank, world_size, cpu, group=group), cpu)
    tp1 = compute_cases(TinyTransformer(ModelConfig(), 0, 1, cpu), cpu)
    for name, want in tp1.items():
        torch.testing.assert_close(tp2[name], want, rtol=1e-4, atol=1e-4, msg=lambda m: f"case {name}: {m}")  # noqa: B023  (msg is called within this iteration)


@pytest.mark.world_size(2)
def test_padded_forward_equals_tp1_and_pairs_different_batches_silently(rank, world_size, group):
    """--pad-forward-tokens: on agreeing ranks the padding changes nothing; on ranks whose
    batches differ in size it hides the mismatch (no error) and the logits are wrong."""
    from tests.engine.engine_tp_worker import PAGE, ForwardItem, KVPool, ModelConfig, TinyTransformer, compute_cases

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    padded = TinyTransformer(ModelConfig(), rank, world_size, cpu, group=group, pad_tokens=256)
    tp2 = compute_cases(padded, cpu)
    tp1 = compute_cases(TinyTransformer(ModelConfig(), 0, 1, cpu), cpu)
    for name, want in tp1.items():
        torch.testing.assert_close(tp2[name], want, rtol=1e-4, atol=1e-4, msg=lambda m: f"case {name}: {m}")  # noqa: B023  (msg is called within this iteration)
    # rank 1 recomputes a 48-token prefix rank 0 holds: 16 vs 64 tokens, one padded shape
    pool = KVPool(8, PAGE, padded.cfg.num_layers, padded.local_heads, padded.cfg.head_dim, cpu)
    ids, slots = list(range(1, 65)), pool.page_slots([0, 1, 2, 3])[:64]
    item = ForwardItem(ids[48:], 48, slots) if rank == 0 else ForwardItem(ids, 0, slots)
    got = padded.forward([item], pool).float()
    want = (
        TinyTransformer(ModelConfig(), 0, 1, cpu)
        .forward(
            [ForwardItem(ids, 0, slots)],
            KVPool(8, PAGE, padded.cfg.num_layers, padded.cfg.num_heads, padded.cfg.head_dim, cpu),
        )
        .float()
    )
    if rank == 1:  # its own KV is complete: only the silently paired rows make it wrong
        assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.world_size(2)
def test_recorder_is_on_and_labels_agree(rank, group):
    import torch.distributed as dist

    from hctool.agent.capture import recorder
    from hctool.consensus import assert_same, rank_consensus

    assert recorder.enabled()  # the plugin injected it: every collective here is checked across ranks

    @rank_consensus(same_params=True, same_results=True)
    def plan(batch: list[int]) -> int:
        return sum(batch)

    objs = [{"batch": [1, 2, 3]} if rank == 0 else None]
    dist.broadcast_object_list(objs, src=0, group=group)
    assert plan(objs[0]["batch"]) == 6
    assert_same("plan", objs[0])
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    assert t.item() == 2.0
