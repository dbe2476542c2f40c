"""hctool's caches (HCTOOL_CACHE_DIR) under one rule (hctool/protocol/cachedir.py): a folder that
is not the user's own, or that others can write into, is bypassed with one line, never read; a
cache that cannot be made (a file, read-only) is bypassed too; a damaged entry is ignored and
recomputed. Real folders with real owners and modes, a real shared object planted where the C++
capture kernel is looked up, real `check-consensus run`s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.helpers import REPO, child_env

TICKER = str(REPO / "tests" / "consensus" / "programs" / "ticker.py")
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user owns needs root")
needs_cxx = pytest.mark.skipif(not (os.environ.get("CXX") or shutil.which("c++")), reason="no C++ compiler")

PLANTED_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    int fd = open("%s", O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "ran\n", 4); close(fd); }
}
"""


def _run(trace: Path, cache: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--nproc",
            "2",
            "--timeout",
            "60",
            "--trace-dir",
            str(trace),
            "--json",
            "--",
            TICKER,
        ],
        cwd=REPO,
        env={**child_env(), "TICKER_SECONDS": "0.5", "HCTOOL_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _plant_kernel(cache: Path, marker: Path, monkeypatch) -> Path:
    """A shared object whose constructor writes `marker`, at the name the kernel is looked up by."""
    from hctool.consensus import kernel_build

    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(cache))
    where = kernel_build.target()
    assert where is not None
    where.parent.mkdir(parents=True)
    src = cache.parent / "planted.c"
    src.write_text(PLANTED_C % marker)
    subprocess.run(
        [os.environ.get("CXX") or "c++", "-x", "c", "-shared", "-fPIC", "-o", str(where), str(src)],
        check=True,
        timeout=120,
    )
    return where


@needs_cxx
@pytest.mark.parametrize("how", ["world-writable", pytest.param("another user's", marks=needs_root)])
def test_a_kernel_planted_in_a_cache_others_control_never_runs(tmp_path, monkeypatch, how, no_leftover_processes):
    """Before: the planted object's constructor ran in both ranks and the run said `consistent`."""
    cache, marker = tmp_path / "cache", tmp_path / "constructor-ran"
    cache.mkdir()
    planted = _plant_kernel(cache, marker, monkeypatch)
    for d in (cache, planted.parent):
        if how == "world-writable":
            d.chmod(0o777)
        else:
            os.chown(d, NOBODY, NOBODY)
    if how != "world-writable":
        os.chown(planted, NOBODY, NOBODY)
    proc = _run(tmp_path / "trace", cache)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "consistent"
    assert not marker.exists(), "the planted shared object ran in a rank"
    said = [ln for ln in proc.stderr.splitlines() if "not using the cache" in ln]
    assert len(said) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", ["a file", "under a file", "read-only"])
def test_a_cache_that_cannot_be_made_is_bypassed_with_one_line(tmp_path, kind, no_leftover_processes):
    """Before: `HCTOOL_CACHE_DIR` a file or read-only was an internal error and nothing ran."""
    if kind == "a file":
        cache = tmp_path / "cache"
        cache.write_text("not a folder\n")
    elif kind == "under a file":
        (tmp_path / "file").write_text("x")
        cache = tmp_path / "file" / "cache"
    else:
        cache = tmp_path / "ro"
        cache.mkdir()
        if (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(cache)], capture_output=True
            ).returncode
            != 0
        ):
            pytest.skip("a read-only mount needs root")
    try:
        proc = _run(tmp_path / "trace", cache / "hctool" if kind == "read-only" else cache)
    finally:
        if kind == "read-only":
            subprocess.run(["umount", str(cache)], check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "consistent"
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "not using the cache" in ln]
    assert len(said) == 1, proc.stderr
    assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]


# -- the chaos cache: its storage seed and reference answers decide a verdict -----------------


def _harness(tmp_path: Path):
    from hctool.repro.catalogue import find_scenario
    from hctool.repro.harness import HarnessOptions, ReproHarness

    return ReproHarness(find_scenario("30760"), HarnessOptions(artifacts=tmp_path / "artifacts"))


def _store(harness, reference: dict) -> Path:
    from hctool.chaos import cache

    harness.reference, harness.storage_seed = reference, None
    cache.save(harness)
    return Path(os.environ["HCTOOL_CACHE_DIR"]) / "prepare" / cache.prepare_key(harness)


def test_the_chaos_cache_round_trips_in_a_private_folder(tmp_path, monkeypatch):
    from hctool.chaos import cache

    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(tmp_path / "cache"))
    h = _harness(tmp_path)
    entry = _store(h, {(0, 0): [1, 2, 3], (0, 1): [4]})
    assert (entry.stat().st_mode & 0o077) == 0
    fresh = _harness(tmp_path)
    assert cache.load(fresh) and fresh.reference == {(0, 0): [1, 2, 3], (0, 1): [4]}


@pytest.mark.parametrize("how", ["world-writable", pytest.param("another user's", marks=needs_root)])
def test_a_chaos_reference_others_control_is_not_read(tmp_path, monkeypatch, capfd, how):
    """Before: another user's prepare/*/reference.json was the reference: a healthy engine read `invalid`."""
    from hctool.chaos import cache

    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(tmp_path / "cache"))
    h = _harness(tmp_path)
    entry = _store(h, {(0, 0): [1, 2, 3]})
    (entry / "reference.json").write_text(json.dumps([[0, 0, [9, 9, 9]]]))  # the planted answers
    for d in (tmp_path / "cache", entry.parent, entry):
        if how == "world-writable":
            d.chmod(0o777)
        else:
            os.chown(d, NOBODY, NOBODY)
    fresh = _harness(tmp_path)
    assert not cache.load(fresh) and fresh.reference is None
    err = capfd.readouterr().err
    assert err.count("not using the cache") == 1, err
    assert entry.is_dir(), "a folder that is not ours is bypassed, not deleted"


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"{not json",
        b'{"a": 1}',
        b"[[0, 0, [1, 2]], [0]]",
        b'[[0, "0", [1]]]',
        b"[" * 100_000,
        b"\xff\xfe",
        "link",
        "fifo",
        "folder",
    ],
)
def test_a_damaged_chaos_cache_entry_is_ignored_and_recomputed(tmp_path, monkeypatch, capfd, damage):
    """Before: a damaged entry was an internal error on every later run until deleted by hand."""
    from hctool.chaos import cache

    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(tmp_path / "cache"))
    h = _harness(tmp_path)
    entry = _store(h, {(0, 0): [1, 2, 3]})
    ref = entry / "reference.json"
    ref.unlink()
    if damage == "link":
        (tmp_path / "elsewhere.json").write_text(json.dumps([[0, 0, [7]]]))
        ref.symlink_to(tmp_path / "elsewhere.json")
    elif damage == "fifo":
        os.mkfifo(ref, 0o600)
    elif damage == "folder":
        ref.mkdir()
    else:
        ref.write_bytes(damage)
        ref.chmod(0o600)
    fresh = _harness(tmp_path)
    assert not cache.load(fresh) and fresh.reference is None  # a miss: prepare() recomputes it
    err = capfd.readouterr().err
    assert err.count("is damaged") == 1 and "recomputing" in err, err
    assert not entry.exists()
    again = _harness(tmp_path)
    _store(again, {(0, 0): [1, 2, 3]})  # what the recomputation stores
    assert cache.load(_harness(tmp_path))
