"""SGLang: srt/entrypoints/http_server.py.

HTTP frontend: an SGLang-compatible subset of the API in front of rank 0.

Run as `python -m engine.entrypoints.http_server` by `hctool launch`. It listens for rank 0 on
HCENGINE_IPC_PORT (multiprocessing.connection, authkey HCENGINE_IPC_AUTHKEY) and
serves HTTP on HCENGINE_HTTP_HOST:HCENGINE_HTTP_PORT (engine/lab/contract.py). Every request is validated
here, so nothing a client sends reaches the ranks unless it is servable.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
import uuid
from multiprocessing.connection import Connection

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import tokenizer
from engine.entrypoints import openai_protocol as oai
from engine.entrypoints.ipc_auth import accept_peer
from engine.entrypoints.request_guard import BodyError, body_limit, parse_json, read_body
from engine.lab import contract
from engine.managers.io_struct import (
    AbortReq,
    ErrorOutput,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GenerateReqOutput,
    MetricsOutput,
    ReadyOutput,
    SamplingParams,
    TokenizedGenerateReqInput,
)
from engine.server_args import ServerArgs

# Counters rank 0 reports (cumulative totals): name -> (HELP, label name or None, label values).
KNOWN_COUNTERS = {
    "hicache_load_back_tokens_total": ("Tokens loaded back from the host tier (L2) to the device tier (L1).", None, ()),
    "hicache_cached_tokens_total": (
        "Prompt tokens served from a cache, by the tier that served them.",
        "cache_source",
        ("device", "host", "storage"),
    ),
    "hicache_backup_tokens_total": ("Tokens copied from the device tier to the host tier (backup).", None, ()),
    "hicache_prefetched_tokens_total": ("Tokens prefetched from storage (L3) into the host tier.", None, ()),
    "hicache_evicted_tokens_total": ("Tokens evicted from the device tier.", None, ()),
    "prompt_tokens_total": ("Prompt tokens of finished requests.", None, ()),
    "generation_tokens_total": ("Tokens generated.", None, ()),
    "requests_total": ("Requests finished.", None, ()),
    "hicache_storage_corrupt_pages_total": (
        "L3 pages found damaged or written by another model/layout (each a miss, recomputed); the most any rank found.",
        None,
        (),
    ),
}
KNOWN_GAUGES = {
    "hicache_storage_writes_enabled": "1 while pages are written to L3 storage; 0 without storage "
    "or after storage writes failed (reads go on)."
}


class MetricsSnapshot:
    """The latest cumulative counters from rank 0, rendered as Prometheus text.

    Rank 0 owns the totals, so this is a collector over its last report rather
    than prometheus_client Counters that would need increments."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.counters: dict = {
            name: ({v: 0 for v in values} if label else 0) for name, (_, label, values) in KNOWN_COUNTERS.items()
        }
        self.counters.update(dict.fromkeys(KNOWN_GAUGES, 0))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def update(self, counters: dict) -> None:
        merged = dict(self.counters)
        for name, value in counters.items():
            if isinstance(value, dict) and isinstance(merged.get(name), dict):
                value = {**merged[name], **value}
            merged[name] = value
        self.counters = merged  # one reference swap: scrapes never see a half update

    def collect(self):
        for name, value in self.counters.items():
            help_text, label, _ = KNOWN_COUNTERS.get(name, (f"{name} as reported by rank 0.", None, ()))
            if isinstance(value, dict):
                family = CounterMetricFamily(name, help_text, labels=[label or "label"])
                for label_value, v in sorted(value.items()):
                    family.add_metric([str(label_value)], v)
            elif name in KNOWN_GAUGES:
                family = GaugeMetricFamily(name, KNOWN_GAUGES[name], value=value)
            else:
                family = CounterMetricFamily(name, help_text, value=value)
            yield family

    def render(self) -> bytes:
        return generate_latest(self.registry)


class BadRequest(Exception):
    """A client mistake: answered with 400 and never forwarded to the ranks."""


class RankLink:
    """The one connection to rank 0: a reader thread resolves per-request futures."""

    def __init__(self, server: socket.socket, authkey: bytes, metrics: MetricsSnapshot):
        self.server, self.authkey = server, authkey
        self.metrics = metrics
        self.conn: Connection | None = None
        self.ready: ReadyOutput | None = None  # once every rank is up
        self.disconnected = False
        self.pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self.lock = threading.Lock()  # guards pending and serializes sends

    @property
    def healthy(self) -> bool:
        return self.ready is not None and not self.disconnected

    def run(self) -> None:
        """Reader thread: accept rank 0 (stray connections are dropped: ipc_auth.py), then
        dispatch its messages until it goes away."""
        self.conn, addr = accept_peer(self.server, self.authkey)
        print(f"rank 0 connected from {addr}", file=sys.stderr, flush=True)
        try:
            while True:
                self._dispatch(self.conn.recv())
        except (EOFError, OSError) as exc:
            print(f"rank 0 disconnected ({type(exc).__name__}); failing pending requests", file=sys.stderr, flush=True)
        finally:
            self.fail_all("engine rank 0 disconnected")

    def fail_all(self, message: str) -> None:
        """Answer every waiting request with a 503 now; later calls are refused."""
        with self.lock:
            self.disconnected = True
            pending, self.pending = self.pending, {}
        for key in list(pending):  # _resolve pops from this dict
            self._resolve(pending, key, ErrorOutput(None, 503, message))

    def _dispatch(self, msg) -> None:
        if isinstance(msg, ReadyOutput):
            self.ready = msg
            print(f"ready: {msg}", file=sys.stderr, flush=True)
        elif isinstance(msg, MetricsOutput):
            self.metrics.update(msg.counters)
        elif isinstance(msg, (GenerateReqOutput, ErrorOutput)):
            self._resolve(self.pending, f"req:{msg.rid}", msg)
        elif isinstance(msg, FlushCacheReqOutput):
            self._resolve(self.pending, "flush:" + msg.id, msg)
        else:
            print(f"ignoring unknown message from rank 0: {type(msg).__name__}", file=sys.stderr, flush=True)

    def _resolve(self, pending: dict, key: str, msg) -> None:
        with self.lock:
            entry = pending.pop(key, None)
        if entry is None:
            return
        loop, fut = entry
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(msg))

    async def call(self, key: str, msg, request: Request | None = None):
        """Send one message and wait for the answer keyed by `key` (rid or flush id). With the
        client's `request`: when the client goes away first, abort the request on the ranks
        (SGLang's abort_request on disconnect) and raise ClientGone."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self.lock:
            if self.disconnected or self.conn is None:
                raise ConnectionError("engine rank 0 is not connected")
            if key in self.pending:
                raise BadRequest(f"a request with rid {key.split(':', 1)[1]!r} is already in flight")
            self.pending[key] = (loop, fut)
        # A slow or stuck rank 0 must not block the event loop (and /health) on a full pipe.
        try:
            await asyncio.to_thread(self._send, msg)
        except OSError as exc:
            with self.lock:
                self.pending.pop(key, None)
            raise ConnectionError(f"engine rank 0 is not reachable: {exc}") from None
        if request is None:
            return await fut
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({fut, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if fut.done():
            return fut.result()
        # Every rank drops it in the tick the abort is broadcast; the key stays reserved until
        # rank 0 answers the abort, so a new request cannot take the rid while it is still live.
        try:
            await asyncio.to_thread(self._send, AbortReq(key.split(":", 1)[1], "the client disconnected", 499))
        except OSError:
            pass  # rank 0 is gone: fail_all answers everything
        raise ClientGone()

    def _send(self, msg) -> None:
        with self.lock:
            self.conn.send(msg)


class ClientGone(Exception):
    """The client disconnected before its answer: the request was aborted on the ranks."""


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the ASGI server says so once the body is read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class GenerateSamplingParams(BaseModel):
    """/generate's sampling_params. Strict ("16" is not 16, true is not 1); unknown sampling keys
    are ignored, as SGLang ignores those it does not use; absent ones take SamplingParams' defaults."""

    model_config = ConfigDict(strict=True, extra="ignore")

    max_new_tokens: int = Field(default=SamplingParams.max_new_tokens, ge=0)
    temperature: float = Field(default=SamplingParams.temperature, ge=0, le=oai.MAX_TEMPERATURE)
    ignore_eos: bool = False


class GenerateReqInput(BaseModel):
    """SGLang's GenerateReqInput (srt/managers/io_struct.py), the part this engine serves: one
    prompt as text or token ids, its sampling parameters, a request id, and the PD bootstrap
    fields. Unknown fields are ignored, as SGLang's server does with fields it does not know."""

    model_config = ConfigDict(strict=True, extra="ignore")

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: GenerateSamplingParams | None = None
    rid: str | None = Field(default=None, min_length=1)
    stream: bool = False
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None


def parse_generate(body: bytes, vocab_size: int, max_context_len: int) -> TokenizedGenerateReqInput:
    """Validate a /generate body into the generate message for rank 0 (the token and
    sampling checks are TokenizedGenerateReqInput.verify, which every rank repeats)."""
    try:
        obj = parse_json(body)  # the guarded parser: duplicate keys, NaN, depth
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if not isinstance(obj, dict):
        raise BadRequest("the body must be a JSON object")
    # a batch is a shape the model would refuse with pydantic's words; say what it is
    if isinstance(obj.get("text"), list) or (
        isinstance(obj.get("input_ids"), list) and obj["input_ids"] and isinstance(obj["input_ids"][0], list)
    ):
        raise BadRequest("batch requests are not supported")
    try:
        req = GenerateReqInput.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise BadRequest(f"'{where}': {first['msg']}") from None
    if req.stream:
        raise BadRequest("streaming is not supported")
    if (req.text is None) == (req.input_ids is None):
        raise BadRequest("give exactly one of 'text' and 'input_ids'")
    input_ids = tokenizer.encode(req.text) if req.text is not None else list(req.input_ids or [])
    sp = req.sampling_params or GenerateSamplingParams()
    msg = TokenizedGenerateReqInput(
        req.rid or uuid.uuid4().hex,
        input_ids,
        SamplingParams(sp.max_new_tokens, sp.temperature, sp.ignore_eos),
        bootstrap_host=req.bootstrap_host,
        bootstrap_port=req.bootstrap_port,
        bootstrap_room=req.bootstrap_room,
    )
    error = msg.verify(vocab_size, max_context_len)
    if error:
        raise BadRequest(error)
    return msg


def build_app(link: RankLink, server_args: ServerArgs) -> FastAPI:
    app = FastAPI(title="hctool engine", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.get("/health")
    async def health() -> Response:
        if link.healthy:
            return Response(status_code=200)
        return error(503, "engine rank 0 disconnected" if link.disconnected else "engine is starting")

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(link.metrics.render(), media_type=link.metrics.content_type)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        if not link.healthy:
            return error(503, "engine is not ready")
        ready = link.ready
        try:
            body = await read_body(request, body_limit(ready.max_context_len))
            msg = parse_generate(body, ready.vocab_size, ready.max_context_len)
            answer = await link.call("req:" + msg.rid, msg, request)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client is gone
        except BodyError as exc:
            return error(exc.status, str(exc))
        except BadRequest as exc:
            return error(400, str(exc))
        except ConnectionError as exc:
            return error(503, str(exc))
        if isinstance(answer, ErrorOutput):
            return error(answer.status, answer.message)
        return JSONResponse(
            {
                "text": tokenizer.decode(answer.output_ids),
                "output_ids": answer.output_ids,
                "meta_info": {"id": msg.rid, **answer.meta_info},
            }
        )

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if not link.healthy:
            return error(503, "engine is not ready")
        flush_id = uuid.uuid4().hex
        try:
            answer = await link.call("flush:" + flush_id, FlushCacheReqInput(flush_id))
        except ConnectionError as exc:
            return error(503, str(exc))
        if isinstance(answer, ErrorOutput):
            return error(answer.status, answer.message)
        if not answer.ok:
            return error(400, answer.message or "cache not flushed: requests are running")
        return PlainTextResponse(answer.message or "Cache flushed.\n")

    add_sglang_info_routes(app, link, server_args)
    add_openai_routes(app, link, server_args)
    return app


def add_sglang_info_routes(app: FastAPI, link: RankLink, server_args: ServerArgs) -> None:
    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        # SGLang's keys first (model_path, tokenizer_path, is_generation), then what this engine
        # can say about its model; there is no path: the weights come from a seed
        info = {
            "model_path": oai.MODEL_ID,
            "tokenizer_path": None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "model_seed": server_args.model_seed,
            "vocab_size": server_args.model.vocab_size,
            "tp_size": server_args.tp_size,
            "pp_size": server_args.pp_size,
            "dp_size": server_args.dp_size,
        }
        if link.ready is not None:
            info["max_context_len"] = link.ready.max_context_len
        return JSONResponse(info)


def add_openai_routes(app: FastAPI, link: RankLink, server_args: ServerArgs) -> None:
    """/v1/models and /v1/completions (openai_protocol.py); their errors are OpenAI's error
    object, as are a /v1 path or method that does not exist."""
    started = int(time.time())

    def error(status: int, message: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(oai.error_body(status, message, param), status_code=status)

    def not_ready() -> JSONResponse:
        return error(503, "engine rank 0 disconnected" if link.disconnected else "engine is not ready")

    @app.get("/v1/models")
    async def models() -> Response:
        if not link.healthy:
            return not_ready()
        return JSONResponse({"object": "list", "data": [oai.model_card(started, link.ready.max_context_len)]})

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> Response:
        if not link.healthy:
            return not_ready()
        if model != oai.MODEL_ID:
            return error(404, f"the model {model!r} does not exist; this server has {oai.MODEL_ID!r}", "model")
        return JSONResponse(oai.model_card(started, link.ready.max_context_len))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        if not link.healthy:
            return not_ready()
        ready = link.ready
        try:
            body = await read_body(request, body_limit(ready.max_context_len))
            obj = parse_json(body)  # strict JSON, bounded depth, valid Unicode (request_guard.py)
            req, msg = oai.parse_completion(obj, ready.vocab_size, ready.max_context_len)
        except BodyError as exc:
            return error(exc.status, str(exc))
        except oai.OpenAIError as exc:
            return error(exc.status, str(exc), exc.param)
        except ValueError as exc:  # parse_json's refusal
            return error(400, str(exc))
        try:
            answer = await link.call("req:" + msg.rid, msg, request)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client is gone
        except BadRequest as exc:  # a rid already in flight
            return error(400, str(exc), "rid")
        except ConnectionError as exc:
            return error(503, str(exc))
        if isinstance(answer, ErrorOutput):
            return error(answer.status, answer.message)
        result = oai.completion(req, msg, answer.output_ids, answer.meta_info, server_args.model.eos_token_id)
        if req.stream:
            return StreamingResponse(oai.stream_chunks(result), media_type="text/event-stream")
        return JSONResponse(result)

    @app.exception_handler(StarletteHTTPException)
    async def openai_404(request: Request, exc: StarletteHTTPException) -> Response:
        if request.url.path.startswith("/v1/"):
            return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        return await http_exception_handler(request, exc)


def main() -> None:
    server_args = ServerArgs.from_json(os.environ[contract.ARGS_ENV])
    server = socket.create_server(("127.0.0.1", int(os.environ[contract.IPC_PORT_ENV])))
    link = RankLink(server, bytes.fromhex(os.environ[contract.IPC_AUTHKEY_ENV]), MetricsSnapshot())
    threading.Thread(target=link.run, name="rank0-reader", daemon=True).start()
    config = uvicorn.Config(
        build_app(link, server_args),
        host=os.environ.get(contract.HTTP_HOST_ENV, "127.0.0.1"),
        port=int(os.environ[contract.HTTP_PORT_ENV]),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    _Server(config, link).run()


class _Server(uvicorn.Server):
    """On SIGTERM/SIGINT (hctool tearing the topology down after a rank died) every
    waiting request gets its 503 before uvicorn's graceful shutdown starts."""

    def __init__(self, config: uvicorn.Config, link: RankLink):
        super().__init__(config)
        self.link = link

    def handle_exit(self, sig, frame) -> None:
        self.link.fail_all("engine is shutting down")
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    main()
