"""What verifying a draft costs on this machine: one llama_decode of a decoding slot's token and
k draft tokens (every one of them with a logits row) against a plain one-token step.

Usage (from the repository root, in the project's virtual environment):

    python bench/spec_cost.py                                  # SmolLM2 135M and Gemma 3 270M
    python bench/spec_cost.py --models smollm2-135m --slots 1,4 --max-draft 16 --repeats 9

For each model and each number of decoding slots (--slots), every slot holds the same
~1,000-token context (runner/loop/detok.py as a prompt). A step decodes one token per slot and, on
the first slot only, k draft tokens (k = 0..--max-draft); the draft positions are removed again
after each step (llama_memory_seq_rm), as a rejected draft is. The median decode time of
--repeats steps is reported per k, with its ratio to k = 0: the ceiling of speculation is the
number of tokens a step yields over that ratio (a verification that costs 1.3 steps and yields
4 tokens gives at most 3.1x).

A table is printed per model, then, as the last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from multiseq.llama.backend import LlamaBackend
from multiseq.llama.batch import BatchEntry
from multiseq.loading import open_model

CONTEXT_FILE = Path(__file__).resolve().parent.parent / "runner" / "loop" / "detok.py"


def step_seconds(backend: LlamaBackend, contexts: list[list[int]], num_drafted: int, repeats: int) -> float:
    """The median time of a step: one token per slot, slot 0's followed by num_drafted tokens."""
    times = []
    for _ in range(repeats):
        entries = []
        for slot, context in enumerate(contexts):
            extra = context[:num_drafted] if slot == 0 else []
            entries.append(BatchEntry(slot, [context[-1], *extra], len(context) - 1, True, len(extra)))
        started = time.perf_counter()
        backend.decode(entries)
        times.append(time.perf_counter() - started)
        for slot, context in enumerate(contexts):
            backend.rewind_slot(slot, len(context) - 1)  # the step's tokens go again, as a rejected draft's
    return statistics.median(times)


def measure(model_name: str, slot_counts: list[int], max_draft: int, repeats: int, threads: int) -> dict:
    model = open_model(model_name)
    context = model.tokenize(CONTEXT_FILE.read_text())[:1000]
    figures = {}
    try:
        for num_slots in slot_counts:
            backend = LlamaBackend(model, num_slots, 2048, 1024, threads)
            try:
                contexts = [context] * num_slots
                for slot in range(num_slots):
                    backend.decode([BatchEntry(slot, context[:-1], 0, False)])
                step_seconds(backend, contexts, 0, 2)  # warm up
                base = step_seconds(backend, contexts, 0, repeats)
                rows = {}
                for num_drafted in range(max_draft + 1):
                    seconds = base if num_drafted == 0 else step_seconds(backend, contexts, num_drafted, repeats)
                    rows[num_drafted] = {"ms": round(seconds * 1000, 2), "ratio": round(seconds / base, 3)}
                    print(f"{model_name} slots={num_slots} k={num_drafted:2d}: {seconds * 1000:7.2f} ms "
                          f"({seconds / base:.2f}x a plain step)", flush=True)
                figures[num_slots] = rows
            finally:
                backend.close()
    finally:
        model.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--slots", default="1,4", help="numbers of decoding slots, comma-separated")
    parser.add_argument("--max-draft", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    slot_counts = [int(count) for count in args.slots.split(",")]
    results = {name: measure(name, slot_counts, args.max_draft, args.repeats, args.threads)
               for name in args.models.split(",")}
    print(json.dumps({"bench": "spec_cost", "threads": args.threads, "context_tokens": 1000, "models": results}))


if __name__ == "__main__":
    main()
