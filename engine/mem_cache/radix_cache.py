"""SGLang: srt/mem_cache/radix_cache.py.

Radix prefix cache over page-aligned token keys (the L1 tier).

Each method says what it mutates. Access order uses a logical clock advanced by
the replicated schedule, never the wall clock, so every rank picks the same
eviction victims (a wall-clock LRU lets ranks evict different nodes).
"""

from __future__ import annotations

import array
import hashlib
import heapq
import itertools
from typing import NamedTuple

from engine import streams
from engine.lab.snapshot import cache_state, check_accounting
from engine.mem_cache.base_prefix_cache import BasePrefixCache

_node_ids = itertools.count()


def chain_hashes(prev: str, tokens: tuple[int, ...] | list[int], page_size: int) -> list[str]:
    """Storage keys of consecutive pages: each page's key hashes the previous key,
    so a key names the whole prefix up to and including its page."""
    out = []
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        h = hashlib.sha256(prev.encode())
        h.update(array.array("i", tokens[i : i + page_size]).tobytes())
        prev = h.hexdigest()[:32]
        out.append(prev)
    return out


class TreeNode:
    def __init__(self, parent: TreeNode | None, key: tuple[int, ...], value: list[int] | None, hashes: list[str]):
        self.id = next(_node_ids)
        self.parent = parent
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.key = key  # token ids, a whole number of pages
        self.value = value  # L1 pages, or None once evicted from the device
        self.host_value: list[int] | None = None  # L2 pages
        self.hash_value = hashes  # L3 keys, one per page
        self.lock_ref = 0  # requests using this node's device pages
        self.host_ref = 0  # copies reading this node's host pages
        self.last_access = 0
        self.hit_count = 0
        self.backuped = False  # host copy complete (write ack processed)
        self.writing = False  # D2H copy in flight
        self.write_event = None

    @property
    def evicted(self) -> bool:
        return self.value is None

    def __lt__(self, other: TreeNode) -> bool:  # heap order: LRU, then creation
        return (self.last_access, self.id) < (other.last_access, other.id)


class MatchResult(NamedTuple):
    device_pages: list[int]  # L1 pages of the matched device prefix
    last_device_node: TreeNode
    last_host_node: TreeNode  # deepest matched node with a host copy (== last_device_node if none)
    host_hit_length: int  # tokens matched on host only (need load-back)


class InsertResult(NamedTuple):
    duplicate_pages: list[int]  # caller's pages the tree already held: free them
    new_nodes: list[TreeNode]  # nodes that took device pages from the caller


class RadixCache(BasePrefixCache):
    def __init__(self, page_size: int, allocator, disable: bool = False, lru_clock: str = "logical"):
        super().__init__()
        self.page_size = page_size
        self.allocator = allocator
        self.disable = disable
        self.clock = 0
        self.lru_clock = lru_clock
        self.reset()

    # -- reads ----------------------------------------------------------------------
    def nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def evictable_size(self) -> int:
        return sum(len(n.key) for n in self.nodes() if not n.evicted and n.lock_ref == 0)

    def protected_size(self) -> int:
        return sum(len(n.key) for n in self.nodes() if not n.evicted and n.lock_ref > 0)

    def device_pages_in_tree(self) -> int:
        return sum(len(n.value) for n in self.nodes() if not n.evicted)

    def peek_prefix(self, key) -> tuple[int, int, int]:
        """(device tokens, host-only tokens, device tokens now evictable) that
        match_prefix would find. Mutates nothing: admission may peek on one rank
        more often than on another."""
        key = self._aligned(key)
        node, dev, host, unlocked = self.root, 0, 0, 0
        if self.disable:
            return 0, 0, 0
        while key:
            child = node.children.get(key[: self.page_size])
            if child is None:
                break
            n = self._common_len(child.key, key)
            if not child.evicted and host == 0:
                dev += n
                unlocked += n if child.lock_ref == 0 else 0
            elif child.backuped:
                host += n
            else:
                break
            if n < len(child.key):
                break
            node, key = child, key[n:]
        return dev, host, unlocked

    def _aligned(self, key) -> tuple[int, ...]:
        return tuple(key[: len(key) - len(key) % self.page_size])

    # -- mutations ----------------------------------------------------------------------
    def reset(self) -> None:
        """Mutates: the whole tree (drops it). Callers free pages first."""
        self.root = TreeNode(None, (), [], [])
        self.root.lock_ref = 1
        self.root.backuped = True

    def flush(self) -> None:
        """Mutates: everything. Callers ensure no request is running or waiting."""
        for n in self.nodes():
            if not n.evicted:
                self.allocator.free(n.value)
        self.reset()

    def match_prefix(self, key) -> MatchResult:
        """Mutates: splits nodes at the match boundary, advances access times."""
        now = self._advance_clock()
        key = self._aligned(key)
        node, pages, last_dev, last_host, host_len = self.root, [], self.root, self.root, 0
        if self.disable:
            return MatchResult([], self.root, self.root, 0)
        while key:
            child = node.children.get(key[: self.page_size])
            if child is None:
                break
            n = self._common_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            if not child.evicted:
                pages.extend(child.value)
                last_dev = last_host = child
            elif child.backuped:
                host_len += len(child.key)
                last_host = child
            else:
                break  # its host copy is still being written: not usable yet
            child.last_access = now
            node, key = child, key[n:]
        return MatchResult(pages, last_dev, last_host, host_len)

    def insert(self, key, pages: list[int]) -> InsertResult:
        """Mutates: adds nodes (or re-fills evicted ones) for the part of `key` whose
        KV is not on the device yet, taking device pages from `pages`. Pages at
        positions the tree already holds on the device under other page numbers are
        returned as duplicates for the caller to free."""
        now = self._advance_clock()
        key = self._aligned(key)
        pages = pages[: len(key) // self.page_size]
        if self.disable:
            return InsertResult(list(pages), [])
        node, done, dup, new_nodes = self.root, 0, [], []
        while done < len(key):
            rest, at = key[done:], done // self.page_size
            child = node.children.get(rest[: self.page_size])
            if child is None:
                prev = node.hash_value[-1] if node.hash_value else ""
                leaf = TreeNode(node, rest, pages[at:], chain_hashes(prev, rest, self.page_size))
                leaf.last_access, leaf.hit_count = now, 1
                node.children[rest[: self.page_size]] = leaf
                new_nodes.append(leaf)
                break
            n = self._common_len(child.key, rest)
            if n < len(child.key):
                child = self._split(child, n)
            mine = pages[at : at + n // self.page_size]
            if child.evicted:
                child.value = mine  # host-only node gets its device copy back
                new_nodes.append(child)
            else:
                dup.extend(p for p, q in zip(mine, child.value) if p != q)
            child.last_access = now
            child.hit_count += 1
            node, done = child, done + n
        return InsertResult(dup, new_nodes)

    def _advance_clock(self) -> float:
        """The access stamp of one match or insert: the logical clock, advanced by the
        replicated schedule; or (lru_clock=wall, the pre-fix behaviour of a CP HiCache
        fork) this rank's wall clock, whose readings order accesses differently on
        ranks whose clocks are off."""
        self.clock += 1
        return self._stamp()

    def _stamp(self) -> float:
        return self.clock if self.lru_clock == "logical" else streams.wall_clock()

    def alloc_pages(self, num_pages: int) -> list[int] | None:
        """Mutates: the device allocator, and the tree when it must evict. Eviction is
        decided on the logical free count, so every rank evicts the same nodes."""
        short = num_pages * self.page_size - self.allocator.logical_available_size()
        if short > 0:
            self.evict(short)
        return self.allocator.alloc(num_pages)

    @staticmethod
    def _add_ref(node: TreeNode | None, attr: str, delta: int) -> None:
        """Mutates: a ref count of node and every ancestor (a ref pins the whole path)."""
        while node is not None:
            value = getattr(node, attr) + delta
            assert value >= 0, f"{attr} underflow at node {node.id}"
            setattr(node, attr, value)
            node = node.parent

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Mutates: lock_ref of node and ancestors (protects their device pages)."""
        self._add_ref(node, "lock_ref", 1)

    def dec_lock_ref(self, node: TreeNode) -> None:
        self._add_ref(node, "lock_ref", -1)

    def evict(self, num_tokens: int) -> int:
        """Mutates: removes device copies of least recently used unlocked leaves until
        `num_tokens` are freed (logically). Returns tokens evicted."""
        heap = [n for n in self.nodes() if self._is_device_leaf(n)]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            node = heapq.heappop(heap)
            freed = self._evict_device(node)
            evicted += freed
            parent = node.parent
            if freed and parent is not self.root and self._is_device_leaf(parent):
                heapq.heappush(heap, parent)
        self.evicted_tokens_total += evicted
        return evicted

    def _is_device_leaf(self, n: TreeNode) -> bool:
        return not n.evicted and n.lock_ref == 0 and n is not self.root and all(c.evicted for c in n.children.values())

    def _evict_device(self, node: TreeNode) -> int:
        """L1-only cache: drop the node and free its pages."""
        if node.children:
            return 0
        self.allocator.free(node.value)
        self._delete(node)
        return len(node.key)

    def _delete(self, node: TreeNode) -> None:
        del node.parent.children[node.key[: self.page_size]]

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Mutates: cuts `child` after n tokens; returns the new upper node."""
        p = n // self.page_size
        upper = TreeNode(child.parent, child.key[:n], None if child.evicted else child.value[:p], child.hash_value[:p])
        upper.host_value = None if child.host_value is None else child.host_value[:p]
        for attr in ("lock_ref", "host_ref", "last_access", "hit_count", "backuped", "writing", "write_event"):
            setattr(upper, attr, getattr(child, attr))
        child.parent.children[child.key[: self.page_size]] = upper
        child.key, child.hash_value = child.key[n:], child.hash_value[p:]
        child.value = None if child.evicted else child.value[p:]
        child.host_value = None if child.host_value is None else child.host_value[p:]
        child.parent = upper
        upper.children[child.key[: self.page_size]] = child
        return upper

    def _common_len(self, a, b) -> int:
        p, n = self.page_size, 0
        while n < len(a) and n < len(b) and a[n : n + p] == b[n : n + p]:
            n += p
        return n

    # -- checks ----------------------------------------------------------------------
    def check_integrity(self, pages_in_use: int) -> None:
        """free + cached + in use == total per tier, and the tree's structural invariants
        (one check for every cache: engine/lab/snapshot.py check_accounting)."""
        check_accounting(cache_state(self, pages_in_use=pages_in_use), self.page_size)
