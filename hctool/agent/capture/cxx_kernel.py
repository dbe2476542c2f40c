"""Loading the C++ capture kernel in a rank: the module check-consensus built for this torch
(hctool/consensus/kernel_build.py) at the path in HCTOOL_C10D_KERNEL."""

from __future__ import annotations

import importlib.util
import os
import re
import sys

from hctool.protocol import env as protocol_env

MODULE = "hctool.agent.capture._c10d_kernel"
ENV = protocol_env.C10D_KERNEL


def load():
    """The module at $HCTOOL_C10D_KERNEL, or None (not set, or not loadable here: said on stderr)."""
    path = os.environ.get(ENV)
    if not path or path == "0":
        return None
    try:
        import torch

        spec = importlib.util.spec_from_file_location(MODULE, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if module.torch_version != torch.__version__.split("+")[0]:
            raise ImportError(f"built for torch {module.torch_version}, this is {torch.__version__}")
        return module
    except Exception as exc:
        sys.stderr.write(
            f"hctool: the C++ capture kernel is not used here ({type(exc).__name__}: {exc}); "
            "C++-issued collectives go through the Python kernel\n"
        )
        return None


def counter_value(counter) -> int:
    """The next value of an itertools.count or Counter, without taking it."""
    m = re.search(r"\((-?\d+)", repr(counter))
    return int(m.group(1)) if m else 0
