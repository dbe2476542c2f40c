"""SGLang: none (its frontend and scheduler talk over ZMQ IPC sockets).

The frontend's end of the rank link: accept TCP connections on 127.0.0.1 until one passes the
multiprocessing HMAC handshake (the authkey only rank 0 has), and return it. Each peer is
handshaken in a thread of its own under a deadline, so a stray connection (a port scanner, a
client of the wrong key, one that sends nothing) is dropped with a line in the log and never
holds up, or kills, the accept of the real rank 0.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

HANDSHAKE_S = 10.0  # far above a handshake on loopback (well under a millisecond)


def accept_peer(server: socket.socket, authkey: bytes) -> tuple[Connection, tuple]:
    """The first connection that completes the handshake, and its address; closes `server`."""
    passed: queue.Queue = queue.Queue()
    server.settimeout(0.2)
    try:
        while passed.empty():
            try:
                sock, addr = server.accept()
            except TimeoutError:
                continue
            threading.Thread(
                target=_handshake, args=(sock, addr, authkey, passed), name="rank-link-handshake", daemon=True
            ).start()
    finally:
        server.close()
    return passed.get()


def _handshake(sock: socket.socket, addr, authkey: bytes, passed: queue.Queue) -> None:
    sock.settimeout(None)
    conn = Connection(os.dup(sock.fileno()))
    deadline = threading.Timer(HANDSHAKE_S, _cut, args=(sock,))  # a silent peer: its reads end
    deadline.start()
    try:
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
    except (AuthenticationError, EOFError, OSError) as exc:
        why = "no answer within the deadline" if not deadline.is_alive() else f"{type(exc).__name__}: {exc}"
        print(
            f"rank link: dropped a connection from {addr[0]}:{addr[1]} that failed the handshake ({why})",
            file=sys.stderr,
            flush=True,
        )
        conn.close()
        return
    finally:
        deadline.cancel()
        sock.close()  # the Connection holds its own descriptor
    passed.put((conn, addr))


def _cut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
