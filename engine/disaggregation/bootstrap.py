"""SGLang: srt/disaggregation/common/conn.py (CommonKVBootstrapServer).

The bootstrap server of a prefill server, on its rank 0: the per-request
handshake point. Each decode rank registers, per bootstrap room, the address its
KV receiver listens on and the heads it holds; each prefill rank asks for the
room's registrations before it pushes KV. A room is forgotten once every
prefill rank has read it complete.

Protocol: one JSON object per line, one request per TCP connection.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time

from engine.lab.seams import SEAMS

CONNECT_TIMEOUT_S = 5.0


class BootstrapServer:
    def __init__(self, host: str, port: int, prefill_tp: int):
        self.prefill_tp = prefill_tp
        self.rooms: dict[int, dict] = {}  # room -> {"regs": {rank: reg}, "tp": d, "reads": n}
        self.lock = threading.Lock()
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                try:
                    req = json.loads(self.rfile.readline())
                    reply = outer.handle(req)
                except (ValueError, KeyError, TypeError) as exc:
                    reply = {"error": f"bad bootstrap request: {exc}"}
                self.wfile.write((json.dumps(reply) + "\n").encode())

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="bootstrap", daemon=True)
        self.thread.start()

    def handle(self, req: dict) -> dict:
        room = int(req["room"])
        with self.lock:
            entry = self.rooms.setdefault(room, {"regs": {}, "tp": None, "reads": 0})
            if req["op"] == "register":
                entry["regs"][int(req["rank"])] = {k: req[k] for k in ("rank", "tp", "addr", "heads")}
                entry["tp"] = int(req["tp"])
                return {"ok": True}
            if req["op"] == "query":
                regs = list(entry["regs"].values())
                complete = entry["tp"] is not None and len(regs) == entry["tp"]
                if complete:
                    entry["reads"] += 1
                    if entry["reads"] >= self.prefill_tp:
                        del self.rooms[room]
                return {"complete": complete, "regs": regs}
        raise ValueError(f"unknown op {req['op']!r}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def bootstrap_call(host: str, port: int, req: dict, deadline: float) -> dict:
    """One request to a bootstrap server, retried until the monotonic deadline
    (the prefill side may still be starting)."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as s:
                s.sendall((json.dumps(req) + "\n").encode())
                line = s.makefile("rb").readline()
            reply = json.loads(line)
            if "error" in reply:
                raise RuntimeError(reply["error"])
            return reply
        except (OSError, ValueError) as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bootstrap server {host}:{port} unreachable: {exc}") from None
            time.sleep(0.05)


def register_receiver(
    host: str, port: int, room: int, rank: int, tp: int, addr: str, heads: tuple[int, int], deadline: float
) -> None:
    delay = SEAMS.bootstrap_delay_ms()
    if delay:
        time.sleep(delay / 1000)  # injected: this decode rank's handshake is late
    bootstrap_call(
        host,
        port,
        {"op": "register", "room": room, "rank": rank, "tp": tp, "addr": addr, "heads": list(heads)},
        deadline,
    )


def wait_for_receivers(host: str, port: int, room: int, deadline: float) -> list[dict]:
    """Poll the room until every decode rank registered; its registrations."""
    while True:
        reply = bootstrap_call(host, port, {"op": "query", "room": room}, deadline)
        if reply["complete"]:
            return reply["regs"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"bootstrap room {room}: decode registered {len(reply['regs'])} rank(s) only")
        time.sleep(0.01)
