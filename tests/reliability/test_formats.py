"""The two parsers that stand between hostile bytes and the engine, in-process:
the L3 page format and the strict JSON of /generate (the end-to-end probes are in
test_storage_integrity.py and test_http_probes.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.entrypoints.request_guard import parse_json
from engine.mem_cache import hicache_page as page

SHAPE = (2, 2, 16, 2, 32)
ME = page.writer_identity({"seed": 0}, "float32", 16, 2, 0, SHAPE)
PAYLOAD = np.random.default_rng(0).standard_normal(int(np.prod(SHAPE))).astype(np.float32).tobytes()
GOOD = page.encode(ME, "k1", PAYLOAD)


def _flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1 :]


@pytest.mark.parametrize(
    "data, key, identity, problem",
    [
        (_flip(GOOD, page.HEADER.size + 100), "k1", ME, "checksum mismatch"),
        (GOOD, "k2", ME, "holds another page"),
        (GOOD, "k1", page.writer_identity({"seed": 1}, "float32", 16, 2, 0, SHAPE), "another model"),
        (GOOD, "k1", page.writer_identity({"seed": 0}, "float32", 16, 2, 1, SHAPE), "TP rank"),
        (page.encode(ME, "k1", np.full(len(PAYLOAD) // 4, np.nan, np.float32).tobytes()), "k1", ME, "non-finite"),
        (PAYLOAD + bytes(page.HEADER.size), "k1", ME, "layout version"),
        (GOOD[:-1], "k1", ME, "size"),
        (_flip(GOOD, 0), "k1", ME, "layout version"),
    ],
)
def test_damaged_or_foreign_page_is_refused(data, key, identity, problem):
    check = page.decode(data, identity, key, len(PAYLOAD))
    assert check.payload is None and problem in check.problem


def test_intact_page_round_trips():
    check = page.decode(GOOD, ME, "k1", len(PAYLOAD))
    assert check.problem == "" and check.payload.tobytes() == PAYLOAD


@pytest.mark.parametrize(
    "body, reason",
    [
        (b'{"text": "\\ud800"}', "lone surrogate"),
        (b'{"a": {"\\udfff": 1}}', "lone surrogate"),
        (b'{"t": NaN}', "NaN is not a JSON number"),
        (b'{"t": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"t": 1e400}', "out of range"),
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 16"),
        (b'{"a": ' + b"[" * 17 + b"]" * 17 + b"}", "nested deeper than 16"),
        (b'{"a": "\xc3\x28"}', "not UTF-8 (byte 0xc3 at offset 7)"),
        (b'{"a": ', "malformed JSON"),
    ],
)
def test_strict_json_refuses_with_a_reason(body, reason):
    with pytest.raises(ValueError) as err:
        parse_json(body)
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_strict_json_accepts_ordinary_bodies():
    body = b'{"input_ids": [1, 2], "sampling_params": {"temperature": 0.5, "max_new_tokens": 4}, "text": "caf\xc3\xa9"}'
    assert parse_json(body)["text"] == "caf\u00e9"
