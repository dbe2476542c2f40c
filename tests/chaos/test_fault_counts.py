"""The fault counts file (hctool/agent/counts.py) belongs to the rank that started it: a process
forked from the rank (a DataLoader worker, any multiprocessing child) ends through os._exit,
which the agent hooks to flush; the fork must neither write the rank's file nor take its lock."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, os, sys
os.environ["HCTOOL_TRACE_DIR"] = sys.argv[1]
from hctool.agent import counts
from hctool.protocol.faults import parse_fault
f = parse_fault("clock-skew:ms=5")
counts.start([f], 0)
counts.fired(f)                      # the rank: fired once, flushed at the first firing
pid = os.fork()
if pid == 0:
    counts.fired(f)                  # the fork's own copy of the counts
    os._exit(0)                      # as a multiprocessing child ends: through the hook
os.waitpid(pid, 0)
(name,) = [n for n in os.listdir(sys.argv[1]) if n.startswith("faults-")]
print(json.dumps({"me": os.getpid(), "file": json.load(open(os.path.join(sys.argv[1], name)))}))
"""


def test_a_forked_child_leaves_the_ranks_counts_alone(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["file"]["pid"] == doc["me"] and doc["file"]["faults"][0]["fired"] == 1, doc
