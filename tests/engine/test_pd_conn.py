"""The PD KV channel in one process, over real TCP sockets: bootstrap handshake,
head re-sharding from p prefill ranks to d decode ranks, and failures."""

from __future__ import annotations

import time

import pytest
import torch

from engine.disaggregation.bootstrap import BootstrapServer
from engine.disaggregation.conn import KVPoll, KVReceiverManager, KVSenderManager, head_range
from engine.lab.seams import SEAMS
from hctool.supervise.procs import free_port

HEADS, LAYERS, TOKENS, HD = 4, 2, 5, 3


def wait_state(receiver: KVReceiverManager, room: int, want: set, timeout: float = 20.0) -> KVPoll:
    deadline = time.monotonic() + timeout
    while (state := receiver.poll(room)) not in want:
        assert time.monotonic() < deadline, f"room {room} stuck in {state!r}"
        time.sleep(0.01)
    return state


@pytest.mark.timeout(60)
@pytest.mark.parametrize("p,d", [(1, 2), (2, 2), (2, 1), (4, 2)])
def test_heads_are_resharded_from_p_to_d_ranks(p, d):
    full_k = torch.randn(LAYERS, TOKENS, HEADS, HD)
    full_v = torch.randn(LAYERS, TOKENS, HEADS, HD)
    port = free_port()
    server = BootstrapServer("127.0.0.1", port, prefill_tp=p)
    receivers = [KVReceiverManager("127.0.0.1", j, d, HEADS, timeout=20) for j in range(d)]
    senders = [KVSenderManager("127.0.0.1", port, i, p, HEADS, timeout=20) for i in range(p)]
    try:
        room = 12345
        for i, s in enumerate(senders):  # prefill may push before decode registered
            lo, hi = head_range(i, p, HEADS)
            s.send(room, full_k[:, :, lo:hi].clone(), full_v[:, :, lo:hi].clone(), first_token=77)
        for r in receivers:
            r.init(room, "127.0.0.1", port)
        for j, r in enumerate(receivers):
            assert wait_state(r, room, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
            got = r.pop(room)
            lo, hi = head_range(j, d, HEADS)
            assert torch.equal(got.k, full_k[:, :, lo:hi]) and torch.equal(got.v, full_v[:, :, lo:hi])
            assert got.first_token == 77
        assert server.rooms == {}, "a room read complete by every prefill rank is forgotten"
    finally:
        for s in senders:
            s.close()
        for r in receivers:
            r.close()
        server.close()


@pytest.mark.timeout(60)
def test_a_dropped_part_fails_the_room_at_its_deadline():
    port = free_port()
    server = BootstrapServer("127.0.0.1", port, prefill_tp=1)
    receiver = KVReceiverManager("127.0.0.1", 0, 1, HEADS, timeout=1.0)
    sender = KVSenderManager("127.0.0.1", port, 0, 1, HEADS, timeout=5)
    SEAMS.install(kv_dropped=lambda: True)  # what `--inject kv-drop` installs on a prefill rank
    try:
        receiver.init(7, "127.0.0.1", port)
        sender.send(7, torch.zeros(LAYERS, 2, HEADS, HD), torch.zeros(LAYERS, 2, HEADS, HD), 1)
        assert wait_state(receiver, 7, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Failed
        assert "no KV within" in receiver.pop(7).error
    finally:
        SEAMS.reset()
        sender.close()
        receiver.close()
        server.close()


@pytest.mark.timeout(60)
def test_unreachable_bootstrap_fails_the_room():
    receiver = KVReceiverManager("127.0.0.1", 0, 1, HEADS, timeout=1.0)
    try:
        receiver.init(9, "127.0.0.1", free_port())  # nobody listens there
        assert wait_state(receiver, 9, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Failed
    finally:
        receiver.close()
