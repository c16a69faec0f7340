"""Load benchmark: concurrent streaming clients against multiseq serve and llama-server.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/load.py --systems multiseq,llama-server --workloads distinct,shared-prefix
    python bench/load.py --systems multiseq,batch-run --workloads distinct --clients 16 --parallel 16
    python bench/load.py --systems multiseq,llama-server --workloads agents --parallel 4 --sessions 8 \
        --turns 4 --system-tokens 1000 --slot-ctx 4096
    python bench/load.py --systems multiseq,llama-server --workloads agents-tools --parallel 4 --sessions 8 \
        --turns 4 --system-tokens 1000 --tools 10 --slot-ctx 4096
    python bench/load.py --systems multiseq,llama-server --workloads distinct,long-prompts --clients 16 \
        --parallel 16 --slot-ctx 4096
    python bench/load.py --systems multiseq --workloads agents,agents-tools --parallel 4 --sessions 8 \
        --turns 4 --system-tokens 1000 --slot-ctx 4096 --api responses
    python bench/load.py --systems multiseq-ray --routing prefix,prefix-unshared,ray --replicas 2 \
        --workloads agents --parallel 4 --sessions 8 --turns 4 --system-tokens 1000 --slot-ctx 4096 --think-s 3

Each workload is a list of chat requests sent through the API --api names, streamed, by
--clients clients in a closed loop (each sends its next request when the last one ended), to
a server with --parallel slots started for the run on a free loopback port and stopped after:

- distinct: 64 distinct short chats, 128 tokens each.
- shared-prefix: the suite's 64 chats sharing a ~480-token system prompt, 48 tokens each
  (llama-server with its default prompt cache).
- agents: --sessions agent sessions (default 2 x --parallel) sharing one system prompt of
  about --system-tokens tokens with tool descriptions, each --turns turns of a ~60-token user
  message and a reply of 64 to 96 tokens (by session); each session sends its next turn, the
  whole conversation so far as the OpenAI API wants it, as soon as its last reply ended.
  Reported besides: TTFT p50/p95 per turn, and prompt tokens computed (sent minus cached).
- agents-tools: the agents workload with --tools tool definitions (OpenAI function specs) in
  every request and tool_choice "required": each reply must call a tool; the next turn sends
  the call and its result back, then the next question. A reply without a call (a server that
  does not force one) is sent back as text. Reported besides: replies whose calls all parse
  and validate against their tool's parameters.
- long-prompts: the distinct chats, while one more client sends a long prompt (about
  --long-tokens tokens, a distinct one each time, 16 tokens to generate) every --long-every
  seconds: what a long prompt does to everyone else's stream. Gaps and TTFT are reported for
  the short chats, TTFT for the long prompts apart.

--api: `chat` (the default: /v1/chat/completions), `responses` (OpenAI's /v1/responses: the
system prompt as `instructions`, the history as input items, a call as a `function_call` item
and its result as a `function_call_output`) or `messages` (Anthropic's /v1/messages: `tool_use`
and `tool_result` blocks). Each API's own stream events give the TTFT, the gaps, the usage
(prompt tokens sent and cached; Anthropic's `input_tokens + cache_read_input_tokens` sent,
`cache_read_input_tokens` cached) and the calls sent back; the conversation, the figures and
the summary are the same whichever API carries them (bench/apis.py), so runs of one workload
over the three APIs compare prompt tokens computed directly. One difference is the API's own: a
call cut off by max_tokens is not a JSON object, and an Anthropic `tool_use` block's `input`
must be one, so over `messages` such a call goes back as `{}`. llama-server's own /v1/responses
and /v1/messages may be tried the same way.

Every request is greedy and, without tools, generates exactly its token budget (ignore_eos),
so every system does the same work; a forced tool call ends when the call is whole. The client is asyncio and the standard library only (one connection per
request, the SSE stream parsed as it arrives), so it takes little CPU from the servers.
Reported per system: output tokens/s over the run's wall time, TTFT p50/p95 (request sent to
first content), gaps between consecutive content events p50/p99/p99.9/max, prompt tokens sent
and cached, (multiseq) loop_lag_max_ms: the largest lag of the server's event loop during
the run, read from its /metrics, and health_p50_ms/_p99_ms/_max_ms: GET /health every 0.1 s
from a thread of the benchmark's own while the load runs. `batch-run` is the same chats through `multiseq batch-run` at the same -np, for
the server's cost over the engine. `multiseq` shares one KV pool of --parallel x --slot-ctx
tokens among its slots (a session capped at --slot-ctx) in its default layout (a window per slot
while every session fits one, one pool from the step one needs more); `multiseq-pool` holds it
in one pool throughout (--kv-unified); `multiseq-windows` gives each slot a window of --slot-ctx
(--no-kv-unified). `multiseq-ray` is `multiseq serve --ray` on a local Ray:
--replicas servers sharing --threads, behind Ray Serve's proxy, with --routing prefix (each
conversation to the replica holding it, a prefix another replica holds brought over),
prefix-unshared (the same without bringing prefixes over), ray (Ray Serve's own router) or
several in turn; with ray among them, `ratios` has the prompt tokens computed under each other
routing over those under Ray's.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import numpy as np

import peers  # bench/ is the script's own folder, first on sys.path
from apis import messages_body, responses_body, take_messages_event, take_responses_event
from workloads import (agent_system_prompt, agent_tools, agent_user_messages, long_prompts, shared_prefix_chats,
                       short_prompts, tool_result)

from multiseq import models

SYSTEMS = ("multiseq", "multiseq-pool", "multiseq-windows", "multiseq-ray", "llama-server", "batch-run")
# multiseq-ray's routings: prefix (sharing prefixes' KV between replicas), prefix-unshared (without), ray.
BENCH_ROUTINGS = ("prefix", "prefix-unshared", "ray")
HEALTH_PROBE_EVERY_S = 0.1


@dataclass(frozen=True)
class ChatLoad:
    name: str
    chats: list[list[dict]]
    max_tokens: int


# An explicit system message: without one, some chat templates (SmolLM2's, rendered by
# llama-server's Jinja engine) add a default one, and the systems would not be sent the same text.
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def chat_loads(num_requests: int) -> dict[str, ChatLoad]:
    return {
        "distinct": ChatLoad("distinct", [[SYSTEM, {"role": "user", "content": prompt}]
                                          for prompt in short_prompts(num_requests)], 128),
        "shared-prefix": ChatLoad("shared-prefix", [list(chat) for chat in shared_prefix_chats(num_requests)], 48),
    }


@dataclass(frozen=True)
class AgentLoad:
    """Sessions that share a system prompt, each a conversation of several turns."""

    name: str
    system: dict
    users: list[list[str]]  # per session, its user messages in turn order
    reply_tokens: list[int]  # per session
    tools: list[dict] | None = None  # OpenAI function specs; every turn then forces a call
    think_s: float = 0.0  # mean pause before each later turn (an agent running its tools)

    def pause_before(self, session: int, turn: int) -> float:
        """The pause before a session's turn: uniform in [0, 2 * think_s), the same in every
        run (seeded by session and turn), none before the first turn."""
        return random.Random(session * 1_000 + turn).uniform(0, 2 * self.think_s) if turn else 0.0

    @property
    def chats(self) -> list[list[dict]]:  # each session's first turn (for a warm-up or a peek)
        return [[self.system, {"role": "user", "content": users[0]}] for users in self.users]


@dataclass(frozen=True)
class LongPromptLoad:
    """Short chats in a closed loop, and long prompts arriving on a clock beside them."""

    name: str
    short: ChatLoad
    long_chats: list[list[dict]]
    every_s: float
    long_max_tokens: int = 16

    @property
    def chats(self) -> list[list[dict]]:
        return self.short.chats


def long_prompt_load(short: ChatLoad, approx_tokens: int, every_s: float) -> LongPromptLoad:
    """Long prompts of about approx_tokens tokens (paragraphs of notes, ~400 tokens each on SmolLM2, joined)."""
    paragraphs = long_prompts(256, seed=7)
    per_prompt = max(1, round(approx_tokens / 400))
    chats = [[SYSTEM, {"role": "user", "content": "\n".join(paragraphs[index:index + per_prompt])}]
             for index in range(0, len(paragraphs) - per_prompt + 1, per_prompt)]
    return LongPromptLoad("long-prompts", short, chats, every_s)


def agent_load(sessions: int, turns: int, system_tokens: int, num_tools: int = 0, think_s: float = 0.0) -> AgentLoad:
    """Sessions sharing a system prompt; with num_tools, they also send that many tool
    definitions, and every turn asks for a tool call (tool_choice required) and sends its
    result back with the next question ("agents-tools")."""
    return AgentLoad("agents-tools" if num_tools else "agents",
                     {"role": "system", "content": agent_system_prompt(system_tokens)},
                     [agent_user_messages(session, turns) for session in range(sessions)],
                     # A forced call ends by itself; its budget only bounds a runaway argument.
                     [(192 if num_tools else 64) + (session * 11) % 33 for session in range(sessions)],
                     agent_tools(num_tools) if num_tools else None, think_s)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the client ----------------------------------------------------------------------------------

@dataclass
class Exchange:
    """One streamed request as the client saw it."""

    sent_at: float
    first_content_at: float | None = None
    done_at: float | None = None
    content_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    turn: int = 0
    max_tokens: int = 0  # what it asked for (every request ignores EOS: exactly that many are expected)
    tool_calls: list[dict] = field(default_factory=list)  # assembled from delta.tool_calls, by index

    @property
    def ttft(self) -> float | None:
        return None if self.first_content_at is None else self.first_content_at - self.sent_at

    @property
    def gaps(self) -> list[float]:
        return list(np.diff(self.content_times)) if len(self.content_times) > 1 else []


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]):
    """The response body as it arrives: chunked transfer encoding, or until the connection closes."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size)
            await reader.readline()
            yield data
    else:
        while data := await reader.read(65536):
            yield data


async def send(host: str, port: int, api: Api, chat: list[dict], max_tokens: int, model: str,
               tools: list[dict] | None = None) -> Exchange:
    """Send one conversation through `api`, streamed, and time its events."""
    return await stream_request(host, port, api, api.body(chat, max_tokens, model, tools), max_tokens)


async def stream_request(host: str, port: int, api: Api, body: dict, max_tokens: int) -> Exchange:
    """POST one streamed request to the API's route and time its events."""
    reader, writer = await asyncio.open_connection(host, port)
    payload = json.dumps(body).encode("utf-8")
    exchange = Exchange(time.perf_counter(), max_tokens=max_tokens)
    writer.write(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (api.path.encode(), host.encode(), port,
                                                                       len(payload)) + payload)
    await writer.drain()
    status = (await reader.readline()).decode().split()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if len(status) < 2 or status[1] != "200":
        raise RuntimeError(f"HTTP {' '.join(status[1:])}: {(await reader.read()).decode(errors='replace')[:300]}")
    buffer = b""
    async for data in _read_body(reader, headers):
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if api.take_event(exchange, event):
                writer.close()
                return exchange
    writer.close()
    exchange.done_at = time.perf_counter()
    return exchange


def _take_event(exchange: Exchange, event: bytes) -> bool:
    """Note one Chat Completions SSE event; True at [DONE]."""
    now = time.perf_counter()
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            exchange.done_at = now
            return True
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"stream error: {chunk['error']}")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                exchange.text += content
            if content or delta.get("tool_calls"):
                exchange.content_times.append(now)
                if exchange.first_content_at is None:
                    exchange.first_content_at = now
            for call in delta.get("tool_calls") or []:
                _add_call_delta(exchange.tool_calls, call)
        usage = chunk.get("usage")
        if usage:
            exchange.completion_tokens = usage.get("completion_tokens", 0)
            exchange.prompt_tokens = usage.get("prompt_tokens", 0)
            exchange.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return False


def _add_call_delta(calls: list[dict], delta: dict) -> None:
    """Assemble streamed tool calls as clients do: by index, the first delta naming the call."""
    index = delta.get("index", 0)
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call, function = calls[index], delta.get("function") or {}
    call["id"] = delta.get("id") or call["id"]
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def request_body(chat: list[dict], max_tokens: int, model: str, tools: list[dict] | None = None) -> dict:
    """A streamed, greedy chat request. Without tools it ignores EOS (every reply is max_tokens
    long); with tools it must call one (tool_choice required) and ends when it has."""
    body = {"model": model, "messages": chat, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": not tools,
            "stream": True, "stream_options": {"include_usage": True}}
    # One call per reply: given the choice, a small model adds call after call until max_tokens.
    return body | ({"tools": tools, "tool_choice": "required", "parallel_tool_calls": False} if tools else {})


@dataclass(frozen=True)
class Api:
    """An API the requests travel through: its route, the request body of a conversation
    (chat messages, max_tokens, model, tools), and the reader of its stream's events (True when
    the stream is done)."""

    name: str
    path: str
    body: Callable[[list[dict], int, str, list[dict] | None], dict]
    take_event: Callable[[Exchange, bytes], bool]


APIS = {
    "chat": Api("chat", "/v1/chat/completions", request_body, _take_event),
    "responses": Api("responses", "/v1/responses", responses_body, take_responses_event),
    "messages": Api("messages", "/v1/messages", messages_body, take_messages_event),
}


def calls_validate(calls: list[dict], tools: list[dict]) -> bool:
    """Whether a reply made at least one call, and every call names a tool and its arguments
    validate against that tool's parameters."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    try:
        return bool(calls) and all(
            call["function"]["name"] in schemas
            and jsonschema.Draft202012Validator(schemas[call["function"]["name"]]).is_valid(
                json.loads(call["function"]["arguments"]))
            for call in calls)
    except ValueError:
        return False


async def closed_loop(host: str, port: int, load: ChatLoad, clients: int, model: str,
                      api: Api) -> tuple[list[Exchange], float]:
    """`clients` clients, each sending the next chat as soon as its last one ended."""
    pending = list(enumerate(load.chats))
    pending.reverse()
    exchanges: list[Exchange | None] = [None] * len(load.chats)

    async def client() -> None:
        while pending:
            index, chat = pending.pop()
            exchanges[index] = await send(host, port, api, chat, load.max_tokens, model)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return exchanges, time.perf_counter() - started


async def agent_sessions(host: str, port: int, load: AgentLoad, model: str, api: Api) -> tuple[list[Exchange], float]:
    """Every session at once, each sending its next turn (the whole conversation so far) once
    its last reply ended and its pause (--think-s) is over."""
    exchanges: list[Exchange] = []

    async def session(index: int) -> None:
        history = [load.system]
        for turn, user in enumerate(load.users[index]):
            history.append({"role": "user", "content": user})
            await asyncio.sleep(load.pause_before(index, turn))
            exchange = await send(host, port, api, history, load.reply_tokens[index], model, load.tools)
            exchange.turn = turn
            exchanges.append(exchange)
            history += _reply_messages(exchange, turn)

    started = time.perf_counter()
    await asyncio.gather(*(session(index) for index in range(len(load.users))))
    return exchanges, time.perf_counter() - started


async def with_long_prompts(host: str, port: int, load: LongPromptLoad, clients: int, model: str,
                            api: Api) -> tuple[list[Exchange], list[Exchange], float]:
    """The short chats' closed loop, and a long prompt every load.every_s seconds (the first
    after one period) until the short chats are done; then the long ones still out finish."""
    short_run = asyncio.ensure_future(closed_loop(host, port, load.short, clients, model, api))
    long_runs = []
    for chat in load.long_chats:
        try:
            await asyncio.wait_for(asyncio.shield(short_run), load.every_s)
            break
        except asyncio.TimeoutError:
            long_runs.append(asyncio.ensure_future(send(host, port, api, chat, load.long_max_tokens, model)))
    short_exchanges, wall_s = await short_run
    return short_exchanges, list(await asyncio.gather(*long_runs)), wall_s


def summarize_long_prompts(system: str, load: LongPromptLoad, short: list[Exchange], long: list[Exchange],
                           wall_s: float) -> dict:
    figure = summarize(system, load.name, short, wall_s)
    figure["tokens_per_s"] = (figure["generated_tokens"] + sum(exchange.completion_tokens for exchange in long)) / wall_s
    figure["long_requests"] = len(long)
    figure["long_prompt_tokens_mean"] = float(np.mean([exchange.prompt_tokens for exchange in long])) if long else None
    long_ttfts = _ttfts(long)
    figure["long_ttft_p50_s"] = _percentile(long_ttfts, 50)
    figure["long_ttft_max_s"] = max(long_ttfts) if long_ttfts else None
    return figure


def _reply_messages(exchange: Exchange, turn: int) -> list[dict]:
    """The reply as the next turn sends it back: the assistant's text or calls, then each
    call's result."""
    if not exchange.tool_calls:
        return [{"role": "assistant", "content": exchange.text}]
    assistant = {"role": "assistant", "content": exchange.text or None, "tool_calls": exchange.tool_calls}
    return [assistant, *({"role": "tool", "tool_call_id": call["id"] or f"call_{number}",
                          "content": tool_result(call["function"]["name"], turn)}
                         for number, call in enumerate(exchange.tool_calls))]


def summarize_agents(system: str, load: AgentLoad, exchanges: list[Exchange], wall_s: float) -> dict:
    figure = summarize(system, load.name, exchanges, wall_s)
    if load.tools:
        figure["replies_with_valid_calls"] = sum(calls_validate(exchange.tool_calls, load.tools)
                                                 for exchange in exchanges)
        figure["replies"] = len(exchanges)
    sent = figure["prompt_tokens"]
    figure["prompt_tokens_computed"] = sent - figure["prompt_tokens_cached"]
    figure["first_prompt_tokens"] = min((exchange.prompt_tokens for exchange in exchanges if exchange.turn == 0),
                                        default=None)
    for turn in sorted({exchange.turn for exchange in exchanges}):
        ttfts = _ttfts([exchange for exchange in exchanges if exchange.turn == turn])
        figure[f"turn{turn + 1}_ttft_p50_s"] = _percentile(ttfts, 50)
        figure[f"turn{turn + 1}_ttft_p95_s"] = _percentile(ttfts, 95)
    return figure


def summarize(system: str, workload: str, exchanges: list[Exchange], wall_s: float) -> dict:
    generated = sum(exchange.completion_tokens for exchange in exchanges)
    ttfts = _ttfts(exchanges)
    gaps = [gap for exchange in exchanges for gap in exchange.gaps]
    wrong = [index for index, exchange in enumerate(exchanges) if exchange.completion_tokens != exchange.max_tokens]
    return {
        "system": system, "workload": workload, "requests": len(exchanges), "generated_tokens": generated,
        "wall_s": wall_s, "tokens_per_s": generated / wall_s,
        "ttft_p50_s": _percentile(ttfts, 50), "ttft_p95_s": _percentile(ttfts, 95),
        "gap_p50_s": _percentile(gaps, 50), "gap_p99_s": _percentile(gaps, 99),
        "gap_p999_s": _percentile(gaps, 99.9), "gap_max_s": max(gaps) if gaps else None,
        "prompt_tokens": sum(exchange.prompt_tokens for exchange in exchanges),
        "prompt_tokens_cached": sum(exchange.cached_tokens for exchange in exchanges),
        "requests_with_wrong_length": len(wrong),
    }


def _ttfts(exchanges: list[Exchange]) -> list[float]:
    return [exchange.ttft for exchange in exchanges if exchange.ttft is not None]


def _percentile(values: list[float], percent: float) -> float | None:
    return float(np.percentile(values, percent)) if values else None


# --- the systems ---------------------------------------------------------------------------------

@contextmanager
def running(command: list[str], port: int, log_path: Path):
    """A server process, healthy (GET /health 200) before the body runs, stopped after."""
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            peers._wait_healthy(process, f"http://127.0.0.1:{port}", timeout_s=300)
            yield process
        except RuntimeError as error:
            raise RuntimeError(f"{error}\n{peers._tail(log_path)}") from None
        finally:
            peers._stop(process)


def multiseq_command(args, port: int, layout: str | None = None) -> list[str]:
    """multiseq serve with one KV pool of --parallel x --slot-ctx tokens (a session capped at
    --slot-ctx), in the default layout, or held as one pool always (layout "pool"), or (layout
    "windows") a window of --slot-ctx per slot, as before the pool."""
    kv = ["--no-kv-unified", "--slot-ctx", str(args.slot_ctx)] if layout == "windows" else \
        ["-c", str(args.parallel * args.slot_ctx), "--slot-ctx", str(args.slot_ctx),
         *(["--kv-unified"] if layout == "pool" else [])]
    return [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", args.model, "-np", str(args.parallel),
            *kv, "-t", str(args.threads), "--port", str(port), "--no-dashboard",
            "--max-queue", "4096", *(["--step-tokens", str(args.step_tokens)] if args.step_tokens else [])]


def multiseq_ray_command(args, port: int, routing: str) -> list[str]:
    """`multiseq serve --ray` on a local Ray: --replicas servers of --parallel slots, the
    --threads shared among them (the same cores as the single server). Routing prefix-unshared
    is prefix routing with --no-share-prefixes."""
    threads = max(1, args.threads // args.replicas)
    routing_options = (["--routing", "prefix", "--no-share-prefixes"] if routing == "prefix-unshared"
                       else ["--routing", routing])
    return [sys.executable, "-m", "multiseq.cli.main", "serve", "--ray", "--replicas", str(args.replicas),
            *routing_options, "-m", args.model, "-np", str(args.parallel), "--slot-ctx", str(args.slot_ctx),
            "-t", str(threads), "--port", str(port), "--no-dashboard", "--max-queue", "4096",
            *(["--step-tokens", str(args.step_tokens)] if args.step_tokens else [])]


def llama_server_command(args, port: int, model_path: Path, fallback_template: str | None) -> list[str]:
    tools = peers.ensure_llama_tools(log=log)
    # A built-in template's name is Jinja text to llama-server unless --no-jinja: with `--chat-template
    # gemma` alone it would send every chat as the word "gemma" (Gemma 3 270M's GGUF has no template).
    extra = ["--no-jinja", "--chat-template", fallback_template] if fallback_template else []
    return peers.server_command(tools, model_path, args.parallel, args.threads, args.slot_ctx, port,
                                prompt_cache=True, extra_args=extra)


def run_server(system: str, load: ChatLoad | AgentLoad | LongPromptLoad, args, workdir: Path,
               routing: str | None = None) -> dict:
    resolved = models.resolve(args.model)
    port = peers._free_port()
    if system in ("multiseq", "multiseq-pool", "multiseq-windows"):
        command = multiseq_command(args, port, system.removeprefix("multiseq").removeprefix("-") or None)
    elif system == "multiseq-ray":
        command = multiseq_ray_command(args, port, routing)
    else:
        command = llama_server_command(args, port, resolved.path, resolved.chat_template_fallback)
    api = APIS[args.api]
    log_name = f"{system}{'-' + routing if routing else ''}-{load.name}.log"
    with running(command, port, workdir / log_name):
        # Warm-up, every slot once, with chats the run does not send (so that no cache starts warm).
        warm_up = ChatLoad("warm-up", [[SYSTEM, {"role": "user", "content": f"Say {word}."}]
                                       for word in ("one", "two", "three", "four") * args.parallel], 4)
        asyncio.run(closed_loop("127.0.0.1", port, warm_up, args.parallel, resolved.name, api))
        before = scrape_metrics(port)  # the lag's maximum is since the previous scrape: this one starts the run's
        with HealthProbe(port) as health:
            figure = _run_load(load, args, port, resolved.name, api, system)
        figure |= health.figures()
        figure |= {"routing": routing, "replicas": args.replicas} if routing else {}
        metrics = scrape_metrics(port)
        figure |= {"loop_lag_max_ms": loop_lag_max_ms(metrics)}
        if system == "multiseq-ray":  # prefixes' KV brought from another replica
            figure["prefix_imports"] = (sum(_samples(metrics, "multiseq_ram_cache_imports_total"))
                                        - sum(_samples(before, "multiseq_ram_cache_imports_total")))
        return figure


def _run_load(load: ChatLoad | AgentLoad | LongPromptLoad, args, port: int, model: str, api: Api,
              system: str) -> dict:
    if isinstance(load, AgentLoad):
        exchanges, wall_s = asyncio.run(agent_sessions("127.0.0.1", port, load, model, api))
        return summarize_agents(system, load, exchanges, wall_s)
    if isinstance(load, LongPromptLoad):
        short, long, wall_s = asyncio.run(with_long_prompts("127.0.0.1", port, load, args.clients, model, api))
        return summarize_long_prompts(system, load, short, long, wall_s)
    exchanges, wall_s = asyncio.run(closed_loop("127.0.0.1", port, load, args.clients, model, api))
    return summarize(system, load.name, exchanges, wall_s)


class HealthProbe:
    """GET /health every HEALTH_PROBE_EVERY_S from a thread of its own while a load runs: how
    long a supervisor's health check waits while every slot streams (health_p50_ms, _p99_ms, _max_ms)."""

    def __init__(self, port: int) -> None:
        self._url = f"http://127.0.0.1:{port}/health"
        self._latencies_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, daemon=True)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _probe(self) -> None:
        while not self._stop.wait(HEALTH_PROBE_EVERY_S):
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self._url, timeout=30) as answer:
                    answer.read()
            except OSError:
                continue  # (a 503 or a refused connection: not a latency)
            self._latencies_ms.append((time.perf_counter() - started) * 1000)

    def figures(self) -> dict:
        values = self._latencies_ms
        return {"health_p50_ms": _percentile(values, 50), "health_p99_ms": _percentile(values, 99),
                "health_max_ms": max(values, default=None)}


def scrape_metrics(port: int) -> str:
    """The server's /metrics ("" for a server without them: llama-server)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError):
        return ""


def loop_lag_max_ms(metrics: str) -> float | None:
    """multiseq's largest event-loop lag since the previous scrape of its /metrics, in ms (the
    largest of its replicas' with --ray; None for a server without that metric: llama-server)."""
    lags = [value * 1000 for value in _samples(metrics, "multiseq_event_loop_lag_max_seconds")]
    return max(lags) if lags else None


def _samples(metrics: str, name: str) -> list[float]:
    """The values of one metric's samples (with any labels) in a Prometheus exposition."""
    return [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith((f"{name} ", f"{name}{{"))]


def run_batch(load: ChatLoad, args, workdir: Path) -> dict:
    """The same chats through `multiseq batch-run` at the same -np (its wall time includes
    loading the model, so its own summary's throughput is used: first submission to last result)."""
    prompts = workdir / f"{load.name}.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(index), "messages": chat, "max_tokens": load.max_tokens,
                                           "temperature": 0, "ignore_eos": True}) + "\n"
                               for index, chat in enumerate(load.chats)))
    stats = workdir / f"{load.name}-stats.json"
    subprocess.run([sys.executable, "-m", "multiseq.cli.main", "batch-run", str(prompts), "-o",
                    str(workdir / f"{load.name}-out.jsonl"), "-m", args.model, "-np", str(args.parallel),
                    "--slot-ctx", str(args.slot_ctx), "-t", str(args.threads), "--no-dashboard",
                    "--stats-json", str(stats)], check=True, stderr=subprocess.DEVNULL)
    summary = json.loads(stats.read_text())
    return {"system": "batch-run", "workload": load.name, "requests": summary["requests"],
            "generated_tokens": summary["generated_tokens"], "wall_s": summary["wall_s"],
            "tokens_per_s": summary["tokens_per_s"], "ttft_p50_s": summary["ttft_p50_s"],
            "ttft_p95_s": summary["ttft_p95_s"], "prompt_tokens": summary["prompt_tokens"],
            "prompt_tokens_cached": summary["prompt_tokens_reused"]}


def ratios(figures: list[dict]) -> dict[str, float]:
    """multiseq's output tokens/s over each peer's, per workload; with multiseq-ray under both
    routings, the prompt tokens computed with prefix routing over those with Ray Serve's own."""
    found = {}
    for ours in (figure for figure in figures if figure["system"] == "multiseq"):
        for peer in (figure for figure in figures if figure["workload"] == ours["workload"] and figure is not ours):
            found[f"{ours['workload']}: multiseq / {_label(peer)}"] = ours["tokens_per_s"] / peer["tokens_per_s"]
    on_ray = {(figure["workload"], figure["routing"]): figure for figure in figures if figure["system"] == "multiseq-ray"}
    for (workload, routing), prefix in on_ray.items():
        default = on_ray.get((workload, "ray"))
        if routing != "ray" and default is not None and default.get("prompt_tokens_computed"):
            found[f"{workload}: prompt tokens computed, multiseq-ray {routing} / ray"] = \
                prefix["prompt_tokens_computed"] / default["prompt_tokens_computed"]
    return found


def _label(figure: dict) -> str:
    return f"{figure['system']} ({figure['routing']})" if figure.get("routing") else figure["system"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="multiseq,llama-server")
    parser.add_argument("--workloads", default="distinct,shared-prefix")
    parser.add_argument("--model", default=models.DEFAULT_MODEL)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--slot-ctx", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--sessions", type=int, default=None, help="agents: sessions (default 2 x --parallel)")
    parser.add_argument("--turns", type=int, default=4, help="agents: turns per session")
    parser.add_argument("--think-s", type=float, default=0.0,
                        help="agents: mean pause before each later turn, uniform in [0, 2x) and the same in every run "
                             "(an agent running its tools; default 0: the next turn as soon as the reply ended)")
    parser.add_argument("--system-tokens", type=int, default=1000, help="agents: system prompt size, about")
    parser.add_argument("--tools", type=int, default=10, help="agents-tools: tool definitions sent with each turn")
    parser.add_argument("--long-tokens", type=int, default=1200, help="long-prompts: a long prompt's size, about")
    parser.add_argument("--long-every", type=float, default=12.0, help="long-prompts: seconds between long prompts")
    parser.add_argument("--api", choices=list(APIS), default="chat",
                        help="the API every request goes through: chat (/v1/chat/completions), responses "
                             "(/v1/responses) or messages (Anthropic's /v1/messages)")
    parser.add_argument("--step-tokens", type=int, default=None, help="multiseq serve's --step-tokens (default: its own)")
    parser.add_argument("--replicas", type=int, default=2, help="multiseq-ray: servers on the local Ray, sharing "
                        "--threads (each gets threads / replicas)")
    parser.add_argument("--routing", default="prefix", help="multiseq-ray: prefix, prefix-unshared (prefix routing "
                        "without sharing prefixes' KV between replicas), ray (Ray Serve's own router), or several: "
                        "prefix,ray")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    systems = args.systems.split(",")
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    chats = chat_loads(args.requests)
    loads: dict[str, ChatLoad | AgentLoad | LongPromptLoad] = {
        **chats, "agents": agent_load(args.sessions or 2 * args.parallel, args.turns, args.system_tokens,
                                      think_s=args.think_s),
        "agents-tools": agent_load(args.sessions or 2 * args.parallel, args.turns, args.system_tokens, args.tools,
                                   args.think_s),
        "long-prompts": long_prompt_load(chats["distinct"], args.long_tokens, args.long_every)}
    if {"agents", "agents-tools", "long-prompts"} & set(args.workloads.split(",")) and "batch-run" in systems:
        raise SystemExit("the agents and long-prompts workloads need a server: batch-run cannot take them")
    if args.api != "chat" and "batch-run" in systems:
        raise SystemExit(f"--api {args.api} needs a server: batch-run reads a prompts file, through no API")
    routings = args.routing.split(",")
    if set(routings) - set(BENCH_ROUTINGS):
        raise SystemExit(f"unknown routing in {args.routing!r}; choose from {', '.join(BENCH_ROUTINGS)}")
    figures = []
    with tempfile.TemporaryDirectory(prefix="multiseq-load-") as tmp:
        for name in args.workloads.split(","):
            for system, routing in [(system, routing) for system in systems
                                    for routing in (routings if system == "multiseq-ray" else [None])]:
                who = (f"{len(loads[name].users)} sessions" if isinstance(loads[name], AgentLoad)
                       else f"{args.clients} clients")
                how = f" --replicas {args.replicas} --routing {routing}" if routing else ""
                log(f"[{name}] {system}{how} -np {args.parallel}, {who}, --api {args.api} ...")
                figure = (run_batch(loads[name], args, Path(tmp)) if system == "batch-run"
                          else run_server(system, loads[name], args, Path(tmp), routing))
                figures.append(figure)
                log("  " + ", ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                                     for key, value in figure.items() if key not in ("system", "workload")))
    report = {"model": args.model, "api": args.api, "clients": args.clients, "parallel": args.parallel,
              "threads": args.threads, "figures": figures, "ratios": ratios(figures)}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
