"""Speculative decoding on an agent edit workload and on distinct chats: multiseq with and without
drafts, against llama-server with and without its draftless speculation.

Usage (from the repository root, in the project's virtual environment):

    python bench/speculation.py                                 # SmolLM2, 1 and 4 sessions, llama-server too
    python bench/speculation.py --model gemma3-270m --sessions 1 --no-server
    python bench/speculation.py --chats 16                      # also 16 distinct chats, spec on and off

The edit workload: the model is given one of this repository's source files (runner/loop/detok.py,
runner/loop/stepping.py, runner/kv/prefix.py, runner/loop/waiting.py; ~700-1,000 tokens each) and asked to
write it back with a name changed; greedy, exactly --tokens tokens (ignore_eos). With
--sessions 4 the four files go at once (-np 4). The prompts are rendered with multiseq's chat
template and sent as raw text to both servers, so both see the same tokens.

multiseq runs in process (the Runner, as batch-run and serve use it), once per --spec-types
entry; llama-server (bench/peers.py builds and drives it: one streaming client per prompt, after
a warm-up request) once without speculation and once per --server-spec entry. Reported per run: output tokens over the
wall time of the whole set (prefill included, the same on both sides), the decode rate of each
request (its tokens after the first, over the time after its first), draft tokens verified and
accepted, and whether each text equals the same server's text without speculation.

--chats N adds N distinct short chats of 128 tokens at -np N (the load of the batch-run
benchmarks), multiseq with and without ngram-mod: speculation must stand aside there.

A table is printed, then, as the last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path
import workloads

from multiseq import Request, Runner, RunnerConfig, SamplingParams
from multiseq.models import resolve

ROOT = Path(__file__).resolve().parent.parent
FILES = [("runner/loop/detok.py", "TextAssembler", "TextJoiner"), ("runner/loop/delivery.py", "Deliveries", "Handouts"),
         ("runner/kv/prefix.py", "common_prefix_length", "shared_length"), ("runner/loop/waiting.py", "WaitingQueue", "Queue")]
SLOT_CTX = 4096


def log(message: str) -> None:
    print(message, flush=True)


def edit_prompts(runner: Runner, sessions: int) -> list[str]:
    """The edit requests as raw prompt text, rendered with the model's chat template."""
    prompts = []
    for path, old, new in FILES[:sessions]:
        source = (ROOT / path).read_text()
        ask = (f"Rewrite this Python file with the name {old} changed to {new} everywhere. "
               f"Write the whole file and nothing else.\n\n```python\n{source}```")
        request = Request(messages=({"role": "user", "content": ask},))
        prompts.append(runner.engine.prompt_text(request))
    return prompts


# --- multiseq -----------------------------------------------------------------------------

def run_multiseq(model: str, prompts: list[str], tokens: int, spec_type: str, threads: int,
                 draft_max: int) -> dict:
    config = RunnerConfig(model=model, parallel=len(prompts), slot_ctx=SLOT_CTX, threads=threads, seed=0,
                          spec_type=spec_type, spec_draft_max=draft_max, prefix_cache=False)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    with Runner(config) as runner:
        started = time.perf_counter()
        results = runner.run_batch([Request(prompt=prompt, sampling=params) for prompt in prompts])
        seconds = time.perf_counter() - started
    failed = [result.error for result in results if not result.ok]
    if failed:
        raise RuntimeError(f"multiseq failed: {failed[0]}")
    return {"texts": [result.text for result in results], "seconds": seconds,
            "output_tokens": sum(result.completion_tokens for result in results),
            "decode_rates": [result.timings.decode_tokens_per_s for result in results],
            "drafted": sum(result.draft_tokens for result in results),
            "accepted": sum(result.draft_tokens_accepted for result in results)}


def multiseq_prompts(model: str, sessions: int) -> list[str]:
    with Runner(RunnerConfig(model=model, parallel=1, threads=1), autostart=False) as runner:
        return edit_prompts(runner, sessions)


# --- llama-server -------------------------------------------------------------------------

def run_server(tools, model: str, prompts: list[str], tokens: int, threads: int, spec_type: str | None,
               draft_max: int) -> dict:
    """llama-server -np len(prompts), greedy, each prompt from its own client (bench/peers.py)."""
    spec = [] if spec_type is None else ["--spec-type", spec_type, "--spec-draft-n-max", str(draft_max)]
    figure = peers.run_llama_server(tools, resolve(model).path, prompts, tokens, len(prompts), threads, SLOT_CTX,
                                    {"temperature": 0}, log=lambda _: None, extra_args=spec)
    return {"texts": figure["texts"], "seconds": figure["wall_s"], "output_tokens": figure["generated_tokens"],
            "decode_rates": figure["decode_rates"], "drafted": figure["draft_tokens"],
            "accepted": figure["draft_tokens_accepted"]}


# --- 16 distinct chats ----------------------------------------------------------------------

def run_chats(model: str, count: int, spec_type: str, threads: int) -> dict:
    config = RunnerConfig(model=model, parallel=count, slot_ctx=512, threads=threads, seed=0, spec_type=spec_type)
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    with Runner(config) as runner:
        started = time.perf_counter()
        results = runner.run_batch([Request(prompt=prompt, sampling=params)
                                    for prompt in workloads.short_prompts(count)])
        seconds = time.perf_counter() - started
    return {"texts": [result.text for result in results], "seconds": seconds,
            "output_tokens": sum(result.completion_tokens for result in results),
            "drafted": sum(result.draft_tokens for result in results),
            "accepted": sum(result.draft_tokens_accepted for result in results)}


def summarize(name: str, run: dict, reference: dict | None) -> dict:
    rate = run["output_tokens"] / run["seconds"]
    rates = [r for r in run.get("decode_rates", []) if r]
    same = None if reference is None else sum(a == b for a, b in zip(run["texts"], reference["texts"]))
    row = {"system": name, "output_tok_s": round(rate, 1), "seconds": round(run["seconds"], 2),
           "decode_tok_s": [round(r, 1) for r in rates], "drafted": run["drafted"], "accepted": run["accepted"],
           "texts_equal_to_plain": same, "of": len(run["texts"])}
    if reference is not None:
        row["speedup"] = round(rate / (reference["output_tokens"] / reference["seconds"]), 3)
    same_text = "" if same is None else f"same text {same}/{len(run['texts'])}"
    log(f"{name:32s} {rate:7.1f} tok/s  {run['seconds']:6.1f} s  decode {row['decode_tok_s']}  "
        f"drafted {run['drafted']} accepted {run['accepted']}  {same_text}  {row.get('speedup', '')}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sessions", default="1,4", help="numbers of concurrent edit sessions, comma-separated")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--spec-types", default="ngram-simple,ngram-mod")
    parser.add_argument("--server-spec", default="ngram-mod,ngram-simple")
    parser.add_argument("--draft-max", type=int, default=16)
    parser.add_argument("--chats", type=int, default=0, help="also N distinct short chats at -np N (0: no)")
    parser.add_argument("--no-server", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    tools = None if args.no_server else peers.ensure_llama_tools(log=log)
    figures: dict = {"model": args.model, "tokens": args.tokens, "threads": args.threads, "edit": {}, "chats": None}
    for sessions in [int(count) for count in args.sessions.split(",")]:
        prompts = multiseq_prompts(args.model, sessions)
        log(f"--- edit workload, {sessions} session(s), {args.tokens} tokens each")
        plain = run_multiseq(args.model, prompts, args.tokens, "none", args.threads, args.draft_max)
        rows = [summarize("multiseq", plain, plain)]
        for spec_type in [name for name in args.spec_types.split(",") if name]:
            run = run_multiseq(args.model, prompts, args.tokens, spec_type, args.threads, args.draft_max)
            rows.append(summarize(f"multiseq --spec-type {spec_type}", run, plain))
        if tools is not None:
            server_plain = run_server(tools, args.model, prompts, args.tokens, args.threads, None, args.draft_max)
            rows.append(summarize("llama-server", server_plain, server_plain))
            for spec_type in [name for name in args.server_spec.split(",") if name]:
                run = run_server(tools, args.model, prompts, args.tokens, args.threads, spec_type, args.draft_max)
                rows.append(summarize(f"llama-server --spec-type {spec_type}", run, server_plain))
        figures["edit"][sessions] = rows
    if args.chats:
        log(f"--- {args.chats} distinct chats, 128 tokens each")
        plain = run_chats(args.model, args.chats, "none", args.threads)
        spec = run_chats(args.model, args.chats, "ngram-mod", args.threads)
        figures["chats"] = [summarize("multiseq", plain, plain), summarize("multiseq --spec-type ngram-mod", spec, plain)]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
