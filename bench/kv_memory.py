"""How many agent-session tokens one fixed KV budget holds without a refusal, a cut or a recompute.

Agent sessions share one long system prompt (Claude Code's first request is 6,555 tokens on
SmolLM2's tokenizer: tools and instructions) and grow by turns of ~300 tokens, unevenly (some
sessions start with more history). Every server gets the same KV budget in bytes: `--budget-tokens`
f16 tokens of the model. Each round, every session sends its whole conversation plus a new
~300-token user turn (as OpenAI clients do), all sessions at once, and the reply (a few tokens)
joins the history. A round fails when any request is refused (an HTTP error: the context or the
pool is full), or when a server computes more of a prompt than the turn added (the rest of the
conversation was lost from its KV: a recompute; the first turn is exempt). The result of a
system is the session tokens held (the sum of every session's conversation) after the last
round that did not fail, and why the next one failed.

Systems (comma-separated `--systems`):
  multiseq          multiseq serve, one KV pool of the budget (f16), prefix cells shared
  multiseq-q8       the same pool in bytes at q8_0 K and V (-ctk/-ctv q8_0): more tokens
  llama-server      llama-server at its defaults with -np given: a window of budget/np per slot (f16)
  llama-server-q8   llama-server --kv-unified -ctk q8_0 -ctv q8_0, the same bytes
Host-memory caches are off for all (--cache-ram 0): they hold tokens outside the budget.

Usage:
  .venv/bin/python bench/kv_memory.py --systems multiseq-q8,multiseq,llama-server,llama-server-q8 \
      --sessions 4 --budget-tokens 32768 --system-tokens 6500

The last line printed is one JSON object: per system its budget, tokens held, rounds and the
failure that ended it; and the ratios the issue names.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402

from multiseq import models  # noqa: E402
from multiseq.llama.backend import LlamaModel  # noqa: E402

_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TURN_TOKENS = 300
REPLY_TOKENS = 4
# A prompt may be computed a little beyond what the turn added (the template's turn markers,
# the reply's last token, a chunk rounded): more than this is a lost conversation.
RECOMPUTE_SLACK = 64
SYSTEMS = ("multiseq", "multiseq-q8", "llama-server", "llama-server-q8")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the sessions -----------------------------------------------------------------------------

def text_of_tokens(model: LlamaModel, seed_words: list[str], tokens: int) -> str:
    """Text of about `tokens` tokens on the model's tokenizer, from a cycle of words."""
    words, text = [], ""
    index = 0
    while len(model.tokenize(text, add_special=False)) < tokens:
        words += [f"{seed_words[index % len(seed_words)]}{index}" for index in range(index, index + 40)]
        index += 40
        text = " ".join(words)
    while len(model.tokenize(text, add_special=False)) > tokens:
        words.pop()
        text = " ".join(words)
    return text


def system_prompt(model: LlamaModel, tokens: int) -> str:
    """An agent's system prompt of about `tokens` tokens: instructions and tool descriptions."""
    tools = ["read_file(path): returns the file's lines", "write_file(path, text): replaces the file",
             "run(command): runs a shell command and returns its output", "search(pattern): lists matching lines",
             "edit(path, old, new): replaces one string in a file", "list(path): lists a folder"]
    words = ("You are a coding agent. Use the tools below to read, change and test the project. " +
             " ".join(f"Tool {tool}." for tool in tools)).split()
    return text_of_tokens(model, words, tokens)


@dataclass
class Session:
    index: int
    messages: list[dict]
    held: int = 0  # the conversation's tokens after its last turn (prompt + reply)
    turns: int = 0


def new_sessions(model: LlamaModel, count: int, system: str, history_step: int) -> list[Session]:
    """Sessions on one system prompt; session i starts with i x history_step tokens of earlier
    conversation (uneven lengths)."""
    sessions = []
    for index in range(count):
        messages = [{"role": "system", "content": system}]
        for turn in range(index * history_step // TURN_TOKENS):
            messages += [{"role": "user", "content": user_turn(model, index, -1 - turn)},
                         {"role": "assistant", "content": "Done."}]
        sessions.append(Session(index, messages))
    return sessions


_turn_cache: dict[tuple[int, int], str] = {}


def user_turn(model: LlamaModel, session: int, turn: int) -> str:
    key = (session, turn)
    if key not in _turn_cache:
        _turn_cache[key] = text_of_tokens(model, [f"s{session}t{turn}w", "file", "change", "test", "result"],
                                          TURN_TOKENS - 10)
    return _turn_cache[key]


# --- one round ------------------------------------------------------------------------------

@dataclass
class TurnOutcome:
    prompt_tokens: int = 0
    computed: int = 0
    completion_tokens: int = 0
    reply: str = ""
    error: str | None = None


def send_turn(base: str, model_name: str, messages: list[dict], timeout_s: float) -> TurnOutcome:
    body = {"model": model_name, "messages": messages, "max_tokens": REPLY_TOKENS, "temperature": 0,
            "ignore_eos": True}
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with _HTTP.open(request, timeout=timeout_s) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as error:
        return TurnOutcome(error=f"HTTP {error.code}: {error.read().decode(errors='replace')[:300]}")
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        return TurnOutcome(error=f"{type(error).__name__}: {error}")
    usage = answer.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = answer.get("timings", {}).get("cache_n", 0)
    prompt = usage.get("prompt_tokens", 0)
    return TurnOutcome(prompt, prompt - cached, usage.get("completion_tokens", 0),
                       answer["choices"][0]["message"].get("content") or "")


def run_round(base: str, model_name: str, model: LlamaModel, sessions: list[Session], timeout_s: float) -> str | None:
    """Every session sends its next turn at once; the failure that ends the run, or None."""
    outcomes: dict[int, TurnOutcome] = {}

    def one(session: Session) -> None:
        messages = session.messages + [{"role": "user", "content": user_turn(model, session.index, session.turns)}]
        outcomes[session.index] = send_turn(base, model_name, messages, timeout_s)

    threads = [threading.Thread(target=one, args=(session,)) for session in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for session in sessions:
        outcome = outcomes[session.index]
        if outcome.error:
            return f"session {session.index} refused: {outcome.error}"
        added = outcome.prompt_tokens - session.held
        if session.turns > 0 and outcome.computed > added + RECOMPUTE_SLACK:
            return (f"session {session.index} recomputed: {outcome.computed} prompt tokens computed where the turn "
                    f"added {added}")
    for session in sessions:
        outcome = outcomes[session.index]
        session.messages += [{"role": "user", "content": user_turn(model, session.index, session.turns)},
                             {"role": "assistant", "content": outcome.reply}]
        session.held = outcome.prompt_tokens + outcome.completion_tokens
        session.turns += 1
    return None


# --- the systems ----------------------------------------------------------------------------

@dataclass
class SystemRun:
    name: str
    kv_tokens: int  # what the budget holds at this system's KV type
    held: int = 0
    rounds: int = 0
    ended_by: str = ""
    held_by_session: list[int] = field(default_factory=list)
    seconds: float = 0.0


def server_command(system: str, args, port: int, model_path: Path, kv_tokens: int) -> list[str]:
    q8 = ["-ctk", "q8_0", "-ctv", "q8_0"] if system.endswith("-q8") else []
    if system.startswith("multiseq"):
        return [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", args.model, "-np", str(args.sessions),
                "-c", str(kv_tokens), "-t", str(args.threads), "--port", str(port), "--no-dashboard",
                "--cache-ram", "0", "--step-tokens", "512", *q8]  # prompts in chunks of up to 512, as llama-server
    tools = peers.ensure_llama_tools(log=log)
    unified = ["--kv-unified"] if system.endswith("-q8") else []
    # server_command's -c is slots x slot_ctx; with --kv-unified the slots share it all.
    return peers.server_command(tools, model_path, args.sessions, args.threads, kv_tokens // args.sessions, port,
                                prompt_cache=True, extra_args=[*unified, *q8, "--cache-ram", "0"])


def run_system(system: str, args, model: LlamaModel, model_path: Path, system_text: str, workdir: Path) -> SystemRun:
    f16_bytes = model.kv_bytes_per_token(("f16", "f16"))
    per_token = model.kv_bytes_per_token(("q8_0", "q8_0") if system.endswith("-q8") else ("f16", "f16"))
    kv_tokens = args.budget_tokens * f16_bytes // per_token // args.sessions * args.sessions
    run = SystemRun(system, kv_tokens)
    port = peers._free_port()
    log_path = workdir / f"kv-memory-{system}.log"
    started = time.perf_counter()
    with log_path.open("w") as log_file:
        process = peers.subprocess.Popen(server_command(system, args, port, model_path, kv_tokens),
                                         stdout=log_file, stderr=peers.subprocess.STDOUT)
        try:
            peers._wait_healthy(process, f"http://127.0.0.1:{port}", timeout_s=300)
            sessions = new_sessions(model, args.sessions, system_text, args.history_step)
            while run.rounds < args.max_rounds:
                failure = run_round(f"http://127.0.0.1:{port}", models.resolve(args.model).name, model, sessions,
                                    args.timeout)
                if failure:
                    run.ended_by = failure
                    break
                run.rounds += 1
                run.held_by_session = [session.held for session in sessions]
                run.held = sum(run.held_by_session)
                log(f"{system}: round {run.rounds}, {run.held:,} tokens held ({run.held_by_session})")
            else:
                run.ended_by = f"--max-rounds {args.max_rounds} reached"
        finally:
            peers._stop(process)
    run.seconds = time.perf_counter() - started
    log(f"{system}: {run.held:,} tokens held in {run.rounds} rounds; then {run.ended_by}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--sessions", type=int, default=4, help="Sessions at once (and slots, -np).")
    parser.add_argument("--budget-tokens", type=int, default=32768, help="The KV budget, in f16 tokens of the model.")
    parser.add_argument("--system-tokens", type=int, default=6500, help="The shared system prompt's tokens.")
    parser.add_argument("--history-step", type=int, default=300,
                        help="Session i starts with i x this many tokens of earlier turns.")
    parser.add_argument("--max-rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds one request may take.")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/multiseq-kv-memory"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    model_path = models.resolve(args.model).path
    model = LlamaModel(str(model_path), vocab_only=True)
    system_text = system_prompt(model, args.system_tokens)
    runs = {name: run_system(name, args, model, model_path, system_text, args.workdir)
            for name in args.systems.split(",")}
    print(f"\n{args.model}, {args.sessions} sessions, a {args.system_tokens}-token shared system prompt, KV budget "
          f"{args.budget_tokens:,} f16 tokens ({args.budget_tokens * model.kv_bytes_per_token() / 2**20:.0f} MiB)")
    print(f"{'system':<18}{'KV tokens':>10}{'held':>10}{'rounds':>8}  ended by")
    for run in runs.values():
        print(f"{run.name:<18}{run.kv_tokens:>10,}{run.held:>10,}{run.rounds:>8}  {run.ended_by[:90]}")
    ratios = {}
    for ours, theirs in (("multiseq-q8", "llama-server"), ("multiseq-q8", "llama-server-q8"),
                         ("multiseq", "llama-server")):
        if ours in runs and theirs in runs and runs[theirs].held:
            ratios[f"{ours}/{theirs}"] = round(runs[ours].held / runs[theirs].held, 2)
    print("ratios:", ratios)
    print(json.dumps({"model": args.model, "sessions": args.sessions, "budget_f16_tokens": args.budget_tokens,
                      "system_tokens": args.system_tokens, "ratios": ratios,
                      "runs": {name: run.__dict__ for name, run in runs.items()}}))


if __name__ == "__main__":
    main()
