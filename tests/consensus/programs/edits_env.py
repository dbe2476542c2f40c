"""A program that scrubs its environment of variables it does not know (as some launchers and
sandboxes do), then issues its collectives: its traces still belong to the run."""

import os
import sys

for name in [n for n in os.environ if n.startswith("HCTOOL_")]:
    os.environ.pop(name)
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import json  # noqa: E402

import torch.distributed as dist  # noqa: E402
from common import finish, init, ones  # noqa: E402

init()
for _ in range(3):
    dist.all_reduce(ones(4))
print(json.dumps({"done": True}))  # a program's own json.dumps, which a probe or fault may target
finish()
