"""Benchmark of where tokens are sampled: llama.cpp's sampler chains in the model's graph
(`--sampling backend`) against the host's numpy sampler (`--sampling host`), on a real model.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/sampling.py                                  # Gemma 3 270M, 16 slots, greedy
    python bench/sampling.py --model smollm2-135m --parallel 64 --prompts 64 --sampled
    python bench/sampling.py --quick                          # SmolLM2, 4 slots, a few tokens

`--prompts` distinct short prompts (bench/workloads.py's short_prompts) run through one Runner
per path, all submitted at once, exactly `--max-tokens` each (ignore_eos: the end tokens go
to the chain as a -inf bias, so both paths do the same work); each path runs
`--repeats` times, the two alternating, the model loaded once. Reported per path: the median
generated tokens/s over the repeats, and whether every path wrote the same text (greedy: it
must; sampled with a seed: each path repeats itself, the two paths draw with different
generators). The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from workloads import short_prompts  # bench/ is the script's own folder, first on sys.path

from multiseq import Request, Runner, RunnerConfig, SamplingParams
from multiseq.loading import open_model

PATHS = ("host", "backend")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    if args.sampled:
        return SamplingParams(max_tokens=args.max_tokens, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1,
                              ignore_eos=True)
    return SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)


def run_once(model, path: str, prompts: list[str], args: argparse.Namespace) -> tuple[float, list[str], int]:
    """One path's run: generated tokens/s, the texts in prompt order, the tokens generated."""
    config = RunnerConfig(model=model.path, parallel=args.parallel, slot_ctx=args.slot_ctx, n_batch=args.n_batch,
                          threads=args.threads, seed=0, sampling=path)
    params = sampling_params(args)
    with Runner.on_model(model, config) as runner:
        runner.run_batch([Request(prompt=prompts[0], sampling=SamplingParams(max_tokens=2, temperature=0))])  # warm-up
        started = time.perf_counter()
        results = runner.run_batch([Request(prompt=prompt, id=str(index), sampling=params)
                                    for index, prompt in enumerate(prompts)])
        wall = time.perf_counter() - started
    generated = sum(result.completion_tokens for result in results)
    return generated / wall, [result.text for result in sorted(results, key=lambda result: int(result.id))], generated


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--slot-ctx", type=int, default=512)
    parser.add_argument("--n-batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sampled", action="store_true", help="temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, "
                                                               "seed 1 (default: greedy)")
    parser.add_argument("--quick", action="store_true", help="SmolLM2, 4 slots, 4 prompts, 8 tokens, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.parallel, args.prompts, args.max_tokens, args.repeats = "smollm2-135m", 4, 4, 8, 1
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    prompts = short_prompts(args.prompts)
    model = open_model(args.model)
    try:
        rates: dict[str, list[float]] = {path: [] for path in PATHS}
        texts: dict[str, list[list[str]]] = {path: [] for path in PATHS}
        for repeat in range(args.repeats):
            for path in PATHS:
                rate, outputs, generated = run_once(model, path, prompts, args)
                rates[path].append(rate)
                texts[path].append(outputs)
                log(f"[{args.model}] repeat {repeat + 1}: {path:7} {rate:7.1f} tok/s ({generated} tokens)")
    finally:
        model.close()
    medians = {path: statistics.median(values) for path, values in rates.items()}
    figures = {
        "model": args.model, "parallel": args.parallel, "prompts": args.prompts, "max_tokens": args.max_tokens,
        "sampling": "sampled" if args.sampled else "greedy", "repeats": args.repeats, "threads": args.threads,
        "tokens_per_s": medians, "runs": rates,
        "backend_vs_host": medians["backend"] / medians["host"],
        "each_path_repeats_itself": all(len({json.dumps(run) for run in texts[path]}) == 1 for path in PATHS),
        "paths_write_the_same_text": texts["host"][0] == texts["backend"][0],
    }
    print(f"{args.model} -np {args.parallel} {figures['sampling']}: host {medians['host']:.1f} tok/s, "
          f"backend {medians['backend']:.1f} tok/s ({figures['backend_vs_host']:.3f}x), same text on both paths: "
          f"{figures['paths_write_the_same_text']}, each path repeats itself: {figures['each_path_repeats_itself']}")
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
