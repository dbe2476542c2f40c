"""The model: TP=2 (two real rank processes over gloo) computes the same function as
TP=1, and a prefill that reads a cached prefix from the paged pool gives the same
logits as a full prefill."""

from __future__ import annotations

import torch

from engine.model_executor.model import TinyTransformer
from engine.server_args import ModelConfig
from tests.engine.engine_tp_worker import compute_cases, run_tp_workers

TOL = dict(rtol=1e-4, atol=1e-4)


def tp1_cases() -> dict[str, torch.Tensor]:
    return compute_cases(TinyTransformer(ModelConfig(), 0, 1, torch.device("cpu")), torch.device("cpu"))


def check_prefix_equals_full(cases: dict[str, torch.Tensor]) -> None:
    # prompt c is row 2 of the full batch; its two-step prefill must end with the same logits
    torch.testing.assert_close(cases["prefix_rest"][0], cases["full"][2], **TOL)
    assert int(cases["prefix_rest"][0].argmax()) == int(cases["full"][2].argmax())


def test_prefix_cached_prefill_equals_full_prefill_tp1():
    cases = tp1_cases()
    assert cases["full"].shape == (3, ModelConfig().vocab_size)
    check_prefix_equals_full(cases)
    # the cached prefix really matters: the same suffix over blank pages gives other logits
    assert not torch.allclose(cases["rest_without_prefix"][0], cases["full"][2], **TOL)


def test_tp2_processes_match_tp1(tmp_path, no_leftover_processes):
    ref = tp1_cases()
    ranks = run_tp_workers(tmp_path, world=2, kind="cpu")
    for name, want in ref.items():
        # after the row-parallel all_reduce every rank holds the same logits
        torch.testing.assert_close(ranks[0][name], ranks[1][name], rtol=0, atol=0)
        torch.testing.assert_close(ranks[0][name], want, **TOL, msg=lambda m: f"case {name}: {m}")  # noqa: B023  (msg is called within this iteration)
        assert torch.equal(ranks[0][name].argmax(-1), want.argmax(-1)), name
    check_prefix_equals_full(ranks[0])


def test_different_seed_changes_the_function():
    """Guards the comparison above against a model whose output ignores its weights."""
    a = tp1_cases()["full"]
    b = compute_cases(TinyTransformer(ModelConfig(seed=1), 0, 1, torch.device("cpu")), torch.device("cpu"))["full"]
    assert not torch.allclose(a, b, **TOL)
