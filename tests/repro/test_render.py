"""`hctool repro`'s text output prints the counts its JSON carries (it once rebuilt a
report without them and printed `counts: no calls recorded` under a divergence)."""

from __future__ import annotations

from hctool.commands.repro import _render
from hctool.gate.steps import counts_line

FD = {
    "group": "0:[0,1]",
    "seq": 2884,
    "kind": "extra",
    "culprit_ranks": [0],
    "ranks": {
        "0": {
            "op": "all_reduce",
            "site": "hiradix_cache.py:812",
            "function": "_vote_prefetch",
            "shapes": [[2]],
            "dtypes": ["int64"],
            "reduce_op": "MAX",
            "root": None,
            "label": None,
            "state": "blocked",
            "stack": [],
        },
        "1": {
            "op": "broadcast_object_list",
            "site": "scheduler.py:301",
            "function": "recv_requests",
            "shapes": [[1]],
            "dtypes": ["object"],
            "reduce_op": None,
            "root": 0,
            "label": None,
            "state": "blocked",
            "stack": [],
        },
    },
}
VARIANT = {
    "name": "per-poll",
    "expected": ["deadlocked"],
    "verdict": "deadlocked",
    "ok": True,
    "seconds": 20.0,
    "requests": {"sent": 16, "succeeded": 3, "failed": 0},
    "reason": "ranks blocked",
    "mechanism": None,
    "first_divergence": FD,
    "stacks": {},
    "artifacts": "/tmp/x",
    "counts": {
        "0": {"all_reduce": 2885, "broadcast_object_list": 140},
        "1": {"all_reduce": 2884, "broadcast_object_list": 141},
    },
}


def test_repro_text_prints_the_variants_counts(capsys):
    _render({"id": "30760", "title": "t", "variants": [VARIANT], "artifacts": "/tmp/x"})
    out = capsys.readouterr().out
    assert "no calls recorded" not in out
    assert "rank 0: 3025 (2885 all_reduce, 140 broadcast_object_list)" in out, out
    assert counts_line(VARIANT) in " ".join(out.split())


def test_cuda_without_a_gpu_is_refused_before_any_folder_is_made(tmp_path):
    import subprocess
    import sys

    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = subprocess.run(
        [sys.executable, "-m", "hctool", "repro", "26921", "--cuda"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr.startswith("Error: --cuda but torch sees no CUDA device"), out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_reason_that_looks_like_markup_is_printed_as_it_is(capsys):
    """gloo's errors quote their source as "[/path/pair.cc:537]": rich read it as a closing tag
    and the command failed after the run (`internal error: MarkupError`)."""
    reason = "rank 0 died: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error"
    variant = dict(VARIANT, reason=reason, mechanism={"seen": True, "evidence": [reason]})
    _render({"id": "26921", "title": "t", "variants": [variant], "artifacts": "/tmp/[x]"})
    out = " ".join(capsys.readouterr().out.split())
    assert "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537]" in out.replace("│ ", "").replace(" │", "")
    assert "artifacts: /tmp/[x]" in out
