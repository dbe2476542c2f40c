"""Pipeline stages and data-parallel replicas through `hctool launch`: real rank processes
over gloo, real HTTP, 32 concurrent clients.

Every greedy answer must equal the no-cache reference (a TP=1 `--disable-radix-cache`
engine: stages and replicas compute the same function as one rank does). The servers run
HiCache (L1 + L2) with a pool small enough that prefixes are evicted and loaded back, so
each stage's and each replica's own tiers serve. Then the launch contract: a signal tears
every process down, a dead rank of a stage is named, bad combinations are one Error line
and exit 2."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading

import pytest
import requests

from engine.server_args import ServerArgs
from hctool.launch import Topology
from tests.test_launch import REPO, Launched

CLIENTS = 32
NEW_TOKENS = 8
ENGINE = ["--enable-hierarchical-cache", "--hicache-ratio", "3", "--page-size", "16", "--max-total-tokens", "2048"]


def prompts() -> list[list[int]]:
    """32 prompts: 4 shared 128-token prefixes, each with 8 distinct tails of 8..56 tokens."""
    rng = random.Random(37)
    prefixes = [[rng.randrange(1, 30000) for _ in range(128)] for _ in range(4)]
    return [prefixes[i % 4] + [rng.randrange(1, 30000) for _ in range(rng.randrange(8, 57))] for i in range(CLIENTS)]


def generate_all(url: str, ps: list[list[int]]) -> list:
    """One client thread per prompt, released together; an answer's output_ids or its error."""
    out: list = [None] * len(ps)
    start = threading.Barrier(len(ps))

    def client(i: int) -> None:
        try:
            start.wait(timeout=30)
            r = requests.post(
                url + "/generate",
                json={
                    "input_ids": ps[i],
                    "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
                },
                timeout=240,
            )
            out[i] = r.json()["output_ids"] if r.status_code == 200 else f"HTTP {r.status_code}: {r.text}"
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's assert
            out[i] = repr(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list:
    args = ServerArgs(page_size=16, max_total_tokens=8192, disable_radix_cache=True)
    with Topology(args, tmp_path_factory.mktemp("reference")) as topo:
        url = topo.start(240)
        answers = generate_all(url, prompts())
        topo.shutdown()
    assert all(isinstance(a, list) for a in answers), answers
    return answers


@pytest.fixture
def launch(tmp_path, no_leftover_processes):
    started: list[Launched] = []

    def start(*args: str) -> Launched:
        launched = Launched([*ENGINE, *args], tmp_path / f"run{len(started)}")
        started.append(launched)
        return launched

    yield start
    for launched in started:
        if launched.proc.poll() is None:
            launched.kill()


def serve_and_compare(launch, reference, shape: list[str], ranks: int) -> None:
    server = launch(*shape)
    url = server.wait_ready()
    ps = prompts()
    first = generate_all(url, ps)
    second = generate_all(url, ps)  # the shared prefixes now come from the cache's tiers
    for i, (a, b, ref) in enumerate(zip(first, second, reference)):
        assert a == ref, f"{shape}: prompt {i}, first wave: {a} != reference {ref}"
        assert b == ref, f"{shape}: prompt {i}, second wave: {b} != reference {ref}"
    metrics = requests.get(url + "/metrics", timeout=10).text
    cached = sum(
        float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("hicache_cached_tokens_total{")
    )
    assert cached > 0, "the second wave must be served from the cache"
    for rank in range(ranks):
        assert (server.run_dir / f"rank{rank}.log").exists()
    server.proc.send_signal(signal.SIGINT)
    assert server.wait_exit() == -signal.SIGINT
    assert server.survivors() == []


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", [["--dp", "2"], ["--pp", "2"]], ids=["dp2", "pp2"])
def test_two_ranks_serve_32_concurrent_clients_token_identical(launch, reference, shape):
    serve_and_compare(launch, reference, shape, 2)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "shape, ranks",
    [
        (["--tp", "2", "--pp", "2"], 4),
        (["--pp", "2", "--inject", "free-delay:rank=1,ms=20", "--inject", "d2h-sleep:rank=0,ms=5"], 2),
        (["--tp", "2", "--dp", "2", "--inject", "free-delay:rank=3,ms=20"], 4),
    ],
    ids=["tp2-pp2", "pp2-inject", "tp2-dp2-inject"],
)
def test_pp_and_dp_shapes_serve_32_concurrent_clients_token_identical(launch, reference, shape, ranks):
    serve_and_compare(launch, reference, shape, ranks)


@pytest.mark.timeout(300)
def test_a_dead_stage_is_named_and_everything_goes(launch):
    server = launch("--pp", "2")
    server.wait_ready()
    os.kill(server.rank_pid(1), signal.SIGKILL)
    assert server.wait_exit() == 1
    assert server.survivors() == []
    assert "Error: rank 1 died (killed by SIGKILL)" in "".join(server.stderr)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pp", "2", "--dp", "2"], "cannot be combined"),
        (["--pp", "3"], "more than the model's 2 layers"),
        (["--dp", "0"], "--dp"),
        (["--pd", "--pp", "2"], "do not apply with --pd"),
    ],
)
def test_bad_pp_dp_input_is_one_error_line_and_exit_2(hctool_cmd, clean_env, tmp_path, args, message):
    clean_env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [*hctool_cmd, "launch", "--cpu", "--run-dir", str(tmp_path), *args],
        cwd=REPO,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("Error: ") and message in res.stderr.splitlines()[0], res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
