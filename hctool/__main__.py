"""`python -m hctool`. For `-m`, Python puts the working directory first on sys.path, where a user's
own `engine.py` shadows this project's `engine` package and runs on import (`hctool lint .` inside
detr's repository ran its engine.py). The folder this package was imported from takes that place,
as it has for the `hctool` script; the user's files are data, never imported."""

import os
import sys
from pathlib import Path

_home = str(Path(__file__).resolve().parent.parent)
if sys.path and sys.path[0] in ("", os.getcwd()) and sys.path[0] != _home:
    sys.path[0] = _home

from hctool.cli import main  # noqa: E402  (after sys.path is mended)

main()
