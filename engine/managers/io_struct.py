"""SGLang: srt/managers/io_struct.py (and srt/sampling/sampling_params.py).

The typed messages between the HTTP frontend and rank 0 (pickled over the
multiprocessing connection; rank 0 broadcasts the inputs to the other ranks).
`SamplingParams` is the one owner of the sampling defaults and of the checks
both sides apply: SGLang's defaults, max_new_tokens 128 at temperature 1.0
(sampled; a request asks for greedy with temperature 0). docs/architecture.md
describes the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default
DEFAULT_TEMPERATURE = 1.0  # SGLang's SamplingParams default
SAMPLING_EPS = 1e-6  # SGLang's _SAMPLING_EPS: a temperature below it samples greedily
MAX_TEMPERATURE = 100.0  # above it every token is about equally likely; 1e308 or inf is a mistake


@dataclass
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    ignore_eos: bool = False

    def verify(self) -> str | None:
        """The reason these parameters are invalid, or None."""
        n, t = self.max_new_tokens, self.temperature
        if isinstance(n, bool) or not isinstance(n, int):
            return f"max_new_tokens must be an integer, got {n!r}"
        if n < 0:
            return f"max_new_tokens must not be negative, got {n}"
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TEMPERATURE:
            return f"temperature must be a number from 0 to {MAX_TEMPERATURE:g}, got {t!r}"
        if not isinstance(self.ignore_eos, bool):
            return f"ignore_eos must be true or false, got {self.ignore_eos!r}"
        return None


def verify_input_ids(ids, vocab_size: int) -> str | None:
    if not isinstance(ids, list) or not ids:
        return "the prompt is empty" if isinstance(ids, list) else "input_ids must be a list of integers"
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            return f"every input id must be an integer, got {i!r}"
        if not 0 <= i < vocab_size:
            return f"input id {i} is outside the vocabulary [0, {vocab_size})"
    return None


# -- frontend -> rank 0 -> every rank ---------------------------------------------------
@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    # PD only (SGLang's names): the prefill's bootstrap server and this request's room.
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    # DP (SGLang's name): the replica rank 0's router chose; None until it has chosen.
    data_parallel_rank: int | None = None

    def verify(self, vocab_size: int, max_context_len: int) -> str | None:
        """Both sides run this: the frontend answers 400, a rank an error output,
        so a bad request never reaches (or kills) a rank's schedule."""
        error = verify_input_ids(self.input_ids, vocab_size) or self.sampling_params.verify()
        if error is None and len(self.input_ids) + self.sampling_params.max_new_tokens > max_context_len:
            error = (
                f"prompt ({len(self.input_ids)} tokens) + max_new_tokens ({self.sampling_params.max_new_tokens}) "
                f"exceeds the maximum context length {max_context_len} (the KV pool can never hold it)"
            )
        return error


@dataclass
class FlushCacheReqInput:
    id: str


@dataclass
class AbortReq:
    """Drop a request on every rank in one tick: rank 0's waiting-timeout decision (408), or the
    frontend's when its client went away (499, as SGLang aborts on disconnect); broadcast with
    the tick's requests."""

    rid: str
    message: str
    status: int = 408


@dataclass
class ShutdownReq:
    """The frontend is gone (rank 0's connection closed): every rank stops."""


# -- rank 0 -> frontend -----------------------------------------------------------------
@dataclass
class ReadyOutput:
    world_size: int
    vocab_size: int
    max_context_len: int


@dataclass
class GenerateReqOutput:
    rid: str
    output_ids: list[int]
    meta_info: dict  # prompt_tokens, completion_tokens, cached_tokens, cached_tokens_details


@dataclass
class ErrorOutput:
    rid: str | None
    status: int
    message: str


@dataclass
class FlushCacheReqOutput:
    id: str
    ok: bool
    message: str


@dataclass
class MetricsOutput:
    counters: dict  # cumulative totals, keyed as the frontend's KNOWN_COUNTERS
