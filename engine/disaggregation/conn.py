"""SGLang: srt/disaggregation/base/conn.py (KVPoll, KVSender, KVReceiver) with a TCP transport.

KV moves from prefill ranks to decode ranks over plain TCP, so the two sides may
run on different hosts. Heads are re-sharded on the way: prefill rank i holds
global heads [i*H/p, (i+1)*H/p), decode rank j [j*H/d, (j+1)*H/d); prefill rank i
sends decode rank j the overlap of the two ranges. A decode rank's receiver is
complete when the parts it got cover its heads.

A part on the wire: 8-byte length, a JSON header (room, global head range,
token count, shape, the first output token), then K and V as float32 bytes.
Receivers are rank-local; the decode ranks agree on their poll results
(engine/disaggregation/decode.py) before any request moves on.
"""

from __future__ import annotations

import json
import queue
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import IntEnum

import torch

from engine.disaggregation.bootstrap import register_receiver, wait_for_receivers
from engine.lab.seams import SEAMS

HEADER = struct.Struct(">Q")


class KVPoll(IntEnum):
    """SGLang's values; a MIN over ranks is the least advanced rank's state."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


def head_range(rank: int, tp: int, num_heads: int) -> tuple[int, int]:
    per = num_heads // tp
    return rank * per, (rank + 1) * per


def overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed mid-part")
        buf += chunk
    return bytes(buf)


# -- decode side ------------------------------------------------------------------------
@dataclass
class _Room:
    deadline: float
    heads: tuple[int, int]
    state: KVPoll = KVPoll.Bootstrapping
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    covered: int = 0
    first_token: int | None = None
    error: str = ""


class KVReceiverManager:
    """One decode rank's receivers: a listener thread that assembles parts per room."""

    def __init__(self, host: str, tp_rank: int, tp_size: int, num_heads: int, timeout: float):
        self.tp_rank, self.tp_size, self.timeout = tp_rank, tp_size, timeout
        self.heads = head_range(tp_rank, tp_size, num_heads)
        self.rooms: dict[int, _Room] = {}
        self.early: dict[int, list] = {}  # parts that came before the room was opened
        self.lock = threading.Lock()
        self.sock = socket.create_server((host, 0))
        self.addr = f"{host}:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept_loop, name="kv-receiver", daemon=True).start()

    def init(self, room: int, bootstrap_host: str, bootstrap_port: int) -> None:
        """Open the room and register it with the prefill's bootstrap server (in a thread)."""
        with self.lock:
            r = self.rooms[room] = _Room(time.monotonic() + self.timeout, self.heads)
            for header, k, v in self.early.pop(room, []):
                self._add_part(r, header, k, v)
        threading.Thread(
            target=self._register,
            args=(r, room, bootstrap_host, bootstrap_port),
            name=f"kv-register-{room}",
            daemon=True,
        ).start()

    def _register(self, r: _Room, room: int, host: str, port: int) -> None:
        try:
            register_receiver(host, port, room, self.tp_rank, self.tp_size, self.addr, self.heads, r.deadline)
            with self.lock:
                if r.state == KVPoll.Bootstrapping:
                    r.state = KVPoll.WaitingForInput
        except (TimeoutError, RuntimeError) as exc:
            with self.lock:
                r.state, r.error = KVPoll.Failed, str(exc)

    def poll(self, room: int) -> KVPoll:
        """Rank-local state of the room (Failed once its deadline passed)."""
        with self.lock:
            r = self.rooms[room]
            if r.state not in (KVPoll.Success, KVPoll.Failed) and time.monotonic() > r.deadline:
                r.state, r.error = KVPoll.Failed, f"no KV within {self.timeout:g} s"
            return r.state

    def pop(self, room: int) -> _Room:
        with self.lock:
            return self.rooms.pop(room)

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read_part, args=(conn,), daemon=True).start()

    def _read_part(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(self.timeout)
                header = json.loads(_recv_exact(conn, HEADER.unpack(_recv_exact(conn, HEADER.size))[0]))
                shape = header["shape"]
                nbytes = 4 * shape[0] * shape[1] * shape[2] * shape[3]
                k = torch.frombuffer(bytearray(_recv_exact(conn, nbytes)), dtype=torch.float32).view(shape)
                v = torch.frombuffer(bytearray(_recv_exact(conn, nbytes)), dtype=torch.float32).view(shape)
                conn.sendall(b"\1")
        except (OSError, ValueError, KeyError, ConnectionError) as exc:
            print(f"[kv-receiver {self.tp_rank}] bad part: {exc}", file=sys.stderr, flush=True)
            return
        with self.lock:
            r = self.rooms.get(header["room"])
            if r is None:
                self.early.setdefault(header["room"], []).append((header, k, v))
            else:
                self._add_part(r, header, k, v)

    def _add_part(self, r: _Room, header: dict, k: torch.Tensor, v: torch.Tensor) -> None:
        lo, hi = header["heads"]
        if r.k is None:
            layers, n, _, hd = header["shape"]
            per = r.heads[1] - r.heads[0]
            r.k = torch.empty(layers, n, per, hd)
            r.v = torch.empty(layers, n, per, hd)
        r.k[:, :, lo - r.heads[0] : hi - r.heads[0]] = k
        r.v[:, :, lo - r.heads[0] : hi - r.heads[0]] = v
        r.covered += hi - lo
        r.first_token = header["first_token"]
        if r.state != KVPoll.Failed:
            r.state = KVPoll.Success if r.covered >= r.heads[1] - r.heads[0] else KVPoll.Transferring

    def close(self) -> None:
        self.sock.close()


# -- prefill side -----------------------------------------------------------------------
@dataclass
class _SendJob:
    room: int
    k: torch.Tensor  # [layers, n, local heads, head_dim] on CPU
    v: torch.Tensor
    first_token: int
    deadline: float = field(default=0.0)


class KVSenderManager:
    """One prefill rank's sender: a thread that, per room, waits for the decode
    ranks' registrations and pushes each one its share of this rank's heads."""

    def __init__(
        self, bootstrap_host: str, bootstrap_port: int, tp_rank: int, tp_size: int, num_heads: int, timeout: float
    ):
        self.bootstrap = (bootstrap_host, bootstrap_port)
        self.tp_rank, self.timeout = tp_rank, timeout
        self.heads = head_range(tp_rank, tp_size, num_heads)
        self.jobs: queue.Queue[_SendJob | None] = queue.Queue()
        self.sent = self.failed = 0
        self.thread = threading.Thread(target=self._loop, name="kv-sender", daemon=True)
        self.thread.start()

    def send(self, room: int, k: torch.Tensor, v: torch.Tensor, first_token: int) -> None:
        self.jobs.put(_SendJob(room, k, v, first_token, time.monotonic() + self.timeout))

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self._send_job(job)
                self.sent += 1
            except (OSError, TimeoutError, RuntimeError, ConnectionError) as exc:
                self.failed += 1  # the decode side times the room out and fails it everywhere
                print(f"[kv-sender {self.tp_rank}] room {job.room}: {exc}", file=sys.stderr, flush=True)

    def _send_job(self, job: _SendJob) -> None:
        regs = wait_for_receivers(*self.bootstrap, job.room, job.deadline)
        delay = SEAMS.kv_send_delay_ms()
        if delay:
            time.sleep(delay / 1000)  # injected: this prefill rank's transfer is late
        if SEAMS.kv_dropped():
            return  # injected: this prefill rank's parts are lost
        for reg in regs:
            part = overlap(self.heads, tuple(reg["heads"]))
            if part is None:
                continue
            lo, hi = part[0] - self.heads[0], part[1] - self.heads[0]
            k, v = job.k[:, :, lo:hi].contiguous(), job.v[:, :, lo:hi].contiguous()
            header = json.dumps(
                {"room": job.room, "heads": list(part), "shape": list(k.shape), "first_token": job.first_token}
            ).encode()
            host, port = reg["addr"].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=self.timeout) as s:
                s.sendall(HEADER.pack(len(header)) + header)
                s.sendall(k.numpy().tobytes())
                s.sendall(v.numpy().tobytes())
                _recv_exact(s, 1)  # the receiver has the whole part

    def close(self) -> None:
        self.jobs.put(None)
