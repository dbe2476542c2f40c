"""SGLang: srt/entrypoints/openai/protocol.py and serving_completions.py (the completions part).

The OpenAI-compatible subset the frontend serves: `/v1/models` and `/v1/completions`, their
request and response shapes, and the OpenAI error body. Pure functions over pydantic models;
http_server.py owns the routes and the link to rank 0 (importing it here would load a second
copy of the module the frontend runs as __main__).

What a completion request may ask: `prompt` as a string or a token list (or a list holding one of
them, as clients batch a single prompt), `max_tokens` (16 if absent, OpenAI's and SGLang's
default), `temperature` (0 to 2, OpenAI's range; 0 is greedy), `stop` (strings the text is cut at),
`echo`, `ignore_eos` (SGLang's extension), `stream`. Sampling knobs this engine does not have
(top_p, top_k, seed, penalties, user) are accepted and ignored, as /generate ignores unknown
sampling keys; what would change the answer's shape (n or best_of above 1, logprobs, suffix, a
batch of prompts) is a 400, never silently dropped.
"""

from __future__ import annotations

import time
import uuid
from http import HTTPStatus

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import tokenizer
from engine.managers.io_struct import SamplingParams, TokenizedGenerateReqInput, verify_input_ids

MODEL_ID = "hctool-tiny"  # the seeded tiny transformer: there is one model, whatever its seed
OWNER = "hctool"
DEFAULT_MAX_TOKENS = 16  # OpenAI's and SGLang's CompletionRequest default
MAX_TEMPERATURE = 2.0  # OpenAI's bound


class OpenAIError(Exception):
    """A request the OpenAI endpoints refuse: answered with `status` and error_body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


class CompletionRequest(BaseModel):
    # strict: "16" is not 16 and true is not 1 (as /generate's GenerateReqInput); unknown fields
    # are ignored, as SGLang and OpenAI's own server ignore them
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0, le=MAX_TEMPERATURE)
    stop: str | list[str] | None = None
    echo: bool = False
    stream: bool = False
    ignore_eos: bool = False
    n: int | None = None
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None
    rid: str | None = None  # SGLang's: the request id, else one is made


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """OpenAI's error object, flat as SGLang's ErrorResponse writes it."""
    return {"object": "error", "message": message, "type": error_type(status), "param": param, "code": status}


def error_type(status: int) -> str:
    """BadRequestError, NotFoundError ...: the exception names OpenAI's clients raise per status."""
    try:
        phrase = HTTPStatus(status).phrase.title().replace(" ", "").replace("-", "")
    except ValueError:
        return "APIError"  # 499, a client gone: no standard phrase
    return phrase if phrase.endswith("Error") else phrase + "Error"


def model_card(created: int, max_model_len: int) -> dict:
    return {
        "id": MODEL_ID,
        "object": "model",
        "created": created,
        "owned_by": OWNER,
        "root": MODEL_ID,
        "max_model_len": max_model_len,
    }


def parse_completion(obj, vocab_size: int, max_context_len: int) -> tuple[CompletionRequest, TokenizedGenerateReqInput]:
    """A parsed JSON body as (the request, the generate message for rank 0), or OpenAIError."""
    if not isinstance(obj, dict):
        raise OpenAIError("the body must be a JSON object")
    try:
        req = CompletionRequest.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = str(first["loc"][0]) if first["loc"] else "body"
        if where == "prompt" and first["type"] != "missing":  # pydantic names each arm of the union
            raise OpenAIError("prompt must be a string or a list of token ids (integers)", param="prompt") from None
        raise OpenAIError(f"{where}: {first['msg']}", param=where) from None
    for name, value, allowed in (("n", req.n, 1), ("best_of", req.best_of, 1)):
        if value is not None and value != allowed:
            raise OpenAIError(f"{name} must be 1: one completion per request is served", param=name)
    if req.logprobs:
        raise OpenAIError("logprobs are not supported", param="logprobs")
    if req.suffix:
        raise OpenAIError("suffix is not supported", param="suffix")
    input_ids = _prompt_ids(req.prompt)
    error = verify_input_ids(input_ids, vocab_size)
    if error:
        raise OpenAIError(error, param="prompt")
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    if len(input_ids) + max_tokens > max_context_len:
        raise OpenAIError(
            f"this model's maximum context length is {max_context_len} tokens; you requested "
            f"{len(input_ids) + max_tokens} ({len(input_ids)} in the prompt, {max_tokens} for the completion)",
            param="max_tokens",
        )
    temperature = 1.0 if req.temperature is None else req.temperature  # OpenAI's default
    rid = req.rid or f"cmpl-{uuid.uuid4().hex}"
    msg = TokenizedGenerateReqInput(rid, input_ids, SamplingParams(max_tokens, temperature, req.ignore_eos))
    error = msg.verify(vocab_size, max_context_len)  # every rank repeats it: the same answer here first
    if error:
        raise OpenAIError(error)
    return req, msg


def _prompt_ids(prompt) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise OpenAIError(
                f"a batch of {len(prompt)} prompts is not supported: send one per request", param="prompt"
            )
        prompt = prompt[0]
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    if not ids:
        raise OpenAIError("the prompt is empty", param="prompt")
    return ids


def completion(req: CompletionRequest, msg: TokenizedGenerateReqInput, output_ids: list[int], meta: dict, eos: int):
    """The text_completion object of a finished request. finish_reason: "stop" where the model
    ended with its end-of-sequence token (not shown, as SGLang skips special tokens) or a stop
    string cut the text, "length" where max_tokens ran out."""
    ids = list(output_ids)
    finish = "length"
    if ids and ids[-1] == eos and not req.ignore_eos:
        ids.pop()
        finish = "stop"
    text = tokenizer.decode(ids)
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    cuts = [text.find(s) for s in stops if s and s in text]
    if cuts:
        text, finish = text[: min(cuts)], "stop"
    if req.echo:
        text = tokenizer.decode(msg.input_ids) + text
    prompt_tokens, completion_tokens = meta.get("prompt_tokens", 0), meta.get("completion_tokens", len(output_ids))
    return {
        "id": msg.rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model or MODEL_ID,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens", 0)},
        },
    }


def stream_chunks(body: dict):
    """A finished completion as server-sent events, the shape of OpenAI's stream: one chunk with
    the text, one with the finish reason and usage, then [DONE]. The engine answers a request
    whole, so a stream delivers everything at once; clients that only know stream=True work."""
    import json

    choice = body["choices"][0]
    head = {k: body[k] for k in ("id", "object", "created", "model")}
    text = {**head, "choices": [{"index": 0, "text": choice["text"], "logprobs": None, "finish_reason": None}]}
    end = {**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}]}
    end["usage"] = body["usage"]
    for chunk in (text, end):
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
