"""What every run of one exploration shares, kept across invocations: the storage
seed (the setup run's L3 files) and the no-cache reference answers.

Both are pure functions of the engine code, the scenario's setup and workload,
the model and the TP size, so they are computed once per such key and reused by
every later `chaos explore | run | shrink` (a CI shard, a replay, a shrink), which
saves the ~20 s setup + reference run of each invocation. The key hashes the
engine's source files, so an engine change never reads a stale reference.
HCTOOL_CACHE_DIR moves the cache (default ~/.cache/hctool); HCTOOL_CACHE_DIR=off
turns it off. The cache is read only under the rule of hctool/protocol/cachedir.py (the user's
own folders, nobody else can write them); otherwise it is bypassed, with one line."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from engine.lab import ENGINE_ROOT
from hctool.protocol import cachedir
from hctool.protocol.safefile import read_regular, write_atomic


def prepare_key(harness) -> str:
    s = harness.s
    h = hashlib.sha256()
    for p in sorted(ENGINE_ROOT.rglob("*.py")):
        h.update(str(p.relative_to(ENGINE_ROOT)).encode() + b"\0" + p.read_bytes())
    first = s.server_args(s.variants[0], harness.tp)
    h.update(
        json.dumps(
            {
                "args": first.to_json(),
                "setup": list(s.setup_flags),
                "tp": harness.tp,
                "workload": dataclasses.asdict(s.workload),
            },
            sort_keys=True,
        ).encode()
    )
    return h.hexdigest()[:20]


MAX_REFERENCE_BYTES = 256 << 20  # the reference answers of a workload; a bound on what is read


_SAID: set[str] = set()


def _say(msg: str) -> None:
    """One line per reason per process (load and save meet the same folder)."""
    from hctool.console import log

    if msg not in _SAID:
        _SAID.add(msg)
        log.warning(f"hctool: {msg}")


def _reference(path: Path) -> dict:
    """The reference answers stored at `path`: {(round, index): [token ids]}; ValueError (or
    OSError) for anything else: a damaged entry is recomputed, never an internal error."""
    data = json.loads(read_regular(path, MAX_REFERENCE_BYTES))
    ok = isinstance(data, list) and all(
        isinstance(e, list)
        and len(e) == 3
        and all(type(x) is int for x in e[:2])
        and isinstance(e[2], list)
        and all(type(t) is int for t in e[2])
        for e in data
    )
    if not ok:
        raise ValueError("not a list of [round, index, [token ids]]")
    return {(r, i): out for r, i, out in data}


def load(harness) -> bool:
    """Fill the harness's storage seed and reference from the cache; False on a miss. A cache
    folder that is not the user's own or that others can write is not read (another user's
    reference.json made a healthy engine `invalid`); a damaged entry is removed and recomputed;
    each said in one line."""
    key = prepare_key(harness)
    entry, why = cachedir.folder("prepare", key, create=False)
    if entry is None:
        if why:
            _say(why)
        return False
    ref = entry / "reference.json"
    seed = entry / "storage-seed"
    try:
        bad = cachedir.unsafe_entry(ref) or (cachedir.unsafe(seed) if os.path.lexists(seed) else None)
        if bad is None:
            reference = _reference(ref)
    except (OSError, ValueError, RecursionError) as exc:
        bad = f"{ref}: {str(exc)[:200]}"
    if bad is not None:
        _say(f"the chaos cache entry {entry.name} is damaged ({bad}); recomputing it")
        shutil.rmtree(entry, ignore_errors=True)
        return False
    harness.storage_seed = seed if seed.is_dir() else None
    harness.reference = reference
    harness.reference_s = _seconds(entry / "workload.json")
    return True


def _seconds(path: Path) -> float | None:
    """The reference workload's length stored beside it (None: an entry made before it was kept)."""
    try:
        if cachedir.unsafe_entry(path) is None:
            value = json.loads(read_regular(path, 4096)).get("seconds")
            return float(value) if isinstance(value, (int, float)) and 0 < value < 86400 else None
    except (OSError, ValueError, AttributeError):
        pass
    return None


def save(harness) -> None:
    """Store what harness.prepare() made; a concurrent writer of the same key wins
    harmlessly (same content), a failure only costs the next invocation a setup."""
    if harness.reference is None:
        return
    parent, why = cachedir.folder("prepare")
    if parent is None:  # off, not ours, or cannot be made: the run goes on without it
        if why:
            _say(why)
        return
    final = parent / prepare_key(harness)
    try:
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=".tmp-"))
        if harness.storage_seed is not None:
            shutil.copytree(harness.storage_seed, tmp / "storage-seed")
        write_atomic(
            tmp / "reference.json",
            json.dumps([[r, i, out] for (r, i), out in harness.reference.items()]).encode(),
            mode=0o600,
        )
        if harness.reference_s is not None:
            write_atomic(tmp / "workload.json", json.dumps({"seconds": harness.reference_s}).encode(), mode=0o600)
        try:
            os.rename(tmp, final)
        except OSError:  # someone stored it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass
