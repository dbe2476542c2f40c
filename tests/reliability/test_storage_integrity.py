"""Damaged L3 storage never serves a wrong token: real page files are damaged
between waves of real requests (flipped bytes, another page's bytes, a page of
NaNs, a store written by another --model-seed); every answer must equal the
no-cache answer, the damage must be counted in /metrics, and the damaged files
must be rewritten. The same server then loses its storage directory
(test_storage_faults.py)."""

from __future__ import annotations

import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.reliability.helpers import Server

PAGE = 16
TIMEOUT = 120


def _prompts(seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)  # distinct first pages, 6 pages each
    return [[rng.randrange(1, 30000) for _ in range(6 * PAGE + 1)] for _ in range(4)]


def storage_flags(store: Path, *extra: str) -> list[str]:
    return [
        "--tp",
        "2",
        "--page-size",
        str(PAGE),
        "--max-total-tokens",
        "1024",
        "--enable-hierarchical-cache",
        "--hicache-ratio",
        "4",
        "--hicache-storage-backend",
        "file",
        "--hicache-storage-dir",
        str(store),
        "--hicache-storage-prefetch-policy",
        "wait_complete",
        "--prefetch-threshold",
        str(PAGE),
        *extra,
    ]


def wave(url: str, prompts: list[list[int]]) -> list[dict]:
    out = []
    for ids in prompts:
        r = requests.post(
            url + "/generate",
            json={"input_ids": ids, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}},
            timeout=TIMEOUT,
        )
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=30).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m[1])


def pages(store: Path) -> list[Path]:
    return sorted(p for p in store.glob("*.bin"))


def wait_pages(store: Path, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(pages(store)) < n:
        assert time.monotonic() < deadline, f"only {len(pages(store))} of {n} pages reached storage"
        time.sleep(0.1)


def flush(url: str) -> None:
    deadline = time.monotonic() + 60
    while requests.post(url + "/flush_cache", timeout=TIMEOUT).status_code != 200:
        assert time.monotonic() < deadline, "flush_cache refused for a minute"
        time.sleep(0.2)


def damage(files: list[Path]) -> dict[Path, bytes]:
    """Damage every file in one of three ways; returns what each damaged file holds."""
    rng = random.Random(0)
    out = {}
    for i, f in enumerate(files):
        data = bytearray(f.read_bytes())
        if i % 3 == 0:  # 64 flipped bytes, same size
            for pos in rng.sample(range(len(data)), 64):
                data[pos] ^= 0xFF
        elif i % 3 == 1:  # another page's file, byte for byte
            data = bytearray(files[(i + 1) % len(files)].read_bytes())
        else:  # NaN values, same size
            data = bytearray(np.full(len(data) // 4, np.nan, dtype=np.float32).tobytes())
        f.write_bytes(bytes(data))
        out[f] = bytes(data)
    return out


def test_damaged_pages_are_misses_counted_and_rewritten(tmp_path):
    store = tmp_path / "store"
    srv = Server(tmp_path / "run", *storage_flags(store))
    try:
        url = srv.wait_ready()
        prompts = _prompts()
        reference = [a["output_ids"] for a in wave(url, prompts)]  # nothing cached yet: no-cache answers
        wait_pages(store, len(prompts) * 6 * 2)
        flush(url)
        files = pages(store)
        damaged = damage([f for i, f in enumerate(files) if i % 2 == 0])  # half the pages, both ranks

        second = wave(url, prompts)
        assert [a["output_ids"] for a in second] == reference, "a damaged page was served"
        assert metric(url, "hicache_storage_corrupt_pages_total") > 0

        deadline = time.monotonic() + 60  # recomputed pages are backed up again over the damage
        while any(f.exists() and f.read_bytes() == data for f, data in damaged.items()):
            assert time.monotonic() < deadline, "damaged files were never rewritten"
            time.sleep(0.1)
        wait_pages(store, len(files))
        flush(url)
        corrupt = metric(url, "hicache_storage_corrupt_pages_total")
        third = wave(url, prompts)
        assert [a["output_ids"] for a in third] == reference
        assert sum(a["meta_info"]["cached_tokens_details"]["storage"] for a in third) > 0, "storage unused"
        assert metric(url, "hicache_storage_corrupt_pages_total") == corrupt, "rewritten pages still bad"

        from tests.reliability.test_storage_faults import fail_storage_and_check_degrade

        fail_storage_and_check_degrade(srv, store)  # then the disk fails (one server start less)
    finally:
        assert srv.close() == 0, srv.log()[-3000:]


@pytest.mark.slow
def test_store_of_another_model_seed_is_never_served(tmp_path):
    store = tmp_path / "store"
    prompts = _prompts(9)
    writer = Server(tmp_path / "seed0", *storage_flags(store))
    try:
        wave(writer.wait_ready(), prompts)
        wait_pages(store, len(prompts) * 6 * 2)
    finally:
        assert writer.close() == 0
    ref_srv = Server(
        tmp_path / "ref1",
        "--tp",
        "2",
        "--page-size",
        str(PAGE),
        "--max-total-tokens",
        "1024",
        "--disable-radix-cache",
        "--model-seed",
        "1",
    )
    try:
        reference = [a["output_ids"] for a in wave(ref_srv.wait_ready(), prompts)]
    finally:
        assert ref_srv.close() == 0
    shutil.copytree(store, tmp_path / "store-seed0")
    reader = Server(tmp_path / "seed1", *storage_flags(store, "--model-seed", "1"))
    try:
        url = reader.wait_ready()
        answers = wave(url, prompts)
        assert [a["output_ids"] for a in answers] == reference
        assert all(a["meta_info"]["cached_tokens_details"]["storage"] == 0 for a in answers)
        assert metric(url, "hicache_storage_corrupt_pages_total") > 0
    finally:
        assert reader.close() == 0
