"""SGLang: srt/disaggregation/decode_hicache_mixin.py (DecodeHiCacheTransferMixin).

With `--disaggregation-decode-enable-radix-cache --enable-hierarchical-cache`, a
request whose prompt prefix sits in the decode server's own L2 is restored
locally (an H2D load-back) instead of being copied from the transfer; its room
counts as arrived only once the restore is READY on this rank, and the decode
ranks' MIN poll then moves it on together.

`_process_hicache_local_restores` runs every tick on every decode rank, in
SGLang's three phases, each its own method so a stack names the phase:
- A `_poll_restores_in_flight`: requests whose load-back is in flight become READY
  when its event is done;
- B `_load_back_slot_free`, then `_try_hicache_queue_load_back`: if a load-back slot
  is free, queue `init_load_back` for the requests not yet restoring;
- C `_start_restore_copies`: submit the queued load-backs as one copy (`start_loading`).
`--decode-restore-gate event` is the shape of SGLang #29483: Phase A and the
Phase B gate call `is_load_back_event_done`, which enters `loading_check()` (a TP
all_reduce) only where the rank's own event fired, and Phase B is gated on the
`producer_index + 1` slot's event. `slot` is the fix: Phase A polls the local
event only and Phase B is gated on `has_free_load_back_slot()` (replicated).
"""

from __future__ import annotations

from engine.disaggregation.conn import KVPoll


class DecodeHiCacheMixin:
    """Mixed into DecodeQueues; `self.scheduler.tree_cache` is a HiRadixCache."""

    def _process_hicache_local_restores(self, decode_reqs: list) -> None:
        """SGLang's three phases, each a named step, so a stack or a probe names the phase."""
        active = [dr for dr in decode_reqs if dr.host_len and not dr.restore_ready]
        self._poll_restores_in_flight(active)  # Phase A
        if not self._load_back_slot_free():  # Phase B gate
            return
        queued = [dr for dr in active if dr.restored_node is None and self._try_hicache_queue_load_back(dr)]
        if queued:
            self._start_restore_copies(queued)  # Phase C

    def _poll_restores_in_flight(self, active: list) -> None:
        """Phase A: in-flight load-backs whose event is done become READY."""
        tree = self.scheduler.tree_cache
        for dr in active:
            if dr.restored_node is not None and tree.is_load_back_event_done(dr.consumer_index):
                dr.restore_ready = True

    def _load_back_slot_free(self) -> bool:
        """Phase B's gate: may new load-backs be queued this tick? event (pre-fix): the next
        producer slot's local event; slot (the fix): a free slot by the replicated ack queue."""
        tree = self.scheduler.tree_cache
        if self.scheduler.args.variants.decode_restore_gate == "event":
            counter = tree.cache_controller.layer_done_counter
            if not tree.is_load_back_event_done((counter.producer_index + 1) % counter.num_counters):
                return False  # SGLang's shape: Phase B returns early on the next slot's local event
            return True
        return tree.has_free_load_back_slot()

    def _start_restore_copies(self, queued: list) -> None:
        """Phase C: one merged copy; Phase A polls its slot from the next tick on."""
        consumer_index = self.scheduler.tree_cache.cache_controller.start_loading()
        for dr in queued:
            dr.consumer_index = consumer_index

    def _try_hicache_queue_load_back(self, dr) -> bool:
        """Mutates: tree (re-match, load-back, locks), allocator. True iff a copy was queued."""
        tree, req = self.scheduler.tree_cache, dr.req
        m = tree.match_prefix(req.input_ids)
        restored = list(m.device_pages[dr.l1_len // self.page_size :])
        new_pages: list[int] = []
        if m.host_hit_length:
            loaded = tree.init_load_back(m.last_host_node)
            if loaded is None:
                return False  # no L1 room now (logical counts: the same on every rank)
            new_pages = [pg for n in loaded[0] for pg in n.value]
        if (len(restored) + len(new_pages)) * self.page_size < dr.host_len:
            return False  # the prefix shrank (cannot happen while host_ref holds it)
        dr.restored_pages = (restored + new_pages)[: dr.host_len // self.page_size]
        dr.restored_node = m.last_host_node
        tree.inc_lock_ref(dr.restored_node)
        tree.dec_host_ref(dr.last_host_node)  # the prealloc's hold; the load ack holds its own
        dr.last_host_node = None
        if not new_pages:
            dr.restore_ready = True  # already on device (another request restored it)
            return False
        return True

    def _gate_restore(self, dr, state: KVPoll) -> KVPoll:
        """HiCacheRestoreGatedKVReceiver: arrived KV waits for the local restore."""
        if state == KVPoll.Success and dr.host_len and not dr.restore_ready:
            return KVPoll.Transferring
        return state

    def _commit_hicache_local_restore_to_req(self, dr) -> None:
        """Mutates: the request takes the restored prefix (locked by restored_node)."""
        if not dr.host_len:
            return
        tree, req = self.scheduler.tree_cache, dr.req
        tree.cache_controller.load_stream.synchronize()  # rank-local: the copies are done here too
        tree.dec_lock_ref(req.last_node)
        req.last_node = dr.restored_node
        l1 = dr.l1_len // self.page_size
        req.pages = req.pages[:l1] + dr.restored_pages + req.pages[l1:]
        req.tree_pages = l1 + len(dr.restored_pages)

    def _abort_hicache_local_restore(self, dr) -> None:
        tree = self.scheduler.tree_cache
        if dr.last_host_node is not None:
            tree.dec_host_ref(dr.last_host_node)
        if dr.restored_node is not None:
            tree.dec_lock_ref(dr.restored_node)
