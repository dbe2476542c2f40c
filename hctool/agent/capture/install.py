"""The capture's one installer: turn the recorder on and wrap torch.distributed as soon as it
is imported (wrappers.py wraps the Python API; at init_process_group it loads the C++
capture kernel and installs the dispatcher routes of c10d.py and funcol.py)."""

from __future__ import annotations

import os
import sys

from hctool.agent.capture import state, tracefile
from hctool.agent.hooks import when_imported
from hctool.protocol import env as protocol_env
from hctool.protocol.runrecord import claimed_run


def install_on_import(trace_dir: str) -> None:
    state.S.trace_dir = os.path.abspath(trace_dir)
    # The run this process belongs to, read now: the program may edit its environment later
    # (and start children without it), which must not detach its traces from the run.
    state.S.run_id = os.environ.get(protocol_env.RUN_ID) or claimed_run(state.S.trace_dir)
    sys.excepthook = tracefile.excepthook(sys.excepthook)

    def patch(_module) -> None:
        from hctool.agent.capture import wrappers  # imports torch.distributed's parts: only now

        wrappers.patch_torch_distributed()

    when_imported("torch.distributed", patch)
