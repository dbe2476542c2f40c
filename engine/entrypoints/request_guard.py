"""SGLang: none (its server relies on FastAPI/pydantic; this engine parses bodies itself).

What a /generate body must be before anything parses it for meaning: bounded in
size (413), bounded in depth, strict JSON (no NaN/Infinity, no duplicate keys) and
valid Unicode (no lone surrogates, which cannot be encoded back into an answer).

The body is read in chunks and reading stops at the limit, so a 50 MB body costs
nothing; a declared Content-Length over the limit is refused before any byte is read.
"""

from __future__ import annotations

import asyncio
import json

MIN_BODY_LIMIT = 1 << 20  # bytes; raised for long contexts by body_limit()
MAX_JSON_DEPTH = 16  # {"sampling_params": {...}} needs 2
DRAIN_BYTES = 8 << 20  # after the limit, read and drop up to this much (and DRAIN_S) so the client sees the 413
DRAIN_S = 1.0


class BodyError(Exception):
    """A body refused before parsing; `status` is 400 or 413."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def body_limit(max_context_len: int) -> int:
    """1 MiB, or enough for the longest servable prompt written out in full (an id
    takes at most 7 bytes of JSON, a text byte at most 6 as an escape, + 16 for margin)."""
    return max(MIN_BODY_LIMIT, 16 * max_context_len + (64 << 10))


async def read_body(request, limit: int = MIN_BODY_LIMIT) -> bytes:
    """The request body, or BodyError(413) as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BodyError(400, f"bad Content-Length {declared[:40]!r}")
        if int(declared) > limit:
            raise BodyError(413, f"body of {int(declared)} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            await _drain(stream, DRAIN_BYTES)
            raise BodyError(413, f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _drain(stream, most: int) -> None:
    """Read and drop what the client is still sending (bounded in bytes and time), so
    it reads our 413 instead of a connection reset."""
    deadline = asyncio.get_running_loop().time() + DRAIN_S
    while most > 0:
        left = deadline - asyncio.get_running_loop().time()
        try:
            chunk = await asyncio.wait_for(anext(stream), max(left, 0.0))
        except Exception:  # end of the body, the time is up, or the client left
            return
        most -= len(chunk)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {dup!r}")
    return out


def _check_tree(value) -> None:
    """Depth and Unicode of a parsed document, iteratively (no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                for k, v in item.items():
                    _check_text(k)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in item if isinstance(v, (str, dict, list)))


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(s[exc.start])
        raise ValueError(f"a string holds a lone surrogate (\\u{code:04x}), which is not Unicode text") from None


def parse_json(body: bytes):
    """Strict parse; ValueError with a one-line reason."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"the body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite, object_pairs_hook=_no_duplicates)
    except RecursionError:  # the C decoder recurses once per level
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON: {exc}") from None
    _check_tree(value)
    return value
