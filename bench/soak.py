"""Soak: agent-like sessions against the server for a while, with client disconnects, cancels and
injected faults; does every request end, does nothing leak, does memory stay flat?

Usage (from the repository root, in the project's virtual environment):

    python bench/soak.py --model smollm2-135m --minutes 30 --sessions 4 --parallel 4

The app `multiseq serve` runs (create_app over a Runner) is served by uvicorn on a free loopback
port inside this process, so that faults can be injected into the engine: one request in
--fault-every (default 100) has a fault put into its sequence, in turn a sampler row that
raises, a detokenizer that raises, a constraint whose accept() raises, and a llama_decode that
fails for its tokens. --sessions clients each hold a conversation (a shared system prompt, a
user turn, the reply appended, the next turn), in a closed loop; a request is streamed or not at
random, and a share of them is abandoned: a stream closed after its first chunk
(--disconnect-share), a non-streamed request given up after a short time (--cancel-share).

Counted: requests sent, ended well, faulted (the injected ones, each must fail), collateral
failures (any other request that failed: must be 0), disconnects and cancels, and requests the
client gave up on after CLIENT_TIMEOUT_SECONDS (a machine too busy to answer in time); the process's RSS
after the warm-up (--warmup-minutes) and at the end (flat: within 10%), with and without the RAM
tier's saved states, which grow by design until --cache-ram is full; and, once the load stops, whether
the engine is idle (no request running or waiting) and every slot holds only the prefix it keeps
(no slot or KV cell leaked). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field

import openai
import uvicorn

from multiseq import Runner, RunnerConfig
from multiseq.errors import BackendError
from multiseq.server import ServerSettings, create_app
from multiseq.server.serve import open_socket

FAULT_MARKER = "FAULT-"  # a user turn holding this (and a number) gets a fault injected
CLIENT_TIMEOUT_SECONDS = 120
TIMED_OUT = "timed out"
FAULT_KINDS = ("sampler row", "detokenizer", "constraint accept", "decode")
SYSTEM_PROMPT = ("You are a coding agent working in a repository. Use short answers. Tools: read_file(path), "
                 "write_file(path, text), run(command), search(pattern). ") * 6
QUESTIONS = ["Where is the step loop?", "Rename the class Engine to Core.", "What does fit_prompt do?",
             "List the tests of the scheduler.", "Why does a failed decode clear the slot?",
             "Write a haiku about KV caches.", "Summarize the README in one line.", "What is n_keep?"]


class InjectedFault(Exception):
    pass


def _raise(*args, **kwargs):
    raise InjectedFault("injected by bench/soak.py")


@dataclass
class Counts:
    sent: int = 0
    ok: int = 0
    faulted: int = 0  # injected, and failed as they must
    fault_not_reported: int = 0  # injected, but the request did not fail
    collateral: int = 0  # failed without a fault of their own
    disconnects: int = 0
    timeouts: int = 0  # no answer within CLIENT_TIMEOUT_SECONDS (the client gave up: a cancel)
    cancels: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, error: str | None = None) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)
            if error is not None and len(self.errors) < 20:
                self.errors.append(error)


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class FaultInjector:
    """Puts a fault into the sequence of every request whose prompt holds FAULT_MARKER<n>, the
    kind chosen by n; a decode fault makes llama_decode fail for that sequence's tokens."""

    def __init__(self, runner: Runner) -> None:
        self._engine = runner.engine
        self._new_sequence = runner.engine.maker.new_sequence
        self._decode = runner.backend.decode
        self._poisoned_slots: set[int] = set()
        self._decode_faults: set[str] = set()
        runner.engine.maker.new_sequence = self._tampered
        runner.backend.decode = self._decode_unless_poisoned

    def _tampered(self, request, request_id, **options):
        seq = self._new_sequence(request, request_id, **options)
        text = request.prompt if request.prompt is not None else str(request.messages[-1].get("content"))
        marker = re.search(FAULT_MARKER + r"(\d+)", text)
        if marker is not None:
            kind = FAULT_KINDS[int(marker.group(1)) % len(FAULT_KINDS)]
            if kind == "sampler row":
                seq.sampler.adjust = _raise
            elif kind == "detokenizer":
                seq.pieces.assembler.feed = _raise
            elif kind == "constraint accept":
                seq.sampler.accept = _raise
            else:
                self._decode_faults.add(seq.id)
        return seq

    def _decode_unless_poisoned(self, entries):
        faulty = {seq.slot for seq in self._engine.scheduler.running if seq.id in self._decode_faults}
        if faulty & {entry.slot for entry in entries}:
            raise BackendError("llama_decode failed with code -1 (injected by bench/soak.py)")
        return self._decode(entries)


@contextmanager
def served(runner: Runner, settings: ServerSettings):
    app = create_app(runner, settings)
    listener = open_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()
        app.state.server.close()


@dataclass(frozen=True)
class SoakOptions:
    sessions: int = 4
    minutes: float | None = 30.0  # how long the load runs (None: --requests_per_session decides)
    requests_per_session: int | None = None
    warmup_minutes: float = 3.0
    turns: int = 6  # turns before a session starts a new conversation
    max_tokens: int = 48
    fault_every: int = 100
    disconnect_share: float = 0.05
    cancel_share: float = 0.05
    seed: int = 0


class Session:
    """One agent-like client: a conversation it sends turn after turn; every fault_every-th
    request of the whole run carries a fault."""

    def __init__(self, index: int, base: str, options: SoakOptions, counts: Counts, request_numbers,
                 deadline: float) -> None:
        self.random = random.Random(options.seed * 1000 + index)
        self.base, self.options, self.counts, self.deadline = base, options, counts, deadline
        self.request_numbers = request_numbers
        self.messages = [{"role": "system", "content": SYSTEM_PROMPT}]

    def run(self) -> None:
        client = openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0,
                               timeout=CLIENT_TIMEOUT_SECONDS)
        for _ in itertools.repeat(None, self.options.requests_per_session or 10**9):
            if time.monotonic() >= self.deadline:
                return
            self._turn(client)

    def _turn(self, client: openai.OpenAI) -> None:
        question = self.random.choice(QUESTIONS)
        number = next(self.request_numbers)
        fault = number // self.options.fault_every if number % self.options.fault_every == 0 else None
        content = question if fault is None else f"{question} {FAULT_MARKER}{fault}"
        body = {"model": "soak", "messages": self.messages + [{"role": "user", "content": content}],
                "max_tokens": self.random.randint(16, self.options.max_tokens), "temperature": 0.7,
                "seed": self.random.randrange(2**31)}
        self.counts.add("sent")
        roll = self.random.random()
        if fault is None and roll < self.options.disconnect_share:
            stream = client.chat.completions.create(**body, stream=True)
            next(iter(stream), None)
            stream.close()  # the client goes away after its first chunk
            self.counts.add("disconnects")
            return
        if fault is None and roll < self.options.disconnect_share + self.options.cancel_share:
            try:
                client.with_options(timeout=self.random.uniform(0.05, 0.5)).chat.completions.create(**body)
            except openai.APITimeoutError:
                pass
            self.counts.add("cancels")
            return
        reply, error = self._complete(client, body, stream=self.random.random() < 0.5)
        if error == TIMED_OUT:  # no answer within the client's timeout: a slow machine, not a failure
            self.counts.add("timeouts")
        elif fault is not None:
            self.counts.add("faulted" if error else "fault_not_reported", None if error else f"fault {fault} ok")
        elif error:
            self.counts.add("collateral", error)
        else:
            self.counts.add("ok")
            self.messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
            if len(self.messages) > 2 * self.options.turns + 1:  # a new conversation, the same system prompt
                self.messages = self.messages[:1]

    @staticmethod
    def _complete(client: openai.OpenAI, body: dict, stream: bool) -> tuple[str, str | None]:
        try:
            if not stream:
                return client.chat.completions.create(**body).choices[0].message.content or "", None
            return "".join(chunk.choices[0].delta.content or "" for chunk in
                           client.chat.completions.create(**body, stream=True) if chunk.choices), None
        except openai.APITimeoutError:
            return "", TIMED_OUT
        except openai.APIError as error:
            return "", f"{type(error).__name__}: {str(error)[:200]}"


def slots_leaked(runner: Runner) -> list[str]:
    """Slots still busy, or holding KV beyond the prefix the engine keeps in them."""
    leaks = []
    scheduler, backend = runner.engine.scheduler, runner.backend
    for slot in range(runner.config.parallel):
        kept = len(scheduler.slots[slot].kept)
        positions = (backend.slot_pos_min(slot), backend.slot_pos_max(slot))
        expected_max = kept - 1 if kept else -1
        if not scheduler.slots[slot].is_free or positions[1] != expected_max:
            leaks.append(f"slot {slot}: busy={not scheduler.slots[slot].is_free}, holds {positions}, keeps {kept}")
    return leaks


def memory_mib(runner: Runner) -> tuple[float, float]:
    """The process's RSS, and the part of it that is the RAM tier's saved states (which grows
    by design until --cache-ram is full)."""
    cache = runner.latest_snapshot.host_cache
    return rss_mib(), (cache.num_bytes if cache is not None else 0) / 2**20


def soak(runner: Runner, options: SoakOptions) -> dict:
    """Run the sessions against `runner` served over HTTP; the report (see the module's docstring)."""
    counts = Counts()
    started = time.monotonic()
    FaultInjector(runner)
    with served(runner, ServerSettings(model_name="soak")) as base:
        rss_start, _ = memory_mib(runner)
        deadline = started + options.minutes * 60 if options.minutes is not None else float("inf")
        request_numbers = itertools.count(1)
        sessions = [Session(index, base, options, counts, request_numbers, deadline)
                    for index in range(options.sessions)]
        threads = [threading.Thread(target=session.run, daemon=True) for session in sessions]
        for thread in threads:
            thread.start()
        warm_by = time.monotonic() + options.warmup_minutes * 60
        while any(thread.is_alive() for thread in threads) and time.monotonic() < warm_by:
            time.sleep(0.1)
        rss_warm, cache_warm = memory_mib(runner)
        for thread in threads:
            thread.join()
        rss_end, cache_end = memory_mib(runner)
        idle_by = time.monotonic() + 30
        while (runner.latest_snapshot.num_running or runner.num_waiting) and time.monotonic() < idle_by:
            time.sleep(0.1)
        leaks = runner.between_steps(lambda: slots_leaked(runner))
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    return {"minutes": round((time.monotonic() - started) / 60, 1),
            "sessions": options.sessions, "parallel": runner.config.parallel, "requests": counts.sent,
            "ok": counts.ok, "faults_injected": counts.faulted + counts.fault_not_reported,
            "faults_failed_alone": counts.faulted, "faults_not_reported": counts.fault_not_reported,
            "collateral_failures": counts.collateral, "disconnects": counts.disconnects, "cancels": counts.cancels,
            "client_timeouts": counts.timeouts,
            "rss_mib_start": round(rss_start, 1), "rss_mib_after_warmup": round(rss_warm, 1),
            "rss_mib_end": round(rss_end, 1), "rss_growth_after_warmup": round(rss_end / rss_warm - 1, 3),
            "ram_cache_mib_after_warmup": round(cache_warm, 1), "ram_cache_mib_end": round(cache_end, 1),
            "rss_less_ram_cache_growth_after_warmup":
                round((rss_end - cache_end) / (rss_warm - cache_warm) - 1, 3),
            "metrics_after": [line for line in metrics.splitlines()
                              if line.startswith(("multiseq_requests_running ", "multiseq_requests_waiting "))],
            "leaked_slots": leaks, "engine_failure": runner.failure, "first_errors": counts.errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--slot-ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-ram", type=int, default=None, help="MiB of the RAM tier (default: the runner's)")
    parser.add_argument("--turns", type=int, default=6, help="turns before a session starts a new conversation")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--fault-every", type=int, default=100)
    parser.add_argument("--disconnect-share", type=float, default=0.05)
    parser.add_argument("--cancel-share", type=float, default=0.05)
    parser.add_argument("--warmup-minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = RunnerConfig(model=args.model, parallel=args.parallel, slot_ctx=args.slot_ctx, seed=args.seed,
                          **({"threads": args.threads} if args.threads else {}),
                          **({"cache_ram_mib": args.cache_ram} if args.cache_ram is not None else {}))
    options = SoakOptions(sessions=args.sessions, minutes=args.minutes, warmup_minutes=args.warmup_minutes,
                          turns=args.turns, max_tokens=args.max_tokens, fault_every=args.fault_every,
                          disconnect_share=args.disconnect_share, cancel_share=args.cancel_share, seed=args.seed)
    with Runner(config) as runner:
        report = soak(runner, options)
    print(json.dumps({"model": args.model, **report}))


if __name__ == "__main__":
    main()
