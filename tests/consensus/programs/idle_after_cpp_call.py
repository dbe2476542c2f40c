"""Two ranks make async ProcessGroup calls (the dispatcher route C++ code such
as DDP's reducer takes), wait for them, idle, and SIGKILL themselves (so neither
destroy_process_group nor exit polls anything): only the recorder's watcher
thread can have completed the last call's record. Each rank prints the states
of its own records as one JSON line (`STATES [...]`) before dying."""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from common import init
from hctool.consensus.trace import TraceDirReader

rank, _ = init()
pg = dist.distributed_c10d._get_default_group()
t = torch.ones(4)
for _ in range(3):
    pg.allreduce([t]).wait()
time.sleep(0.5)  # the watcher polls every 20 ms
events = [e for e in TraceDirReader(os.environ["HCTOOL_TRACE_DIR"]).poll() if e["rank"] == rank]
print("STATES", json.dumps([[e["op"], e["state"]] for e in events]))
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)
