"""The HTTP API of a real `hctool launch --tp 2` topology (one server for the module)."""

from __future__ import annotations

import threading
import time

import psutil
import pytest
import requests

from tests.test_launch import Launched

MAX_CONTEXT = 2048 - 16  # --max-total-tokens 2048 minus one page of 16
TIMEOUT = 120


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Launched(
        ["--tp", "2", "--max-total-tokens", "2048", "--page-size", "16"], tmp_path_factory.mktemp("http") / "run"
    )
    try:
        server.url = server.wait_ready()
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.terminate()
            server.wait_exit()
        assert server.survivors() == []


@pytest.fixture(scope="module")
def url(server):
    return server.url


def generate(url: str, **body) -> requests.Response:
    return requests.post(url + "/generate", json=body, timeout=TIMEOUT)


def test_generate_input_ids(url):
    r = generate(
        url, input_ids=[10, 20, 30, 40], sampling_params={"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["output_ids"]) == 8 and all(isinstance(i, int) for i in body["output_ids"])
    assert isinstance(body["text"], str)
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 8
    assert 0 <= meta["cached_tokens"] <= 4
    assert set(meta["cached_tokens_details"]) >= {"device", "host", "storage"}


def test_generate_text_and_rid(url):
    r = generate(
        url,
        text="hello, cache",
        rid="my-request-1",
        sampling_params={"max_new_tokens": 4, "ignore_eos": True, "top_p": 0.9},
    )  # top_p: unknown, ignored
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == len(b"hello, cache")
    assert r.json()["meta_info"]["id"] == "my-request-1"


def test_greedy_output_is_deterministic(url):
    body = {
        "input_ids": list(range(100, 164)),
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
    }
    first, second = generate(url, **body).json(), generate(url, **body).json()
    assert first["output_ids"] == second["output_ids"]


BAD_BODIES = {
    "malformed JSON": b'{"input_ids": [1, 2',
    "not an object": b"[1, 2, 3]",
    "no prompt": b'{"sampling_params": {}}',
    "text and input_ids": b'{"text": "a", "input_ids": [1]}',
    "empty text": b'{"text": ""}',
    "empty ids": b'{"input_ids": []}',
    "non-int id": b'{"input_ids": [1, "2"]}',
    "float id": b'{"input_ids": [1.5]}',
    "id above vocab": b'{"input_ids": [1, 40000]}',
    "negative id": b'{"input_ids": [-1]}',
    "batch": b'{"input_ids": [[1], [2]]}',
    "too long for the pool": b'{"input_ids": [1], "sampling_params": {"max_new_tokens": %d}}' % MAX_CONTEXT,
    "negative max_new_tokens": b'{"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}',
    "string max_new_tokens": b'{"input_ids": [1], "sampling_params": {"max_new_tokens": "8"}}',
    "negative temperature": b'{"input_ids": [1], "sampling_params": {"temperature": -0.5}}',
    "sampling_params not an object": b'{"input_ids": [1], "sampling_params": 3}',
    "bad rid": b'{"input_ids": [1], "rid": 7}',
    "boolean ignore_eos as 1": b'{"input_ids": [1], "sampling_params": {"ignore_eos": 1}}',
    "text bootstrap_port": b'{"input_ids": [1], "bootstrap_port": "8998"}',
}


def test_a_type_error_names_the_field(url):
    """GenerateReqInput (pydantic, strict) says which field is wrong, as SGLang's server does."""
    body = b'{"input_ids": [1], "sampling_params": {"max_new_tokens": "8"}}'
    r = requests.post(url + "/generate", data=body, timeout=TIMEOUT)
    assert r.status_code == 400 and "sampling_params.max_new_tokens" in r.json()["error"], r.text


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_input_is_400_and_server_keeps_serving(url, body):
    r = requests.post(url + "/generate", data=body, timeout=TIMEOUT)
    assert r.status_code == 400
    assert r.json()["error"]
    assert (
        generate(url, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2, "ignore_eos": True}).status_code == 200
    )


def test_longest_servable_prompt_is_accepted(url):
    r = generate(url, input_ids=[7] * (MAX_CONTEXT - 1), sampling_params={"max_new_tokens": 1, "ignore_eos": True})
    assert r.status_code == 200, r.text


def test_duplicate_in_flight_rid_is_400(server):
    """Both ranks are stopped (SIGSTOP) while the two requests arrive, so neither can
    finish: whichever the frontend registered second is the duplicate, and it is
    answered 400 at once; the other is served once the ranks continue."""
    ranks = [psutil.Process(server.rank_pid(r)) for r in (0, 1)]
    answers: dict[str, requests.Response] = {}
    bodies = {
        "first": {"input_ids": [3] * 8, "rid": "dup", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
        "second": {"input_ids": [4], "rid": "dup", "sampling_params": {"max_new_tokens": 1}},
    }
    workers = {
        k: threading.Thread(target=lambda k=k: answers.__setitem__(k, generate(server.url, **bodies[k])))
        for k in bodies
    }
    for p in ranks:
        p.suspend()
    try:
        workers["first"].start()
        time.sleep(0.3)
        workers["second"].start()
        deadline = time.monotonic() + TIMEOUT
        while not answers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(answers) == 1, "neither request was refused while the ranks were stopped"
        ((refused, answer),) = answers.items()
    finally:
        for p in ranks:
            p.resume()
    for w in workers.values():
        w.join(timeout=TIMEOUT)
    served = answers["second" if refused == "first" else "first"]
    assert served.status_code == 200, served.text
    assert answer.status_code == 400 and "already in flight" in answer.json()["error"]


def test_health(url):
    assert requests.get(url + "/health", timeout=TIMEOUT).status_code == 200


def test_metrics_lists_every_counter(url):
    generate(url, input_ids=[9] * 40, sampling_params={"max_new_tokens": 2, "ignore_eos": True})
    r = requests.get(url + "/metrics", timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in (
        "hicache_load_back_tokens_total",
        "hicache_backup_tokens_total",
        "hicache_prefetched_tokens_total",
        "hicache_evicted_tokens_total",
    ):
        assert f"\n{name} " in r.text
    for source in ("device", "host", "storage"):
        assert f'hicache_cached_tokens_total{{cache_source="{source}"}}' in r.text


def test_flush_cache(url):
    r = requests.post(url + "/flush_cache", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert generate(url, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2}).status_code == 200
