"""Benchmark of tool calling in the engine: what a request's tools cost, and whether calls are valid.

Usage (from the repository root, in the project's virtual environment):

    python bench/tools.py                                   # SmolLM2, 100 tools, -np 4
    python bench/tools.py --model gemma3-270m --tools 10 --requests 8

Three ways to send the same chat at -np N, N requests at once, greedy:

  no-tools    the chat alone
  tools-none  the chat with --tools tool definitions and tool_choice "none": the same prompt as
              below (the tools are described in it), no grammar
  tools-auto  the same with tool_choice "auto": the tools' grammar is live at every step (free
              text until the model starts a call)
  required    tool_choice "required": every output is a call, constrained from its first token

For each: decode tokens/s (generated tokens after the first, over the time since the first; the
median over the requests), the wall time, and for `required` the share of outputs whose calls
all parse and validate against their tool's parameters (jsonschema). tools-auto against
tools-none is what the grammar costs a decode step; against no-tools, what the longer prompt
costs besides. The tools' prompt is computed once before the timed ways (its prefix is then
reused by every request), so each decode rate is decode alone. Without --ignore-eos-off the
text ways ignore EOS, so they generate exactly --max-tokens tokens each.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jsonschema

from workloads import agent_tools

from multiseq import Request, Runner, RunnerConfig, SamplingParams
from multiseq.formats.tool_fields import tool_overrides

QUESTION = "Write a short story about a lighthouse keeper who finds a message in a bottle."
CALL_QUESTION = "Read the file src/config.py and tell me which keys it expects."


def requests_for(way: str, tools: list[dict], count: int, max_tokens: int, ignore_eos: bool) -> list[Request]:
    question = CALL_QUESTION if way == "required" else QUESTION
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos and way != "required")
    fields = {} if way == "no-tools" else tool_overrides(
        {"tools": tools, "tool_choice": way.removeprefix("tools-")})
    return [Request(messages=[{"role": "user", "content": question}], id=f"{way}-{index}", sampling=sampling,
                    **fields) for index in range(count)]


def calls_validate(result, tools: list[dict]) -> bool:
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    try:
        return bool(result.tool_calls) and all(
            call.name in schemas and jsonschema.Draft202012Validator(schemas[call.name]).is_valid(
                json.loads(call.arguments)) for call in result.tool_calls)
    except ValueError:
        return False


def run_way(runner: Runner, way: str, tools: list[dict], args) -> dict:
    requests = requests_for(way, tools, args.requests, args.max_tokens, not args.ignore_eos_off)
    started = time.perf_counter()
    results = runner.run_batch(requests)
    wall_s = time.perf_counter() - started
    failed = [result.error for result in results if not result.ok]
    if failed:
        raise SystemExit(f"{way}: {len(failed)} requests failed: {failed[0]}")
    rates = [result.timings.decode_tokens_per_s for result in results if result.timings.decode_tokens_per_s]
    figure = {"way": way, "wall_s": round(wall_s, 3), "decode_tokens_per_s_median": round(statistics.median(rates), 2),
              "generated_tokens": sum(result.completion_tokens for result in results),
              "prompt_tokens": results[0].prompt_tokens,
              "ttft_max_s": round(max(result.timings.ttft_s for result in results), 3)}
    if way == "required":
        figure["valid_calls"] = sum(calls_validate(result, tools) for result in results)
        figure["outputs"] = len(results)
    return figure


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tools", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--slot-ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ways", default="no-tools,tools-none,tools-auto,required")
    parser.add_argument("--ignore-eos-off", action="store_true", help="let text end at EOS")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    tools = agent_tools(args.tools)
    config = RunnerConfig(model=args.model, parallel=args.parallel, slot_ctx=args.slot_ctx, threads=args.threads,
                          n_batch=512, seed=1)
    figures = []
    with Runner(config) as runner:
        # The tools' prompt computed once before the timed ways, so that each way's decode
        # rate is a decode rate (not shared with another way's prefill of the same prompt).
        runner.run_batch(requests_for("tools-none", tools, 1, 1, False))
        for way in args.ways.split(","):
            print(f"[{way}] {args.requests} requests, {args.tools} tools ...", file=sys.stderr)
            figure = run_way(runner, way, tools, args)
            figures.append(figure)
            print("  " + json.dumps(figure), file=sys.stderr)
    by_way = {figure["way"]: figure for figure in figures}
    ratios = {}
    for way, base in (("tools-auto", "tools-none"), ("tools-auto", "no-tools"), ("required", "tools-none")):
        if way in by_way and base in by_way:
            ratios[f"{way}/{base} decode"] = round(by_way[way]["decode_tokens_per_s_median"]
                                                   / by_way[base]["decode_tokens_per_s_median"], 3)
    report = {"model": args.model, "tools": args.tools, "parallel": args.parallel, "figures": figures,
              "ratios": ratios}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
