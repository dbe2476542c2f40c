"""JSON that every parser reads (RFC 8259): Python's json writes NaN and Infinity by default,
which is not JSON (a fault window of 1e303 s made the Chrome export say `"dur":Infinity`, and
Perfetto, jq and JSON.parse refused the file). `dumps` writes a non-finite number as null and
a lone surrogate (a name that is not UTF-8) as its escape, so the document is strict whatever
the input. Standard library only."""

from __future__ import annotations

import json
import math


def finite(obj):
    """`obj` with every non-finite float replaced by None (containers copied only when needed)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj, **kw) -> str:
    """json.dumps that never writes NaN/Infinity (ensure_ascii keeps lone surrogates escaped)."""
    return json.dumps(finite(obj), allow_nan=False, **kw)
