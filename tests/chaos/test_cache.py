"""The prepare cache (setup storage + no-cache reference shared across chaos
invocations): what its key covers, and that it can be turned off. The round trip
through real runs is in test_chaos_run.py."""

from __future__ import annotations

from hctool.chaos import cache
from hctool.chaos.target import scenario_target
from hctool.repro.harness import HarnessOptions, ReproHarness


def _harness(tmp_path, rounds=None, variant="per-poll"):
    t = scenario_target("30760", variant, True, rounds=rounds)
    return ReproHarness(t.scenario, HarnessOptions(artifacts=tmp_path / f"h{rounds}{variant}"))


def test_key_follows_the_workload_not_the_variant(tmp_path):
    two, three = _harness(tmp_path, 2), _harness(tmp_path, 3)
    assert cache.prepare_key(two) != cache.prepare_key(three)
    # every variant shares the setup and the reference (both use the first variant's engine)
    assert cache.prepare_key(two) == cache.prepare_key(_harness(tmp_path, 2, "bulk"))
    assert len(two.rounds) == 2 and _harness(tmp_path).rounds == _harness(tmp_path, 99).rounds


def test_round_trip_and_off(tmp_path, monkeypatch):
    h = _harness(tmp_path, 2)
    h.reference = {(0, 1): [5, 6], (1, 0): [7]}
    h.storage_seed = tmp_path / "seed"
    (h.storage_seed / "x").mkdir(parents=True)
    monkeypatch.setenv("HCTOOL_CACHE_DIR", "off")
    cache.save(h)
    assert not cache.load(_harness(tmp_path, 2))
    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(tmp_path / "c"))
    cache.save(h)
    fresh = _harness(tmp_path, 2)
    assert cache.load(fresh)
    assert fresh.reference == h.reference and (fresh.storage_seed / "x").is_dir()
    assert not cache.load(_harness(tmp_path, 3))
