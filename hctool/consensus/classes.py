"""Equivalence classes of ranks, STAT-style: a thousand ranks' stacks folded into a few.

LLNL's STAT merges the stacks of every task into a prefix tree whose nodes carry the set of
tasks that passed through them, so one debugs one representative per class. Here:

- `stack_classes(stacks)`: each rank's main-thread stack (a py-spy dump, a faulthandler dump,
  or the frames of a Flight Recorder entry) as a path of frames, outermost first; ranks with
  the same path form a class; the classes are listed smallest first (the odd ones) and also
  folded into a prefix tree (`tree`) whose nodes carry their ranks;
- `count_classes(counts)`: ranks grouped by their calls per op; the odd groups first.

Ranks are written as compressed ranges ("0-511,513-1023").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# a py-spy frame line: "    function (path/file.py:LINE)"; faulthandler's: '  File "path", line N in function'
_PYSPY = re.compile(r"^\s+(?P<fn>\S.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")
_FAULTHANDLER = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<fn>\S+)')
# frames that are the machinery between a program and its collective, not the program
_MACHINERY = ("torch/distributed/", "torch/nn/modules/module.py", "hctool/agent/", "/threading.py", "<frozen runpy>")
MAX_FRAMES = 24


def ranges(ranks) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out, rs = [], sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


def main_thread_frames(text: str) -> list[str]:
    """The main thread's frames of a stack dump, innermost first, as "function (file.py:LINE)"
    with only the file's name; hctool's and torch's own frames left out."""
    frames: list[str] = []
    in_main = False
    for line in text.splitlines():
        if line.startswith("Thread ") or line.startswith("Current thread") or line.startswith("Thread 0x"):
            if frames:
                break
            in_main = "MainThread" in line or line.startswith("Current thread")
            continue
        if not in_main:
            continue
        m = _PYSPY.match(line) or _FAULTHANDLER.match(line)
        if m is None:
            continue
        path = m.group("file")
        if any(s in path for s in _MACHINERY):
            continue
        frames.append(f"{m.group('fn')} ({path.rsplit('/', 1)[-1]}:{m.group('line')})")
    return frames[:MAX_FRAMES]


@dataclass
class StackClass:
    ranks: list[int]
    frames: list[str]  # innermost first

    def to_json(self) -> dict:
        return {"ranks": ranges(self.ranks), "size": len(self.ranks), "frames": self.frames}

    def words(self) -> str:
        """`ranks 0-511,513-1023: all_reduce (train.py:88) <- step (train.py:40) <- main (train.py:99)`"""
        who = f"rank{'s' if len(self.ranks) > 1 else ''} {ranges(self.ranks)}"
        return f"{who}: {' <- '.join(self.frames[:6]) if self.frames else '(no frame)'}"


@dataclass
class Node:
    """A frame of the merged tree (outermost at the root) and the ranks that passed it."""

    frame: str
    ranks: list[int] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"frame": self.frame, "ranks": ranges(self.ranks), "children": [c.to_json() for c in self.children]}


def stack_classes(stacks: dict[int, list[str]]) -> list[StackClass]:
    """Ranks with the same frames (innermost first) in one class; smallest (odd) classes first."""
    by_path: dict[tuple, list[int]] = {}
    for rank, frames in stacks.items():
        by_path.setdefault(tuple(frames), []).append(rank)
    classes = [StackClass(sorted(rs), list(path)) for path, rs in by_path.items()]
    return sorted(classes, key=lambda c: (len(c.ranks), c.ranks[0]))


def tree(classes: list[StackClass]) -> list[Node]:
    """The classes merged into a prefix tree, outermost frame at the root (STAT's view)."""
    roots: list[Node] = []
    for c in classes:
        level = roots
        for frame in reversed(c.frames):
            node = next((n for n in level if n.frame == frame), None)
            if node is None:
                node = Node(frame)
                level.append(node)
            node.ranks.extend(c.ranks)
            level = node.children
    _sort(roots)
    return roots


def _sort(nodes: list[Node]) -> None:
    for n in nodes:
        n.ranks.sort()
        _sort(n.children)
    nodes.sort(key=lambda n: (len(n.ranks), n.ranks[0] if n.ranks else 0))


def tree_lines(nodes: list[Node], indent: str = "") -> list[str]:
    """The merged tree in text: one line per frame where the ranks part, odd branches first."""
    out = []
    for n in nodes:
        chain, node = [n.frame], n
        while len(node.children) == 1 and node.children[0].ranks == node.ranks:
            node = node.children[0]
            chain.append(node.frame)
        shown = chain if len(chain) <= 3 else [chain[0], f"... {len(chain) - 2} frames ...", chain[-1]]
        out.append(f"{indent}[{ranges(n.ranks)}] " + " -> ".join(shown))
        out += tree_lines(node.children, indent + "  ")
    return out


@dataclass
class CountClass:
    ranks: list[int]
    counts: dict[str, int]

    def to_json(self) -> dict:
        return {"ranks": ranges(self.ranks), "size": len(self.ranks), "counts": self.counts}

    def words(self) -> str:
        total = sum(self.counts.values())
        detail = ", ".join(f"{n} {op}" for op, n in sorted(self.counts.items(), key=lambda kv: -kv[1]))
        return f"rank{'s' if len(self.ranks) > 1 else ''} {ranges(self.ranks)}: {total} ({detail})"


def count_classes(counts: dict) -> list[CountClass]:
    """Ranks grouped by their calls per op; smallest (odd) groups first."""
    by: dict[tuple, list[int]] = {}
    for rank, ops in counts.items():
        by.setdefault(tuple(sorted(ops.items())), []).append(int(rank))
    classes = [CountClass(sorted(rs), dict(key)) for key, rs in by.items()]
    return sorted(classes, key=lambda c: (len(c.ranks), c.ranks[0]))
