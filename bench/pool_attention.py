"""What a shared KV pool costs attention on this machine: the same four conversations held in a
window per slot, or in one pool (llama.cpp's unified KV) laid out as continuous batching
writes them (the sequences' tokens in neighbouring cells, step after step) or each in one run.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/pool_attention.py
    python bench/pool_attention.py --model gemma3-270m --history 3000 --rounds 8

Each of --slots sequences holds --history tokens (runner/loop/engine.py as text, each from its own
offset): a 500-token prompt computed alone, then the rest decoded together --interleave
tokens per sequence per step (1: as decoding writes them). In the "pool, one run each" layout
the rest is computed sequence by sequence instead. Then, alternating between the three
contexts for --rounds rounds, the median time of:

- a decoding step: one token for every sequence (the step of a busy server between prompts);
- a prompt chunk: 96 tokens for one sequence (a new user turn over its conversation).

Why the layouts differ: in ggml-cpu's flash attention a query row with few rows beside it
reads the mask of every cell up to the highest one in use and skips the masked ones one by
one, so in a pool each decoding row walks the other sequences' cells too (a window holds only
its own); a chunk of 64 or more rows is computed in tiles, and a tile of 64 cells is skipped
only when none of them is the chunk's sequence's, which interleaved cells never are.

A table, then one JSON object as the last line.
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

TEXT_FILE = Path(__file__).resolve().parent.parent / "runner" / "loop" / "engine.py"
PROMPT_TOKENS = 500
CHUNK_TOKENS = 96
LAYOUTS = ("windows", "pool, interleaved", "pool, one run each")


def filled_backend(model, layout: str, histories: list[list[int]], window: int, interleave: int,
                   threads: int) -> LlamaBackend:
    """A context holding every history in the given layout."""
    slots = len(histories)
    pool = None if layout == "windows" else slots * window
    backend = LlamaBackend(model, slots, window, 512, threads, pool_tokens=pool)
    for slot, history in enumerate(histories):
        for start in range(0, PROMPT_TOKENS, 256):
            backend.decode([BatchEntry(slot, history[start:min(PROMPT_TOKENS, start + 256)], start, False)])
    length = len(histories[0])
    if layout == "pool, one run each":
        for slot, history in enumerate(histories):
            for start in range(PROMPT_TOKENS, length, 256):
                backend.decode([BatchEntry(slot, history[start:start + 256], start, False)])
    else:
        for start in range(PROMPT_TOKENS, length, interleave):
            backend.decode([BatchEntry(slot, history[start:start + interleave], start, False)
                            for slot, history in enumerate(histories)])
    return backend


def timed(backend: LlamaBackend, entries: list[BatchEntry]) -> float:
    """One decode's seconds; its tokens are removed again after it."""
    started = time.perf_counter()
    backend.decode(entries)
    seconds = time.perf_counter() - started
    for entry in entries:
        backend.rewind_slot(entry.slot, entry.start_pos)
    return seconds


def measure(args) -> dict:
    model = open_model(args.model)
    text = model.tokenize(TEXT_FILE.read_text())
    if len(text) < args.history + 50 * args.slots:
        raise SystemExit(f"{TEXT_FILE} is {len(text)} tokens: too short for --history {args.history}")
    histories = [text[slot * 50:slot * 50 + args.history] for slot in range(args.slots)]
    backends = {layout: filled_backend(model, layout, histories, args.window, args.interleave, args.threads)
                for layout in LAYOUTS}
    step = [BatchEntry(slot, [history[-1]], args.history, True) for slot, history in enumerate(histories)]
    chunk = [BatchEntry(0, histories[1][:CHUNK_TOKENS], args.history, True)]
    times: dict[str, dict[str, list[float]]] = {layout: {"step": [], "chunk": []} for layout in LAYOUTS}
    for _ in range(args.rounds):
        for layout, backend in backends.items():
            times[layout]["step"] += [timed(backend, step) for _ in range(8)]
            times[layout]["chunk"].append(timed(backend, chunk))
    for backend in backends.values():
        backend.close()
    model.close()
    return {layout: {kind: round(1000 * statistics.median(values), 1) for kind, values in kinds.items()}
            for layout, kinds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--history", type=int, default=2000, help="tokens each sequence holds")
    parser.add_argument("--interleave", type=int, default=1, help="tokens per sequence per decoding step")
    parser.add_argument("--window", type=int, default=4096, help="a slot's window; the pool holds --slots of them")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    figures = measure(args)
    windows = figures["windows"]
    print(f"{args.model}, {args.slots} sequences of {args.history} tokens, median ms "
          f"(ratio to windows):")
    print(f"{'layout':<20} {'decoding step':>18} {f'{CHUNK_TOKENS}-token chunk':>20}")
    for layout, figure in figures.items():
        print(f"{layout:<20} {figure['step']:>9} ({figure['step'] / windows['step']:.2f}x) "
              f"{figure['chunk']:>10} ({figure['chunk'] / windows['chunk']:.2f}x)")
    print(json.dumps({"model": args.model, "slots": args.slots, "history": args.history,
                      "interleave": args.interleave, "threads": args.threads, "ms": figures}))


if __name__ == "__main__":
    main()
