"""SGLang: srt/mem_cache/hicache_storage.py (+ the storage IO threads of srt/managers/cache_controller.py).

L3 storage: the HiCacheStorage interface, the file backend, and the IO threads
that prefetch pages into the host pool and back host pages up to storage."""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import stat
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from engine.lab.seams import SEAMS
from engine.mem_cache import hicache_page
from engine.mem_cache.memory_pool import KVPool


class HiCacheStorage(ABC):
    """Pages addressed by hash-chained keys; one page = K and V of every layer."""

    corrupt_pages = 0  # pages found damaged or foreign (each one a miss)

    @abstractmethod
    def batch_exists(self, keys: list[str]) -> int:
        """Number of leading keys present."""

    @abstractmethod
    def batch_get(self, keys: list[str], host_pool: KVPool, host_pages: list[int]) -> int:
        """Read pages into the host pool; returns how many leading pages were read."""

    @abstractmethod
    def batch_set(self, keys: list[str], host_pool: KVPool, host_pages: list[int]) -> int:
        """Write pages from the host pool; returns how many are stored."""


class HiCacheFile(HiCacheStorage):
    """One file per page and rank: `<key>_tp<size>_<rank>.bin` in a directory, each
    a checked page (hicache_page.py). A damaged or foreign file is a miss: it is
    counted, logged and deleted, so the backup of the recomputed page rewrites it."""

    def __init__(
        self,
        directory: str,
        tp_rank: int,
        tp_size: int,
        identity: bytes = bytes(16),
        pp_rank: int = 0,
        pp_size: int = 1,
    ):
        self.dir = hicache_page.check_storage_dir(directory)
        # A stage holds other layers' KV than its peers: its pages are its own files.
        self.suffix = f"_tp{tp_size}_{tp_rank}" + (f"_pp{pp_size}_{pp_rank}" if pp_size > 1 else "") + ".bin"
        self.identity = identity  # hicache_page.writer_identity(...); the zero default suits one writer (tests)
        self.corrupt_pages = 0  # written by the prefetch and backup threads (under _reject_lock)
        self._reject_lock = threading.Lock()

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}{self.suffix}"

    def batch_exists(self, keys: list[str]) -> int:
        n = len(keys)
        for i, key in enumerate(keys):
            try:  # lstat: a link planted under a page's name is no page
                if not stat.S_ISREG(os.lstat(self._path(key)).st_mode):
                    n = i
                    break
            except OSError:
                n = i
                break
        return n

    def batch_get(self, keys: list[str], host_pool: KVPool, host_pages: list[int]) -> int:
        shape = (2, host_pool.num_layers, host_pool.page_size, *host_pool.k_buffer.shape[2:])
        size = host_pool.page_bytes()
        for i, (key, page) in enumerate(zip(keys, host_pages)):
            data = self._read(self._path(key), hicache_page.HEADER.size + size + 1)
            if data is None:
                return i
            check = hicache_page.decode(data, self.identity, key, size)
            if check.payload is None:
                self._reject(self._path(key), check.problem)
                return i
            host_pool.write_page(page, torch.from_numpy(check.payload).view(shape))
        return len(keys)

    def batch_set(self, keys: list[str], host_pool: KVPool, host_pages: list[int]) -> int:
        """Writes every page whose file is missing or is not an intact page of this
        writer and key (so damage is repaired); an OSError propagates (StorageIO
        then turns writes off)."""
        size = host_pool.page_bytes()
        for key, page in zip(keys, host_pages):
            path = self._path(key)
            old = self._read(path, hicache_page.HEADER.size + size + 1)
            if old is not None and hicache_page.decode(old, self.identity, key, size).payload is not None:
                continue
            data = hicache_page.encode(self.identity, key, host_pool.read_page(page).numpy().tobytes())
            # A fresh file under a name nobody can predict (O_EXCL), renamed over the page's name:
            # a link planted in a shared folder is replaced, never written through.
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{path.name}.", suffix=".tmp")
            try:
                os.fchmod(fd, 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)  # readers never see a half-written page
            except IsADirectoryError:
                pass  # a folder planted under the page's name (refused above): this page stays a miss
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return len(keys)

    def _read(self, path: Path, most: int) -> bytes | None:
        """The page file's bytes, None when it is missing; a link, FIFO, device or directory
        under a page's name is refused as a damaged page is (counted, logged, removed)."""
        data, refused = _read_regular(path, most)
        if refused:
            self._reject(path, refused)
        return data

    def _reject(self, path: Path, problem: str) -> None:
        with self._reject_lock:
            self.corrupt_pages += 1
            n = self.corrupt_pages
        if n <= 10 or n % 100 == 0:
            print(
                f"[storage] page {path.name} rejected ({problem}): a miss, recomputed ({n} so far)",
                file=sys.stderr,
                flush=True,
            )
        with contextlib.suppress(OSError):
            path.unlink()


def _read_regular(path: Path, most: int) -> tuple[bytes | None, str]:
    """(up to `most` bytes of the regular file, "") or (None, why it is refused); (None, "") when
    it is missing or unreadable. O_NOFOLLOW: a link is never followed out of the folder;
    O_NONBLOCK: a FIFO cannot stall the reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        return None, "a symbolic link, not a page file" if exc.errno == errno.ELOOP else ""
    with os.fdopen(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None, "not a regular file"
            return f.read(most), ""
        except OSError:
            return None, ""


@dataclass
class PrefetchOperation:
    rid: str
    anchor: object  # tree node the fetched pages hang under (host-protected)
    token_ids: tuple[int, ...]  # page-aligned tokens after the anchor
    hashes: list[str]
    host_pages: list[int]
    start_time: float = field(
        default_factory=lambda: time.monotonic()
    )  # rank-local; read at creation, so clock faults reach it
    completed_tokens: int = 0  # written by the IO thread
    terminate_flag: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def terminate(self, timeout: float = 120.0) -> None:
        """Stop fetching and wait until the IO thread no longer touches host pages."""
        self.terminate_flag.set()
        if not self.done.wait(timeout):
            raise RuntimeError(f"prefetch {self.rid}: IO thread did not stop")


@dataclass
class BackupOperation:
    node: object
    hashes: list[str]
    host_pages: list[int]
    done: threading.Event = field(default_factory=threading.Event)


class StorageIO:
    """Per-rank IO threads. The prefetch thread agrees on each operation's storage
    hit with a MIN all_reduce on its own gloo group, in queue order, so every rank
    fetches the same number of pages; how far it gets in time is rank-local."""

    def __init__(
        self,
        backend: HiCacheStorage,
        host_pool: KVPool,
        io_group,
        page_size: int,
        hit_sync: str = "count",
        pp_sync=None,
    ):
        self.backend, self.host_pool, self.io_group, self.page_size = backend, host_pool, io_group, page_size
        self.pp_sync = pp_sync  # PP: the hit agreed across stages (engine/managers/pp_sync.py)
        self.hit_sync = hit_sync
        self.prefetch_queue: queue.Queue = queue.Queue()
        self.backup_queue: queue.Queue = queue.Queue()
        self.ack_backup_queue: deque[BackupOperation] = deque()
        self.error: BaseException | None = None  # a bug in an IO thread: every rank stops
        self.write_error: OSError | None = None  # a failed write: every rank turns L3 writes off
        self.read_errors = 0  # failed reads, each a miss (prefetch thread only)
        self._threads = [
            threading.Thread(
                target=self._guard, args=(self.prefetch_thread_func,), name="hicache-prefetch", daemon=True
            ),
            threading.Thread(target=self._guard, args=(self.backup_thread_func,), name="hicache-backup", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _guard(self, fn) -> None:
        try:
            fn()
        except BaseException as exc:  # surfaced by the scheduler on its next tick
            self.error = exc

    def prefetch(self, op: PrefetchOperation) -> None:
        self.prefetch_queue.put(op)

    def backup(self, op: BackupOperation) -> None:
        self.ack_backup_queue.append(op)
        self.backup_queue.put(op)

    def prefetch_thread_func(self) -> None:
        while True:
            op = self.prefetch_queue.get()
            if op is None:
                return
            # A seam: a fault can make this rank's storage answer otherwise (misses).
            pages = self._sync_storage_hit_count(max(0, SEAMS.storage_exists(self._exists(op.hashes))))
            for i in range(pages):
                if op.terminate_flag.is_set():
                    break
                if self._get(op.hashes[i : i + 1], self.host_pool, op.host_pages[i : i + 1]) != 1:
                    break
                op.completed_tokens += self.page_size
            op.done.set()

    def _exists(self, keys: list[str]) -> int:
        """The backend's hit; an I/O error (a store unreachable from this rank) is a miss."""
        try:
            return self.backend.batch_exists(keys)
        except OSError as exc:
            self._note_read_error(exc)
            return 0

    def _get(self, keys: list[str], host_pool: KVPool, host_pages: list[int]) -> int:
        try:
            return self.backend.batch_get(keys, host_pool, host_pages)
        except OSError as exc:
            self._note_read_error(exc)
            return 0

    def _note_read_error(self, exc: OSError) -> None:
        self.read_errors += 1
        if self.read_errors <= 3 or self.read_errors % 100 == 0:
            print(f"[storage] read failed ({exc}): a miss ({self.read_errors} so far)", file=sys.stderr, flush=True)

    def _sync_storage_hit_count(self, local_hit: int) -> int:
        """Pages every rank fetches: the MIN of each rank's storage hit. Every operation
        gets this vote on every rank, terminated or not, so the IO group's sequence of
        collectives stays identical. hit_sync count (the fix, SGLang #39267): one
        fixed-size MIN of the count. mask (pre-fix): a per-page hit mask MIN-reduced,
        sized by this rank's own hit count - a rank whose storage answers differently
        sends a tensor of another size, and gloo aborts ("4368 vs 2832" upstream)."""
        if self.hit_sync == "mask":
            mask = torch.ones(local_hit, dtype=torch.int64)
            dist.all_reduce(mask, op=dist.ReduceOp.MIN, group=self.io_group)
            return int(mask.sum().item())
        hit = torch.tensor([local_hit], dtype=torch.int64)
        if self.pp_sync is not None:
            self.pp_sync.all_reduce(hit, dist.ReduceOp.MIN)
        else:
            dist.all_reduce(hit, op=dist.ReduceOp.MIN, group=self.io_group)
        return int(hit.item())

    def backup_thread_func(self) -> None:
        while True:
            op = self.backup_queue.get()
            if op is None:
                return
            if self.write_error is None:
                try:
                    self.backend.batch_set(op.hashes, self.host_pool, op.host_pages)
                except OSError as exc:  # agreed in HiRadixCache.check_hicache_events
                    self.write_error = exc
                    print(
                        f"[storage] WARNING: storage writes failed ({exc}); L3 writes go off on every rank",
                        file=sys.stderr,
                        flush=True,
                    )
            op.done.set()

    def backup_ready_count(self) -> int:
        n = 0
        for op in self.ack_backup_queue:
            if not op.done.is_set():
                break
            n += 1
        return n

    def pop_backups(self, n: int, timeout: float = 120.0) -> list[BackupOperation]:
        """The agreed number of finished backups. Each is done here already unless the count
        came from another stage (PP stage0), whose own writes may run ahead of this one's."""
        out = [self.ack_backup_queue.popleft() for _ in range(n)]
        for op in out:
            if not op.done.wait(timeout):
                raise RuntimeError("a storage backup did not finish in time")
        return out

    def close(self) -> None:
        self.prefetch_queue.put(None)
        self.backup_queue.put(None)
