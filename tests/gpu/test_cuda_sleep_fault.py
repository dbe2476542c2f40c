"""cuda-sleep on a real CUDA stream: the fault queues a sleep kernel of about `ms` on the rank's
current stream, so work queued after it finishes that much later (timed with CUDA events)."""

from __future__ import annotations

import torch

from hctool.agent.faults import cuda


def test_cuda_sleep_waits_on_the_stream():
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cuda.cuda_sleep(1)  # the first call times the clock rate
    start.record()
    cuda.cuda_sleep(50)  # what a cuda-sleep:ms=50 fault does before each collective
    end.record()
    end.synchronize()
    assert 40 <= start.elapsed_time(end) <= 200
