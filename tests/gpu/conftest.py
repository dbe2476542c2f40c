"""tests/gpu/: the engine's correctness checks on CUDA (real CUDA streams, events and kernels).
Marked `gpu` (deselected by default: run `pytest -m gpu tests/gpu`) and skipped without CUDA.
Tests marked `two_gpus` need NCCL between two devices (NCCL refuses two ranks on one GPU) and
skip on one; the others run their TP ranks on a shared GPU with the model's group on gloo
(--model-backend auto), which the 1-GPU machine can run."""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "two_gpus: needs two CUDA devices (NCCL between them)")


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "gpu")
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if devices == 0:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
            elif devices < 2 and item.get_closest_marker("two_gpus"):
                item.add_marker(pytest.mark.skip(reason="needs two CUDA devices (NCCL refuses two ranks on one GPU)"))
