"""Serving with caching at TP=2, through real rank processes and HTTP (hctool.launch.Topology).

Every greedy output is compared token for token with a TP=2 `--disable-radix-cache`
run; cached_tokens_details and /metrics must name the tier that served:
- tiers: L1 hit, L2 load-back after device eviction, L3 prefetch after a restart on
  the same storage directory;
- policies: write policy x prefetch policy x prefetch vote, each serving 32 concurrent
  clients with shared prefixes (a warm wave, /flush_cache, then a wave served from
  storage). CI runs three combinations that cover every value of every axis; the full
  cross product is marked slow.

Every rank runs check_integrity() each tick (HCENGINE_CHECK_INTEGRITY=1): a violation
kills the rank, which fails the requests and the no-death check.
tests/gpu/ runs the same functions with device="cuda".
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import threading
import time
from pathlib import Path

import pytest
import requests

from engine.lab.variants import BY_NAME, Variants
from engine.mem_cache.radix_cache import chain_hashes
from engine.server_args import PREFETCH_POLICIES, WRITE_POLICIES, ServerArgs
from hctool.launch import Topology

PAGE = 16
TIMEOUT = 180
CLIENTS = 32
SOURCES = ("device", "host", "storage")


# --- workloads ----------------------------------------------------------------------------
def tier_prompts() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(1, 30000) for _ in range(400)] for _ in range(4)]


def concurrent_workload() -> list[list[int]]:
    """32 prompts: 4 shared 192-token prefixes, each with 8 distinct tails of 8..72 tokens."""
    rng = random.Random(11)
    prefixes = [[rng.randrange(1, 30000) for _ in range(192)] for _ in range(4)]
    return [prefixes[i % 4] + [rng.randrange(1, 30000) for _ in range(rng.randrange(8, 73))] for i in range(CLIENTS)]


TIER_NEW, WORKLOAD_NEW = 4, 8


# --- HTTP helpers -------------------------------------------------------------------------
def generate(url: str, ids: list[int], max_new_tokens: int) -> dict:
    r = requests.post(
        url + "/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        },
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text
    return r.json()


def generate_concurrently(url: str, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    """One client thread per prompt, all released at once; every answer or error is kept."""
    results: list = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def client(i: int) -> None:
        try:
            start.wait(timeout=30)
            results[i] = generate(url, prompts[i], max_new_tokens)
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[i] = exc

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 30)
    assert not any(t.is_alive() for t in threads), "clients still waiting for answers"
    failed = [(i, r) for i, r in enumerate(results) if not isinstance(r, dict)]
    assert not failed, f"{len(failed)} of {len(prompts)} requests failed, first: {failed[0][1]!r}"
    return results


_METRIC = re.compile(r'^(\w+?)(?:\{cache_source="(\w+)"\})? (\S+)$')


def metrics(url: str) -> dict[str, float]:
    r = requests.get(url + "/metrics", timeout=30)
    assert r.status_code == 200
    out = {}
    for line in r.text.splitlines():
        m = _METRIC.match(line)
        if m:
            out[m[1] + (f":{m[2]}" if m[2] else "")] = float(m[3])
    return out


def wait_metrics(url: str, pred, what: str, timeout: float = 30.0) -> dict[str, float]:
    """Rank 0 reports counters right after the answers of a tick: poll briefly."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if pred(m):
            return m
        assert time.monotonic() < deadline, f"metrics never showed {what}: {m}"
        time.sleep(0.05)


def cached_sum(answers: list[dict]) -> dict[str, int]:
    return {s: sum(a["meta_info"]["cached_tokens_details"][s] for a in answers) for s in SOURCES}


@contextlib.contextmanager
def serve(run_dir: Path, device: str = "cpu", **engine_flags):
    """A TP=2 topology with every rank checking integrity each tick; fails the test if
    any process died while serving; always reaps."""
    args = ServerArgs(tp_size=2, device=device, page_size=PAGE, **engine_flags)
    with Topology(args, run_dir, extra_env={"HCENGINE_CHECK_INTEGRITY": "1"}) as topo:
        url = topo.start(timeout=TIMEOUT)
        yield url
        assert topo.dead() == [], f"processes died while serving: {topo.dead()}; logs in {run_dir}"


def reference_outputs(run_dir: Path, device: str = "cpu") -> dict[tuple, list[int]]:
    """Greedy outputs of every prompt of this module from a TP=2 run without any cache."""
    ref = {}
    with serve(run_dir, device, disable_radix_cache=True, max_total_tokens=4096) as url:
        for prompts, n in ((tier_prompts(), TIER_NEW), (concurrent_workload(), WORKLOAD_NEW)):
            for ids, a in zip(prompts, generate_concurrently(url, prompts, n)):
                assert a["meta_info"]["cached_tokens"] == 0
                ref[tuple(ids)] = a["output_ids"]
    return ref


def assert_matches(ref: dict, prompts: list[list[int]], answers: list[dict], what: str) -> None:
    for i, (ids, a) in enumerate(zip(prompts, answers)):
        assert a["output_ids"] == ref[tuple(ids)], f"{what}: prompt {i} differs from the no-cache reference"


# --- scenario: every tier serves, outputs identical ---------------------------------------
def run_tiers(tmp: Path, ref: dict, device: str = "cpu") -> dict:
    """L1 hit, L2 load-back, L3 prefetch after a restart; returns what each step saw."""
    p1, *others = tier_prompts()
    aligned = (len(p1) - 1) // PAGE * PAGE  # the key is input_ids[:-1], page aligned
    flags = dict(
        enable_hierarchical_cache=True,
        hicache_ratio=4,
        max_total_tokens=1024,
        hicache_storage_backend="file",
        hicache_storage_dir=str(tmp / "store"),
    )
    seen = {}
    with serve(tmp / "run1", device, **flags) as url:
        first = generate(url, p1, TIER_NEW)
        assert first["meta_info"]["cached_tokens"] == 0
        assert_matches(ref, [p1], [first], "uncached")

        hit = generate(url, p1, TIER_NEW)
        assert hit["meta_info"]["cached_tokens_details"] == {"device": aligned, "host": 0, "storage": 0}
        assert_matches(ref, [p1], [hit], "L1 hit")
        m = wait_metrics(url, lambda m: m["hicache_cached_tokens_total:device"] == aligned, "the L1 hit")
        assert m["hicache_backup_tokens_total"] > 0  # write_through backed p1 up
        seen["l1"] = hit["meta_info"]["cached_tokens_details"]

        for ids in others:  # 3 x 25 pages through a 64-page L1: p1 leaves the device
            assert_matches(ref, [ids], [generate(url, ids, TIER_NEW)], "filler")
        m_before = wait_metrics(url, lambda m: m["hicache_evicted_tokens_total"] > 0, "evictions")
        back = generate(url, p1, TIER_NEW)
        d = back["meta_info"]["cached_tokens_details"]
        assert d["host"] > 0 and d["storage"] == 0 and d["device"] + d["host"] == aligned, d
        assert_matches(ref, [p1], [back], "L2 load-back")
        m = wait_metrics(url, lambda m: m["hicache_cached_tokens_total:host"] == d["host"], "the host hit")
        assert m["hicache_load_back_tokens_total"] - m_before["hicache_load_back_tokens_total"] >= d["host"]
        assert m["hicache_cached_tokens_total:device"] == aligned + d["device"]
        assert m["hicache_prefetched_tokens_total"] == 0 and m["hicache_cached_tokens_total:storage"] == 0
        seen["l2"] = d

        # p1's pages reach storage in the background (write ack -> backup thread)
        files = [tmp / "store" / f"{h}_tp2_{r}.bin" for h in chain_hashes("", p1[:aligned], PAGE) for r in (0, 1)]
        deadline = time.monotonic() + 60
        while not all(f.exists() for f in files):
            assert time.monotonic() < deadline, "p1 never reached the storage tier"
            time.sleep(0.1)

    with serve(tmp / "run2", device, **flags) as url:  # a restart: empty L1 and L2
        pre = generate(url, p1, TIER_NEW)
        d = pre["meta_info"]["cached_tokens_details"]
        assert d == {"device": 0, "host": 0, "storage": aligned}, d
        assert_matches(ref, [p1], [pre], "L3 prefetch")
        m = wait_metrics(url, lambda m: m["hicache_cached_tokens_total:storage"] == aligned, "the storage hit")
        assert m["hicache_prefetched_tokens_total"] == aligned
        assert m["hicache_load_back_tokens_total"] >= aligned
        assert m["hicache_cached_tokens_total:device"] == 0 and m["hicache_cached_tokens_total:host"] == 0
        seen["l3"] = d
        again = generate(url, p1, TIER_NEW)
        assert again["meta_info"]["cached_tokens_details"] == {"device": aligned, "host": 0, "storage": 0}
        assert_matches(ref, [p1], [again], "L1 hit after prefetch")
    return seen


# --- scenario: a policy combination under 32 concurrent clients ---------------------------
def run_policies(tmp: Path, ref: dict, write: str, prefetch: str, vote: str, device: str = "cpu") -> dict:
    prompts = concurrent_workload()
    flags = dict(
        enable_hierarchical_cache=True,
        hicache_ratio=4,
        max_total_tokens=1024,
        hicache_write_policy=write,
        hicache_storage_prefetch_policy=prefetch,
        variants=Variants(prefetch_vote=vote),
        hicache_storage_backend="file",
        hicache_storage_dir=str(tmp / "store"),
    )
    with serve(tmp / "run", device, **flags) as url:
        warm = generate_concurrently(url, prompts, WORKLOAD_NEW)
        assert_matches(ref, prompts, warm, f"{write}/{prefetch}/{vote} wave 1")
        r = requests.post(url + "/flush_cache", timeout=TIMEOUT)
        assert r.status_code == 200, r.text  # drops L1 and L2; storage stays
        cold = generate_concurrently(url, prompts, WORKLOAD_NEW)
        assert_matches(ref, prompts, cold, f"{write}/{prefetch}/{vote} wave 2 (after flush)")
        answers = warm + cold
        totals = cached_sum(answers)
        m = wait_metrics(url, lambda m: m["requests_total"] == 2 * CLIENTS, "all requests")
        for s in SOURCES:  # the metrics add up what the answers reported
            assert m[f"hicache_cached_tokens_total:{s}"] == totals[s], (s, totals, m)
        assert m["hicache_prefetched_tokens_total"] >= totals["storage"]
        assert totals["device"] > 0, "shared prefixes were never reused"
        if write == "write_through":
            assert m["hicache_backup_tokens_total"] > 0
        if write == "write_through" and prefetch == "wait_complete":
            assert totals["storage"] > 0, "wave 2 was not served from storage"
    return totals


# --- the tests ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return reference_outputs(tmp_path_factory.mktemp("reference"))


def test_every_tier_serves_identical_tokens(tmp_path, reference, no_leftover_processes):
    seen = run_tiers(tmp_path, reference)
    print("tiers:", seen)


# Three runs cover every value of every axis (a Latin square over the three axes).
CI_COMBOS = [
    ("write_through", "wait_complete", "per-tick"),
    ("write_through_selective", "timeout", "bulk"),
    ("write_back", "best_effort", "per-poll"),
]
ALL_COMBOS = [
    c
    for c in itertools.product(WRITE_POLICIES, PREFETCH_POLICIES, BY_NAME["prefetch_vote"].choices)
    if c not in CI_COMBOS
]


@pytest.mark.parametrize("write,prefetch,vote", CI_COMBOS)
def test_policies_serve_32_concurrent_clients(tmp_path, reference, write, prefetch, vote, no_leftover_processes):
    totals = run_policies(tmp_path, reference, write, prefetch, vote)
    print(f"{write}/{prefetch}/{vote}: cached tokens {totals}")


@pytest.mark.slow
@pytest.mark.parametrize("write,prefetch,vote", ALL_COMBOS)
def test_policies_full_matrix(tmp_path, reference, write, prefetch, vote, no_leftover_processes):
    run_policies(tmp_path, reference, write, prefetch, vote)
