"""SGLang's and OpenAI's conventions on a real `hctool launch --tp-size 2`: port 30000 by
default, /get_model_info, /v1/models, /v1/completions in the OpenAI client's request and
response shape (plain requests, and the `openai` package where it is installed), OpenAI's
error object. One server for the module, on 30000 when that port is free."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import requests

from engine import tokenizer
from tests.test_launch import REPO, Launched

TIMEOUT = 120
MAX_CONTEXT = 2048 - 16  # --max-total-tokens 2048 minus one page of 16
SGLANG_PORT = 30000
# What OpenAI's Python client sends besides the body (its SDK headers are informational).
CLIENT_HEADERS = {"Authorization": "Bearer EMPTY", "User-Agent": "OpenAI/Python 1.0", "Accept": "application/json"}


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # the default port when it is free (another job on this host may hold it: then a free one)
    default = _free(SGLANG_PORT)
    server = Launched(
        ["--tp-size", "2", "--max-total-tokens", "2048", "--page-size", "16"],
        tmp_path_factory.mktemp("openai") / "run",
        port=None if default else 0,
    )
    try:
        server.url = server.wait_ready()
        server.default_port = default
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.terminate()
            server.wait_exit()
        assert server.survivors() == []


@pytest.fixture(scope="module")
def url(server):
    return server.url


def complete(url: str, body: dict | bytes, **kw) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**CLIENT_HEADERS, "Content-Type": "application/json"}
    return requests.post(url + "/v1/completions", data=data, headers=headers, timeout=TIMEOUT, **kw)


def test_launch_serves_on_sglangs_port_by_default(server):
    if not server.default_port:
        pytest.skip(f"port {SGLANG_PORT} was taken on this host before the server started")
    assert server.url == f"http://127.0.0.1:{SGLANG_PORT}"


def test_tp_size_is_tp_and_model_info_says_so(url):
    r = requests.get(url + "/get_model_info", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["is_generation"] is True and info["model_path"] == "hctool-tiny"
    assert info["tp_size"] == 2 and info["max_context_len"] == MAX_CONTEXT
    assert (info["pp_size"], info["dp_size"]) == (1, 1)


def test_models_list(url):
    r = requests.get(url + "/v1/models", headers=CLIENT_HEADERS, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    card = body["data"][0]
    assert card["id"] == "hctool-tiny" and card["object"] == "model" and isinstance(card["created"], int)
    assert card["max_model_len"] == MAX_CONTEXT
    one = requests.get(url + "/v1/models/hctool-tiny", timeout=TIMEOUT)
    assert one.status_code == 200 and one.json()["id"] == "hctool-tiny"


def test_a_completion_in_the_openai_clients_shape(url):
    prompt = "The cache keeps"
    r = complete(url, {"model": "hctool-tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "text_completion" and body["model"] == "hctool-tiny"
    assert body["id"].startswith("cmpl-") and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None and isinstance(choice["text"], str)
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(tokenizer.encode(prompt))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 8
    else:  # the model's end-of-sequence token came first
        assert choice["finish_reason"] == "stop" and usage["completion_tokens"] <= 8
    # greedy: the same tokens /generate gives for the same prompt, decoded the same way
    gen = requests.post(
        url + "/generate",
        json={"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
        timeout=TIMEOUT,
    ).json()
    ids = gen["output_ids"][:-1] if choice["finish_reason"] == "stop" else gen["output_ids"]
    assert choice["text"] == tokenizer.decode(ids)


def test_a_token_list_prompt_is_the_same_prompt(url):
    text = "hello, tokens"
    as_text = complete(url, {"prompt": text, "max_tokens": 5, "temperature": 0, "ignore_eos": True}).json()
    as_ids = complete(url, {"prompt": tokenizer.encode(text), "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert as_ids.status_code == 200, as_ids.text
    as_ids = as_ids.json()
    assert as_ids["choices"][0]["text"] == as_text["choices"][0]["text"]
    assert as_ids["choices"][0]["finish_reason"] == "length" and as_ids["usage"]["completion_tokens"] == 5
    # a list holding one prompt, as clients send a batch of one
    one = complete(url, {"prompt": [text], "max_tokens": 5, "temperature": 0, "ignore_eos": True}).json()
    assert one["choices"][0]["text"] == as_text["choices"][0]["text"]


def test_stop_echo_and_stream(url):
    base = {"prompt": "abc", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    full = complete(url, base).json()["choices"][0]["text"]
    assert len(full) > 2
    stop = full[1:3]  # cut right after the first character
    cut = complete(url, {**base, "stop": [stop]}).json()["choices"][0]
    assert cut["text"] == full[: full.index(stop)] and cut["finish_reason"] == "stop"
    echoed = complete(url, {**base, "echo": True}).json()["choices"][0]["text"]
    assert echoed == "abc" + full
    r = complete(url, {**base, "stream": True}, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == full
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)


BAD = {
    "malformed JSON": (b'{"prompt": "x', 400, None),
    "not an object": (b"[1, 2]", 400, None),
    "no prompt": ({"max_tokens": 3}, 400, "prompt"),
    "prompt of another type": ({"prompt": 5}, 400, "prompt"),
    "max_tokens as a string": ({"prompt": "x", "max_tokens": "3"}, 400, "max_tokens"),
    "negative max_tokens": ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    "temperature above 2": ({"prompt": "x", "temperature": 3}, 400, "temperature"),
    "two completions": ({"prompt": "x", "n": 2}, 400, "n"),
    "logprobs": ({"prompt": "x", "logprobs": 2}, 400, "logprobs"),
    "a batch": ({"prompt": ["a", "b"]}, 400, "prompt"),
    "an id outside the vocabulary": ({"prompt": [1, 99999]}, 400, "prompt"),
    "empty prompt": ({"prompt": ""}, 400, "prompt"),
    "past the context": ({"prompt": "x", "max_tokens": MAX_CONTEXT}, 400, "max_tokens"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_requests_get_openais_error_object(url, case):
    body, status, param = BAD[case]
    r = complete(url, body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["object"] == "error" and err["code"] == status and err["type"] == "BadRequestError"
    assert isinstance(err["message"], str) and err["message"] and err["param"] == param


def test_unknown_paths_models_and_methods_are_openai_errors(url):
    for method, path, status, kind in (
        ("get", "/v1/models/gpt-4", 404, "NotFoundError"),
        ("post", "/v1/no-such-endpoint", 404, "NotFoundError"),
        ("get", "/v1/completions", 405, "MethodNotAllowedError"),
    ):
        r = requests.request(method, url + path, timeout=TIMEOUT)
        assert r.status_code == status, (path, r.text)
        assert r.json()["object"] == "error" and r.json()["type"] == kind and r.json()["code"] == status


def test_an_oversized_body_is_a_413_error_object(url):
    r = complete(url, b'{"prompt": "' + b"x" * (8 << 20) + b'"}')
    assert r.status_code == 413 and r.json()["type"] == "RequestEntityTooLargeError", r.text[:300]


def test_the_openai_package_against_launch(url):
    openai = pytest.importorskip("openai")  # not a dependency: checked where it is installed
    client = openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=TIMEOUT)
    assert [m.id for m in client.models.list()] == ["hctool-tiny"]
    done = client.completions.create(model="hctool-tiny", prompt="Hello", max_tokens=4, temperature=0)
    assert done.object == "text_completion" and done.choices[0].finish_reason in ("length", "stop")
    assert done.usage.prompt_tokens == 5
    streamed = client.completions.create(model="hctool-tiny", prompt="Hello", max_tokens=4, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == done.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="hctool-tiny", prompt="x", max_tokens=MAX_CONTEXT)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_the_default_port_taken_is_one_error_line(tmp_path):
    # hold 30000 if nobody does (the module's server may: then it is taken all the same)
    holder = socket.socket()
    try:
        try:
            holder.bind(("127.0.0.1", SGLANG_PORT))
            holder.listen()
        except OSError:
            pass
        res = subprocess.run(
            [sys.executable, "-m", "hctool", "launch", "--cpu", "--run-dir", str(tmp_path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        holder.close()
    assert res.returncode == 2 and res.stdout == "", res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == f"Error: port {SGLANG_PORT} on 127.0.0.1 is in use or not a local address", lines
    assert [x for x in lines if x.startswith("Error:")] == lines[:1] and "--port" in res.stderr
    assert "Traceback" not in res.stderr
