"""Reader benchmark: what reading a model's output into content, reasoning and calls costs, per
family, per piece, as the output grows.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/readers.py                                  # every family, 32,000 pieces
    python bench/readers.py --families qwen3-xml,gpt-oss --pieces 2000,8000,32000
    python bench/readers.py --text content                   # prose that is content, not reasoning
    python bench/readers.py --text call                      # one long call (a file written as an argument)

Each family's reader (`multiseq.tools.output_parser`, the one the engine feeds) is fed an output
of N pieces of 5 characters: prose with a newline every 80 characters, holding none of the
family's markers. With `--text reasoning` (the default) the prompt opened the family's
reasoning block, so the whole output is reasoning (families without reasoning read it as
content); with `--text content` the reasoning is left closed. With `--text call`, the output is
one call in the family's own syntax (the one its grammar writes; for the JSON-call formats, the
one their templates write), its content argument the prose: what an agent writing a file costs.

Every feed is timed on its own (time.perf_counter_ns). Reported per family and length: the
median and the 99th percentile of the last quarter's feeds (where a reader that re-reads the
whole text is slowest), the slowest feed, and the whole output's time (feeds and close).
The targets (issue 53): median <= 20 us, p99 <= 200 us, 32,000 pieces in <= 1 s.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from multiseq.tools import Tool  # noqa: E402
from multiseq.tools.families import all_families  # noqa: E402
from multiseq.tools.reading import output_parser  # noqa: E402
from multiseq.tools.writing import written  # noqa: E402

PIECE_CHARS = 5
LINE_CHARS = 80
WORDS = ("the", "model", "reads", "every", "piece", "of", "text", "once", "and", "settles", "what", "it", "can",
         "while", "a", "long", "answer", "grows", "line", "after", "line", "without", "markers", "in", "it")
TOOL = Tool("write_file", "Write a file.", {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]})


def prose(num_chars: int) -> str:
    """Words, a newline every LINE_CHARS characters, no marker of any family."""
    out: list[str] = []
    line = length = index = 0
    while length < num_chars:
        word = WORDS[index % len(WORDS)] + " "
        index += 1
        if line + len(word) > LINE_CHARS:
            out.append("\n")
            line, length = 0, length + 1
        out.append(word)
        line, length = line + len(word), length + len(word)
    return "".join(out)[:num_chars]


def call_text(family, body: str) -> str | None:
    """One call of write_file with `body` as its content, in the family's own call syntax (the
    one its grammar writes) or, for the JSON-call formats, as their templates write it; None
    for a family with neither."""
    arguments = {"path": "notes.txt", "content": body}
    legacy = {"hermes": lambda: f"<tool_call>\n{json.dumps({'name': TOOL.name, 'arguments': arguments})}\n</tool_call>",
              "llama3": lambda: f"<|python_tag|>{json.dumps({'name': TOOL.name, 'parameters': arguments})}",
              "mistral": lambda: f"[TOOL_CALLS]{TOOL.name}[ARGS]{json.dumps(arguments)}",
              "generic": lambda: json.dumps({"tool_calls": [{"name": TOOL.name, "arguments": arguments}]})}
    if family.name in legacy:
        return legacy[family.name]()
    syntax = family.call_syntax or next(iter(family.variant_call_syntax.values()), None)
    return None if syntax is None else written(syntax, [(TOOL.name, arguments)])


def output_for(family, kind: str, num_pieces: int) -> tuple[str, str] | None:
    """(the output, the prompt's end) for one run; None where the family has no such output."""
    text = prose(num_pieces * PIECE_CHARS)
    if kind == "call":
        written = call_text(family, text)
        return None if written is None else (written, "")
    opener = family.reasoning[0] if kind == "reasoning" and family.reasoning else ""
    return text, opener


def time_reader(family, output: str, prompt: str) -> dict:
    parser = output_parser(family, tools=[TOOL], prompt=prompt, reasons=True if prompt else None,
                           call_id=lambda index: f"call_{index}")
    pieces = [output[start:start + PIECE_CHARS] for start in range(0, len(output), PIECE_CHARS)]
    times = []
    clock = time.perf_counter_ns
    started = clock()
    for piece in pieces:
        before = clock()
        parser.feed(piece)
        times.append(clock() - before)
    parser.close()
    total = clock() - started
    result = parser.result()
    last_quarter = sorted(times[len(times) * 3 // 4:])
    return {"pieces": len(pieces), "median_us": statistics.median(last_quarter) / 1e3,
            "p99_us": last_quarter[int(len(last_quarter) * 0.99)] / 1e3, "max_us": max(times) / 1e3,
            "total_s": total / 1e9, "calls": len(result.tool_calls),
            "read": len(result.content or "") + len(result.reasoning or "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="", help="comma-separated family names (default: every family)")
    parser.add_argument("--pieces", default="32000", help="comma-separated output lengths in pieces")
    parser.add_argument("--text", choices=("reasoning", "content", "call"), default="reasoning")
    args = parser.parse_args()
    wanted = [name for name in args.families.split(",") if name]
    families = [family for family in all_families() if not wanted or family.name in wanted]
    lengths = [int(value) for value in args.pieces.split(",")]
    figures = []
    print("| family | pieces | median us | p99 us | max us | total s |")
    print("|---|---:|---:|---:|---:|---:|")
    for family in sorted(families, key=lambda family: family.name):
        for length in lengths:
            made = output_for(family, args.text, length)
            if made is None:
                continue
            figure = {"family": family.name, "text": args.text, **time_reader(family, *made)}
            figures.append(figure)
            print(f"| {family.name} | {figure['pieces']:,} | {figure['median_us']:.1f} | {figure['p99_us']:.1f} | "
                  f"{figure['max_us']:.0f} | {figure['total_s']:.2f} |", flush=True)
    print(json.dumps({"readers": figures}))


if __name__ == "__main__":
    main()
