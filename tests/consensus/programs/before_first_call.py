"""Forms the process group, then waits before its first collective (a data loader that never
delivers): a run ended by --timeout here has seen no call, and says so."""

import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import init  # noqa: E402

init()
time.sleep(600)
