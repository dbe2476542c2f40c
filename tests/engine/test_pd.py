"""PD serving (`hctool launch --pd`): router + prefill server + decode server, real
processes, real gloo groups on each side, KV over real TCP sockets.

Greedy answers through the router must equal a TP1 `--disable-radix-cache` server's
token for token (p=1,d=2 re-shards heads 4 -> 2+2; p=2,d=2 sends rank to rank);
every exit path (SIGINT, SIGTERM, a part's death) leaves no process behind.
"""

from __future__ import annotations

import os
import random
import signal
import threading

import psutil
import pytest
import requests

from engine.server_args import ServerArgs
from hctool.launch import Topology
from tests.test_launch import launch  # noqa: F401 - the fixture (real `hctool launch` subprocesses)

NEW_TOKENS = 6


def pd_prompts() -> list[list[int]]:
    """Shared prefixes and lengths around page boundaries (page 16)."""
    rng = random.Random(13)
    prefix = [rng.randrange(1, 30000) for _ in range(40)]
    return [
        prefix[:n] + [rng.randrange(1, 30000) for _ in range(k)]
        for n, k in ((40, 8), (40, 24), (16, 1), (0, 33), (32, 0), (40, 56))
    ]


def generate(url: str, ids: list[int]) -> dict:
    r = requests.post(
        url + "/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def generate_all(url: str, prompts: list[list[int]]) -> list[dict]:
    """Concurrently, so the decode's prealloc / transfer queues hold several rooms."""
    out: list = [None] * len(prompts)

    def one(i):
        try:
            out[i] = generate(url, prompts[i])
        except BaseException as exc:  # noqa: BLE001 - asserted below
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    for o in out:
        assert isinstance(o, dict), o
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[list[int]]:
    args = ServerArgs(tp_size=1, disable_radix_cache=True, max_total_tokens=2048)
    with Topology(args, tmp_path_factory.mktemp("tp1-reference")) as topo:
        url = topo.start(timeout=240)
        return [a["output_ids"] for a in generate_all(url, pd_prompts())]


def pid_of(launched, role: str, rank: int) -> int:
    launched.collect_pids()
    for pid in launched.pids:
        try:
            env = psutil.Process(pid).environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if env.get("HCTOOL_ROLE") == role and env.get("RANK") == str(rank):
            return pid
    raise AssertionError(f"no {role} rank {rank} among {launched.pids}")


def check_answers(answers: list[dict], reference: list[list[int]], decode_tp: int) -> None:
    for i, (a, ref) in enumerate(zip(answers, reference)):
        assert a["output_ids"] == ref, f"prompt {i}: PD {a['output_ids']} != TP1 {ref}"
        pd = a["meta_info"]["disaggregation"]
        assert pd["prefill"]["completion_tokens"] == 1, "prefill computes the first token only"
        assert a["meta_info"]["completion_tokens"] == NEW_TOKENS
        assert pd["prefill"]["url"] != pd["decode"]["url"]


def test_pd_p1_d2_matches_tp1_then_sigint_leaves_nothing(launch, reference):  # noqa: F811
    server = launch("--pd", "--prefill-tp", "1", "--decode-tp", "2")
    url = server.wait_ready()
    check_answers(generate_all(url, pd_prompts()), reference, 2)
    for name in ("router.log", "prefill-rank0.log", "decode-rank0.log", "decode-rank1.log"):
        assert (server.run_dir / name).exists(), name
    assert len(server.pids) >= 6, "router, two frontends, three ranks"
    server.proc.send_signal(signal.SIGINT)
    assert server.wait_exit() == -signal.SIGINT
    assert server.survivors() == []
    assert server.stdout == [f"ready: {url}\n"]


@pytest.mark.slow
def test_pd_p2_d2_matches_tp1_then_sigterm_leaves_nothing(launch, reference):  # noqa: F811
    server = launch("--pd", "--prefill-tp", "2", "--decode-tp", "2")
    url = server.wait_ready()
    check_answers(generate_all(url, pd_prompts()), reference, 2)
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == -signal.SIGTERM
    assert server.survivors() == []


@pytest.mark.slow
def test_pd_p2_d1_matches_tp1(launch, reference):  # noqa: F811
    server = launch("--pd", "--prefill-tp", "2", "--decode-tp", "1")
    url = server.wait_ready()
    check_answers(generate_all(url, pd_prompts()), reference, 1)
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == -signal.SIGTERM
    assert server.survivors() == []


def test_pd_killed_decode_rank_is_named_and_everything_goes(launch):  # noqa: F811
    server = launch("--pd", "--prefill-tp", "1", "--decode-tp", "1")
    server.wait_ready()
    os.kill(pid_of(server, "decode", 0), signal.SIGKILL)
    assert server.wait_exit() == 1
    assert server.survivors() == []
    stderr = "".join(server.stderr)
    assert "Error: decode rank 0 died (killed by SIGKILL)" in stderr
    assert str(server.run_dir / "decode-rank0.log") in stderr


@pytest.mark.slow
def test_pd_dropped_kv_fails_on_every_decode_rank_then_a_dead_part_is_named(launch):  # noqa: F811
    """A prefill rank whose KV never arrives: the decode ranks agree (MIN poll) to fail
    the room together, answer 502 and keep serving; then killing decode rank 1 stops
    everything and names it."""
    server = launch(
        "--pd",
        "--prefill-tp",
        "1",
        "--decode-tp",
        "2",
        "--inject",
        "kv-drop:role=prefill,rank=0",
        "--disaggregation-transfer-timeout",
        "2",
    )
    url = server.wait_ready()
    r = requests.post(
        url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}, timeout=60
    )
    assert r.status_code == 502 and "KV transfer" in r.json()["error"], r.text
    assert requests.get(url + "/health", timeout=10).status_code == 200, "a failed transfer killed a part"
    os.kill(pid_of(server, "decode", 1), signal.SIGKILL)
    assert server.wait_exit() == 1
    assert server.survivors() == []
    assert "Error: decode rank 1 died (killed by SIGKILL)" in "".join(server.stderr)


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--pd", "--tp", "2"], "--tp does not apply with --pd", marks=pytest.mark.slow),
        pytest.param(["--prefill-tp", "2"], "need --pd", marks=pytest.mark.slow),
        pytest.param(["--pd", "--decode-tp", "3"], "must divide", marks=pytest.mark.slow),
        pytest.param(
            ["--pd", "--inject", "kv-drop:role=router"], "role must be prefill or decode", marks=pytest.mark.slow
        ),
    ],
)
def test_pd_usage_errors_exit_2_with_one_line(hctool_cmd, clean_env, tmp_path, args, message):
    import subprocess

    from tests.test_launch import REPO

    clean_env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [*hctool_cmd, "launch", "--cpu", "--port", "0", "--run-dir", str(tmp_path), *args],
        cwd=REPO,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("Error: ") and message in res.stderr.splitlines()[0], res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


@pytest.mark.slow
def test_pd_per_role_launch_serves_tp1_tokens(launch, reference):  # noqa: F811
    """The form for several hosts: each part started by its own `hctool launch --pd-role`."""
    from hctool.supervise.procs import free_port

    boot = free_port()
    prefill = launch("--pd-role", "prefill", "--disaggregation-bootstrap-port", str(boot))
    decode = launch("--pd-role", "decode", "--disaggregation-kv-host", "127.0.0.1")
    purl, durl = prefill.wait_ready(), decode.wait_ready()
    assert f"bootstrap: 127.0.0.1:{boot}" in "".join(prefill.stderr)
    router = launch(
        "--pd-role", "router", "--prefill-url", purl, "--bootstrap", f"127.0.0.1:{boot}", "--decode-url", durl
    )
    url = router.wait_ready()
    check_answers(generate_all(url, pd_prompts()), reference, 1)
    for part in (router, decode, prefill):
        part.proc.send_signal(signal.SIGTERM)
        assert part.wait_exit() == -signal.SIGTERM
        assert part.survivors() == []
