"""SGLang: srt/managers/tokenizer_manager.py (here a byte tokenizer, no model download).

A trivial byte tokenizer: UTF-8 bytes are ids 0..255; larger ids print as <id>."""

from __future__ import annotations


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    out: list[str] = []
    buf = bytearray()
    for i in ids:
        if 0 <= i < 256:
            buf.append(i)
            continue
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
        out.append(f"<{i}>")
    if buf:
        out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)
