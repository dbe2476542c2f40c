"""The per-file cache: an unchanged re-run reads results, an edit re-analyzes only what depends on it,
--no-cache writes nothing, and a cache that is not private or not readable is handled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hctool.cli import app
from hctool.lint.cache import MAX_PACKS
from hctool.lint.config import LintConfig
from hctool.lint.runner import lint

CACHE = """\
import torch.distributed as dist


class Cache:
    def vote(self, t):
        return t
"""
SCHED = """\
from cache import Cache


class Scheduler:
    cache: Cache

    def step(self, ev, t):
        if ev.query():
            self.cache.vote(t)
"""
OTHER = """\
import torch.distributed as dist
def on_copy_done(pool, event, pages):  # frees lag per rank: what a free-count finding rests on
    event.query() and pool.free(pages)
def other(pool, t):
    if pool.available_size() > 0:
        dist.all_reduce(t)
"""


def tree(root: Path) -> Path:
    (root / "src").mkdir()
    for name, text in (("cache.py", CACHE), ("sched.py", SCHED), ("other.py", OTHER)):
        (root / "src" / name).write_text(text)
    return root / "src"


def run(src: Path, cache: Path):
    return lint([src], LintConfig(root=src), jobs=1, cwd=src, cache_dir=cache)


def test_rerun_reads_the_cache_and_an_edit_reanalyzes_what_depends_on_it(tmp_path):
    src, cache = tree(tmp_path), tmp_path / "cache"
    first = run(src, cache)
    assert first.analyzed == {"pass1": 3, "pass2": 1} and [f.path for f in first.findings] == ["other.py"]
    again = run(src, cache)
    assert again.analyzed == {"pass1": 0, "pass2": 0} and again.findings == first.findings
    # Cache.vote now issues a collective: sched.py, unchanged, now gates one, so its pass 2 runs again;
    # other.py asked nothing that changed and is not re-analyzed.
    (src / "cache.py").write_text(CACHE.replace("        return t", "        dist.all_reduce(t)\n        return t"))
    edited = run(src, cache)
    assert edited.analyzed == {"pass1": 1, "pass2": 2}  # cache.py (now with a collective) and sched.py
    assert sorted(f.path for f in edited.findings) == ["other.py", "sched.py"]
    # An edit that changes no fact another file asked about re-analyzes that file alone.
    (src / "other.py").write_text(OTHER + "\n\ndef unrelated():\n    return 1\n")
    assert run(src, cache).analyzed == {"pass1": 1, "pass2": 1}
    assert run(src, None).findings == run(src, cache).findings  # the cache changes nothing


def test_a_run_keeps_its_entries_in_one_pack_and_compacts_old_packs(tmp_path):
    # One pack per run that analyzed anything, not a file per entry (ext4 file creation cost SGLang's
    # cold run a second); past MAX_PACKS, the run's pack holds all it used and the older ones go.
    src, cache = tree(tmp_path), tmp_path / "cache"
    first = run(src, cache)
    packs = lambda: sorted(cache.rglob("pack-*"))  # noqa: E731
    assert len(packs()) == 1 and not list(cache.rglob("p1-*"))
    for k in range(MAX_PACKS + 2):
        (src / "other.py").write_text(OTHER + f"\n\ndef unrelated_{k}():\n    return {k}\n")
        edited = run(src, cache)
        assert edited.analyzed == {"pass1": 1, "pass2": 1} and edited.findings == first.findings
        assert 1 <= len(packs()) <= MAX_PACKS
    assert run(src, cache).analyzed == {"pass1": 0, "pass2": 0}


def test_unreadable_entries_are_analyzed_afresh(tmp_path):
    src, cache = tree(tmp_path), tmp_path / "cache"
    first = run(src, cache)
    for entry in cache.rglob("*"):
        if entry.is_file():
            entry.write_bytes(b"not a pickle")
    again = run(src, cache)
    assert again.analyzed == {"pass1": 3, "pass2": 1} and again.findings == first.findings


def test_cli_cache_dir_no_cache_and_unsafe_dir(tmp_path, monkeypatch):
    src = tree(tmp_path)
    monkeypatch.chdir(src)
    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(tmp_path / "c"))
    res = CliRunner().invoke(app, ["lint", ".", "--format", "json", "--no-cache"])
    assert res.exit_code == 1 and not (tmp_path / "c").exists()
    res = CliRunner().invoke(app, ["lint", ".", "--format", "json"])
    assert res.exit_code == 1 and len(json.loads(res.stdout)) == 1
    assert any(p.name.startswith("pack-") for p in (tmp_path / "c").rglob("*"))
    os.chmod(tmp_path / "c", 0o777)  # anyone could plant a pickle there: refuse it
    res = CliRunner().invoke(app, ["lint", ".", "--format", "json"])
    assert "refusing the lint cache" in str(res.exception)


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() == 0, reason="root can write anywhere")
def test_cli_unwritable_cache_dir_is_a_usage_error(tmp_path, monkeypatch):
    src = tree(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.chdir(src)
    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(locked / "c"))
    res = CliRunner().invoke(app, ["lint", ".", "--format", "json"])
    assert "cannot create the lint cache" in str(res.exception)
