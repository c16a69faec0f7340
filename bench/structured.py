"""Benchmark of structured output: constrained classification/extraction requests.

Usage (from the repository root, in the project's virtual environment):

    python bench/structured.py                          # Gemma3-270M, -np 16, 64 requests
    python bench/structured.py --systems multiseq,multiseq-free --prompts 16 --parallel 4
    python bench/structured.py --model smollm2-135m --prompts 4 --parallel 2 --max-tokens 16 \\
        --systems multiseq,multiseq-free                 # a quick end-to-end check

Every request asks the model to classify a short product review and extract a few fields, as
JSON under one schema (sentiment enum, product string, rating 1-5, up to three topics). The
chat prompts are rendered once with the model's template, so every system gets the same text.
Systems:

  multiseq        the requests with the schema (`SamplingParams(json_schema=...)`)
  multiseq-free   the same requests without it (unconstrained)
  llama-server    the same prompts with the same `json_schema` in each /completion body, at
                  -np N with N concurrent clients (built once from the pinned llama.cpp sources)

Greedy, no ignore_eos: each request ends when its document does (or at --max-tokens), so each
system's figure is its own generated tokens over its wall time. For every system the share of
outputs that ended by themselves and validate against the schema is reported (jsonschema).

Progress goes to stderr; one line per figure; the last line printed is one JSON object with
every figure and the ratios (constrained / unconstrained, multiseq / llama-server).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jsonschema

import peers  # bench/ is the script's own folder, first on sys.path

from multiseq import FinishReason, Request, Runner, RunnerConfig, SamplingParams
from multiseq.llama.backend import LlamaModel
from multiseq.loading import open_model

ALL_SYSTEMS = ("multiseq", "multiseq-free", "llama-server")
SLOT_CTX = 512
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["sentiment", "product", "rating", "topics"],
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "product": {"type": "string", "maxLength": 40},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "topics": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 20}},
    },
}
_PRODUCTS = ["coffee grinder", "rain jacket", "desk lamp", "hiking boots", "phone case", "kettle", "backpack",
             "bluetooth speaker", "yoga mat", "chef's knife", "office chair", "board game"]
_OPINIONS = ["broke after two days", "is exactly what I needed", "arrived late but works fine",
             "feels cheap and the color is wrong", "is quiet, sturdy and worth the price",
             "does the job, nothing special", "exceeded every expectation", "was returned the same week"]
_DETAILS = ["Shipping was fast.", "Customer service never answered.", "The manual is confusing.",
            "Battery life is great.", "It is heavier than it looks.", "My kids love it."]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def review_messages(count: int) -> list[tuple[dict, ...]]:
    """Deterministic chat requests: a system instruction and one review each."""
    system = {"role": "system", "content": "Extract from the review, as JSON: sentiment (positive, negative or "
                                           "neutral), product, rating (1-5) and up to three topics."}
    return [(system, {"role": "user", "content": f"Review: The {_PRODUCTS[index % len(_PRODUCTS)]} "
                                                 f"{_OPINIONS[(index * 5) % len(_OPINIONS)]}. "
                                                 f"{_DETAILS[(index * 7) % len(_DETAILS)]}"})
            for index in range(count)]


def validity(texts: list[str], ended: list[bool]) -> dict:
    """How many outputs ended by themselves, and how many of those validate."""
    valid = 0
    for text, is_ended in zip(texts, ended):
        if is_ended:
            try:
                jsonschema.validate(json.loads(text), SCHEMA)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    num_ended = sum(ended)
    return {"num_ended": num_ended, "num_valid": valid, "valid_share_of_ended": valid / num_ended if num_ended else None}


def run_multiseq(model: LlamaModel, prompts: list[str], constrained: bool, args: argparse.Namespace) -> dict:
    """The requests through a fresh runner, with or without the schema."""
    config = RunnerConfig(model=model.path, parallel=args.parallel, slot_ctx=SLOT_CTX,
                          n_batch=max(512, args.parallel), threads=args.threads, seed=0)
    schema = SCHEMA if constrained else None
    with Runner.on_model(model, config) as runner:
        warm_up = SamplingParams(max_tokens=4, temperature=0, json_schema=schema)  # builds the grammar tokenizer
        runner.run_batch([Request(prompt=prompts[0], sampling=warm_up)])
        runner.reset_stats()
        requests = [Request(prompt=prompt, id=f"s{index}", sampling=SamplingParams(
            max_tokens=args.max_tokens, temperature=0, json_schema=schema)) for index, prompt in enumerate(prompts)]
        started = time.perf_counter()
        results = runner.run_batch(requests)
        wall = time.perf_counter() - started
        stats = runner.stats()
    assert all(result.ok for result in results), [result.error for result in results if not result.ok]
    generated = sum(result.completion_tokens for result in results)
    ended = [result.finish_reason is FinishReason.STOP for result in results]
    phase_total = sum(stats.phase_seconds.values())
    return {"system": "multiseq" if constrained else "multiseq-free", "parallel": args.parallel,
            "num_requests": len(results), "generated_tokens": generated, "wall_s": wall,
            "tokens_per_s": generated / wall, "requests_per_s": len(results) / wall,
            "decode_tokens_per_s": stats.decode_tokens_per_s,
            "step_profile_share": {phase: seconds / phase_total for phase, seconds in stats.phase_seconds.items()},
            **validity([result.text for result in results], ended)}


def run_server(model: LlamaModel, prompts: list[str], args: argparse.Namespace) -> dict:
    tools = peers.ensure_llama_tools(log=log)
    figure = peers.run_llama_server(tools, model.path, prompts, args.max_tokens, args.parallel, args.threads,
                                    SLOT_CTX, {"temperature": 0.0}, log=log, extra_body={"json_schema": SCHEMA},
                                    ignore_eos=False)
    contents = figure.pop("texts")
    # A request that stopped before max_tokens ended by itself (EOS once the document was complete).
    figure["requests_per_s"] = len(prompts) / figure["wall_s"]
    return {**figure, **validity(contents, [True] * len(contents))}


def ratios(figures: dict[str, dict]) -> dict[str, float]:
    found = {}
    if "multiseq" in figures and "multiseq-free" in figures:
        found["constrained_vs_unconstrained_tokens_per_s"] = (figures["multiseq"]["tokens_per_s"]
                                                              / figures["multiseq-free"]["tokens_per_s"])
    if "multiseq" in figures and "llama-server" in figures:
        found["multiseq_vs_llama_server_tokens_per_s"] = (figures["multiseq"]["tokens_per_s"]
                                                         / figures["llama-server"]["tokens_per_s"])
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--parallel", type=int, default=16, help="slots for multiseq and llama-server")
    parser.add_argument("--prompts", type=int, default=64, help="requests")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    systems = args.systems.split(",")
    unknown = sorted(set(systems) - set(ALL_SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {', '.join(ALL_SYSTEMS)}")
    model = open_model(args.model)
    prompts = [model.render_chat(messages) for messages in review_messages(args.prompts)]
    figures: dict[str, dict] = {}
    try:
        for system in systems:
            log(f"[{args.model}] {system} -np {args.parallel}, {len(prompts)} requests ...")
            if system == "llama-server":
                figures[system] = run_server(model, prompts, args)
            else:
                figures[system] = run_multiseq(model, prompts, system == "multiseq", args)
            figure = figures[system]
            print(f"{args.model:13} {system:14} -np {args.parallel:<3} {figure['tokens_per_s']:7.1f} tok/s  "
                  f"{figure['requests_per_s']:6.2f} req/s  wall {figure['wall_s']:6.2f} s  "
                  f"ended {figure['num_ended']}/{len(prompts)}, valid {figure['num_valid']}", flush=True)
    finally:
        model.close()
    found = ratios(figures)
    for name, value in found.items():
        print(f"{args.model:13} {name}: {value:.2f}", flush=True)
    report = {"model": args.model, "parallel": args.parallel, "threads": args.threads, "max_tokens": args.max_tokens,
              "schema": SCHEMA, "figures": figures, "ratios": found}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
