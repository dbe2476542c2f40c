"""The per-file cache: pass-1 summaries and pass-2 results, keyed by content, so an unchanged re-run
reads results instead of analyzing and a one-file edit re-analyzes only what depends on it.

A run keeps the entries it made in one pack file (`pack-*`: a pickled {name: pickled entry}), not a
file per entry: creating two thousand small files on ext4 cost a cold run on SGLang's srt over a
second (9.5 s against 8.3 s with no cache, or with the cache on tmpfs). Packs are read once per run;
past MAX_PACKS, a run writes every entry it used into one pack and removes the older ones.

Keys are digests of the linter's own source (its version), the configuration that shapes the
analysis, the file's display path and module name, and the bytes analyzed. A pass-2 entry also
keeps the project facts the file asked for (call sites, field sources, ...) with the answers it
got: it is reused only while the new project gives the same answers, which is what "depends on"
means here. Entries are written to a temporary file and renamed (atomic), read with a fallback to
a fresh analysis on any error, and the directory must be the user's own and not writable by others
(entries are pickles). Other linter versions' directories unused for a week are removed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import stat
import sys
import time
from dataclasses import fields, is_dataclass
from pathlib import Path

from hctool.console.errors import UsageError
from hctool.protocol.safefile import write_atomic

_VERSION: str | None = None
STALE_S = 7 * 24 * 3600  # another version's directory unused this long is deleted
MAX_PACKS = 8  # past this many packs, a run compacts what it used into one


def version() -> str:
    """A digest of this package's analysis code and the Python running it: any change is a new cache."""
    global _VERSION
    if _VERSION is None:
        h = hashlib.blake2b(sys.version.encode(), digest_size=12)
        for p in sorted(Path(__file__).parent.glob("*.py")):
            h.update(p.name.encode())
            h.update(p.read_bytes())
        _VERSION = h.hexdigest()
    return _VERSION


def digest(*parts) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def canon(x):
    """A form of X whose repr is the same in every process (sets are ordered; hash seeds differ)."""
    if isinstance(x, (frozenset, set)):
        return ("set", tuple(sorted((canon(v) for v in x), key=repr)))
    if isinstance(x, (tuple, list)):
        return tuple(canon(v) for v in x)
    if isinstance(x, dict):
        return ("dict", tuple(sorted(((canon(k), canon(v)) for k, v in x.items()), key=repr)))
    if is_dataclass(x):
        return (type(x).__name__, *(canon(getattr(x, f.name)) for f in fields(x)))
    return x


class Cache:
    def __init__(self, root: Path):
        self.dir = root / "lint" / version()
        self._checked = False
        self._packed: dict[str, bytes] | None = None  # name -> pickled entry, from every pack read
        self._packs: list[Path] = []
        self.used: dict[str, bytes] = {}  # entries this run read from packs, for a compaction

    def _prepare(self) -> None:
        if self._checked:
            return
        self._checked = True
        top = self.dir.parent.parent
        try:
            top.mkdir(parents=True, exist_ok=True)  # the user's folder, made under their umask
            for d in (self.dir.parent, self.dir):  # hctool's own: private whatever the umask
                d.mkdir(exist_ok=True, mode=0o700)
        except OSError as exc:
            raise UsageError(
                f"cannot create the lint cache in {top}: {exc.strerror}",
                "set HCTOOL_CACHE_DIR to a writable directory, or pass --no-cache",
            ) from None
        # Entries are pickles: whoever can replace one runs code here. The top folder must be
        # the user's and not writable by others; the lint folders, writable by the user alone.
        for d, forbidden in (
            (top, stat.S_IWOTH),
            (self.dir.parent, stat.S_IWGRP | stat.S_IWOTH),
            (self.dir, stat.S_IWGRP | stat.S_IWOTH),
        ):
            st = d.stat()
            if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & forbidden:
                raise UsageError(
                    f"refusing the lint cache in {d}: not yours, or writable by others",
                    "use a private HCTOOL_CACHE_DIR, or pass --no-cache",
                )
        now = time.time()
        os.utime(self.dir)  # in use: other checkouts sharing this cache leave it alone
        for other in self.dir.parent.iterdir():  # other linter versions, unused for a week
            if other.is_dir() and other != self.dir and now - other.stat().st_mtime > STALE_S:
                shutil.rmtree(other, ignore_errors=True)

    def get(self, name: str):
        """An entry kept in a file of its own (a run's report: an unchanged re-run reads that alone, no
        pack), else one of a pack; None if missing or unreadable (truncated, from elsewhere): analyze afresh."""
        self._prepare()
        try:
            with open(self.dir / name, "rb") as fh:
                return pickle.load(fh)
        except Exception:
            pass
        data = self._read_packs().get(name)
        try:
            if data is not None:
                value = pickle.loads(data)
                self.used[name] = data
                return value
        except Exception:
            pass
        return None

    def _read_packs(self) -> dict[str, bytes]:
        if self._packed is None:
            self._packed = {}
            try:
                self._packs = sorted(self.dir.glob("pack-*"), key=lambda f: f.stat().st_mtime)
            except OSError:
                self._packs = []
            for pack in self._packs:  # newest last: its entries win
                try:
                    with open(pack, "rb") as fh:
                        entries = pickle.load(fh)
                    if isinstance(entries, dict):
                        self._packed.update((k, v) for k, v in entries.items() if isinstance(v, bytes))
                except Exception:
                    continue  # a pack being replaced, or damaged: its entries are made again
        return self._packed

    def put(self, name: str, value) -> None:
        """One entry in a file of its own (a run's report, read before any pack)."""
        self._prepare()
        try:
            write_atomic(self.dir / name, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), mode=0o600)
        except OSError:  # a full or read-only disk: the result stands, it is just not kept
            pass

    def put_pack(self, entries: dict[str, bytes]) -> None:
        """ENTRIES (name -> pickled entry) in one new pack; past MAX_PACKS, every entry this run used or
        made goes into it and the older packs are removed (other trees sharing the cache re-make theirs)."""
        if not entries:
            return
        self._prepare()
        self._read_packs()
        compact = len(self._packs) + 1 > MAX_PACKS
        if compact:
            entries = {**self.used, **entries}
        blob = pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            write_atomic(self.dir / f"pack-{digest(sorted(entries))}", blob, mode=0o600)
        except OSError:
            return
        if compact:
            for old in self._packs:
                try:
                    old.unlink()
                except OSError:
                    pass


class Recorder:
    """The project as pass 2 of one file sees it: each question asked and a digest of its answer,
    so a cached result can be checked against a new project by asking again."""

    def __init__(self, project):
        self.project = project
        self.asked: dict = {}

    def _ask(self, name: str, *args):
        key = (name, args)
        hit = self.asked.get(key)
        if hit is None:
            hit = self.asked[key] = getattr(self.project, name)(*args)
        return hit

    def call(self, ref, args, consts=frozenset()):
        return self._ask("call", ref, args, consts)

    def attr(self, specs, name):
        return self._ask("attr", specs, name)

    def loose(self, name):
        return self._ask("loose", name)

    def clock_field(self, name):
        return self._ask("clock_field", name)

    def group_dims(self, ref, consts=frozenset()):
        return self._ask("group_dims", ref, consts)

    def held_group(self, specs, name):
        return self._ask("held_group", specs, name)

    def retried_alone(self, key):
        return self._ask("retried_alone", key)

    def follows(self, ref):
        return self._ask("follows", ref)

    def leads(self, key):
        return self._ask("leads", key)

    def component_has_collectives(self, key):
        return self._ask("component_has_collectives", key)

    def paired_ops(self, key):
        return self._ask("paired_ops", key)

    def answers(self) -> list:
        return [(name, args, digest(canon(ans))) for (name, args), ans in self.asked.items()]


def still_valid(project, answers: list) -> bool:
    return all(digest(canon(getattr(project, name)(*args))) == d for name, args, d in answers)
