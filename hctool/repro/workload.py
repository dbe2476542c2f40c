"""The workload: deterministic prompts from a seed, sent by real HTTP clients,
round after round, with progress tracked for stall detection."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from hctool.repro.scenario import Workload

TOKEN_LOW = 1  # id 0 is the model's EOS


def build_prompts(w: Workload, vocab_size: int) -> tuple[list[list[list[int]]], list[list[int]]]:
    """(rounds of prompts, cold prefixes the setup run writes to storage)."""
    rng = random.Random(w.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(TOKEN_LOW, vocab_size) for _ in range(n)]

    hot = [tokens(w.prefix_tokens) for _ in range(max(1, w.hot_prefixes))]
    cold = [tokens(w.prefix_tokens) for _ in range(w.cold_prefixes)]
    rounds, next_cold = [], 0
    for _ in range(w.rounds):
        prompts = []
        for i in range(w.requests_per_round):
            if cold and w.cold_every and i % w.cold_every == w.cold_every - 1:
                prefix, next_cold = cold[next_cold % len(cold)], next_cold + 1
            else:
                prefix = hot[i % len(hot)]
            prompts.append(prefix + tokens(w.suffix_tokens))
        rounds.append(prompts)
    return rounds, cold


class WorkloadDriver:
    """Sends each round's requests concurrently, one round after another, in a
    background thread. `last_progress` moves whenever a request is answered."""

    def __init__(
        self,
        base_url: str,
        rounds: list[list[list[int]]],
        max_new_tokens: int,
        request_timeout: float,
        on_round_end=None,
    ):
        self.base_url, self.rounds = base_url, rounds
        self.on_round_end = on_round_end  # called with the round index once all its answers are in
        self.max_new_tokens, self.request_timeout = max_new_tokens, request_timeout
        self.sent = self.succeeded = self.failed = 0
        self.aborted = 0  # of the failed: 408, dropped by the server's own waiting timeout
        self.outputs: dict[tuple[int, int], list[int]] = {}
        self.meta: dict[tuple[int, int], dict] = {}  # meta_info of each answer (cached tokens)
        self.errors: list[str] = []
        self.last_progress = time.monotonic()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._session = requests.Session()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def start(self) -> WorkloadDriver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _one(self, key: tuple[int, int], prompt: list[int]) -> None:
        body = {
            "input_ids": prompt,
            "rid": f"r{key[0]}-{key[1]}-{time.monotonic_ns()}",
            "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0, "ignore_eos": True},
        }
        status = None
        try:
            resp = requests.post(f"{self.base_url}/generate", json=body, timeout=self.request_timeout)
            status = resp.status_code
            ok = status == 200
            detail = resp.json() if ok else resp.text[:200]
        except (requests.RequestException, ValueError) as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.last_progress = time.monotonic()
            if ok:
                self.succeeded += 1
                self.outputs[key] = detail["output_ids"]
                self.meta[key] = detail.get("meta_info") or {}
            else:
                self.failed += 1
                self.aborted += status == 408
                self.errors.append(f"request {key}: {detail}")

    def _run(self) -> None:
        try:
            with ThreadPoolExecutor(max_workers=max(len(r) for r in self.rounds)) as pool:
                for r, prompts in enumerate(self.rounds):
                    if self._stop.is_set():
                        return
                    with self._lock:
                        self.sent += len(prompts)
                    list(pool.map(lambda ip: self._one((r, ip[0]), ip[1]), enumerate(prompts)))  # noqa: B023  (map consumes it inside this iteration)
                    if self.on_round_end is not None:
                        self.on_round_end(r)
        finally:
            self.done.set()

    def counts(self) -> dict:
        return {"sent": self.sent, "succeeded": self.succeeded, "failed": self.failed, "aborted": self.aborted}


def run_to_completion(base_url: str, rounds, max_new_tokens: int, timeout: float) -> dict[tuple[int, int], list[int]]:
    """Drive every round and return the outputs; raises if anything is not answered."""
    driver = WorkloadDriver(base_url, rounds, max_new_tokens, timeout).start()
    if not driver.done.wait(timeout):
        driver.stop()
        raise TimeoutError(f"workload not answered within {timeout:.0f} s")
    if driver.failed:
        raise RuntimeError(f"{driver.failed} requests failed: {driver.errors[0]}")
    return driver.outputs
