"""SGLang: srt/disaggregation/mini_lb.py.

The PD router: one HTTP endpoint in front of prefill and decode servers. For
each /generate it picks a prefill/decode pair (round robin), gives the request
a bootstrap room and the prefill's bootstrap address, and sends it to both at
once: the prefill computes the prompt and pushes KV, the decode waits for it
and generates. The answer is the decode's, with `meta_info.disaggregation`
saying which server did what (the prefill's own meta_info included).

Run as `python -m engine.disaggregation.mini_lb --port N --prefill URL HOST:PORT --decode URL`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import secrets
import sys
import uuid

import requests
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

FORWARD_TIMEOUT_S = 600.0


def _post(url: str, body: dict) -> tuple[int, dict]:
    try:
        r = requests.post(url, json=body, timeout=FORWARD_TIMEOUT_S)
    except requests.RequestException as exc:
        return 503, {"error": f"{url} unreachable: {type(exc).__name__}"}
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, {"error": r.text.strip() or f"HTTP {r.status_code}"}


def _healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def build_app(prefills: list[tuple[str, str, int]], decodes: list[str]) -> FastAPI:
    app = FastAPI(title="hctool PD router", docs_url=None, redoc_url=None, openapi_url=None)
    next_prefill, next_decode = itertools.cycle(prefills), itertools.cycle(decodes)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.get("/health")
    async def health() -> Response:
        urls = [p[0] for p in prefills] + decodes
        ok = await asyncio.gather(*(asyncio.to_thread(_healthy, u) for u in urls))
        if all(ok):
            return Response(status_code=200)
        return error(503, "not serving: " + ", ".join(u for u, good in zip(urls, ok) if not good))

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error(400, f"malformed JSON: {exc}")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        if any(k in body for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")):
            return error(400, "bootstrap_* fields are set by the router")
        (purl, bhost, bport), durl = next(next_prefill), next(next_decode)
        body = {
            **body,
            "rid": body.get("rid") or uuid.uuid4().hex,
            "bootstrap_host": bhost,
            "bootstrap_port": bport,
            "bootstrap_room": secrets.randbits(62),
        }
        decode_task = asyncio.create_task(asyncio.to_thread(_post, durl + "/generate", body))
        pstatus, pbody = await asyncio.to_thread(_post, purl + "/generate", body)
        if pstatus != 200:  # the decode side fails the room on its own (transfer timeout)
            return error(pstatus, f"prefill {purl}: {pbody.get('error', pbody)}")
        dstatus, dbody = await decode_task
        if dstatus != 200:
            return error(dstatus, f"decode {durl}: {dbody.get('error', dbody)}")
        dbody["meta_info"]["disaggregation"] = {
            "prefill": {"url": purl, **pbody.get("meta_info", {})},
            "decode": {"url": durl},
        }
        return JSONResponse(dbody)

    @app.get("/metrics")
    async def metrics() -> Response:
        """The first decode server's counters (decode owns generation and local restores)."""
        try:
            r = await asyncio.to_thread(requests.get, decodes[0] + "/metrics", timeout=5)
        except requests.RequestException as exc:
            return error(503, f"decode unreachable: {type(exc).__name__}")
        return PlainTextResponse(r.text, media_type=r.headers.get("content-type"))

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        urls = [p[0] for p in prefills] + decodes
        results = await asyncio.gather(*(asyncio.to_thread(_post, u + "/flush_cache", {}) for u in urls))
        bad = [f"{u}: {b.get('error', b)}" for u, (st, b) in zip(urls, results) if st != 200]
        return error(400, "; ".join(bad)) if bad else PlainTextResponse("Cache flushed.\n")

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mini_lb")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--prefill",
        nargs=2,
        action="append",
        required=True,
        metavar=("URL", "BOOTSTRAP"),
        help="a prefill server's URL and its bootstrap HOST:PORT (repeatable)",
    )
    parser.add_argument("--decode", action="append", required=True, help="a decode server's URL (repeatable)")
    args = parser.parse_args(argv)
    prefills = []
    for url, boot in args.prefill:
        host, _, port = boot.rpartition(":")
        prefills.append((url.rstrip("/"), host, int(port)))
    print(f"router: prefill {[p[0] for p in prefills]} decode {args.decode}", file=sys.stderr, flush=True)
    config = uvicorn.Config(
        build_app(prefills, [d.rstrip("/") for d in args.decode]),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
