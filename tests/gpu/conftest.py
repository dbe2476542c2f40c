"""tests/gpu/: the engine's correctness checks on CUDA (NCCL for the model group, real
CUDA streams and events). Marked `gpu` (deselected by default: run `pytest -m gpu
tests/gpu`) and skipped where fewer than two CUDA devices are present."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "gpu")
    usable = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not usable:
                item.add_marker(pytest.mark.skip(reason="needs two CUDA devices"))
