"""CanIToolCall's corpus (469 recorded outputs of 9 families) through multiseq's output reader.

Usage (from the repository root, in the project's virtual environment):

    python bench/toolcall_conformance.py              # the per-family table
    python bench/toolcall_conformance.py --family glm --show-failures

Each fixture is read the way the server reads a model's output: `multiseq.tools.read_output`
with the family the fixture's model would be detected as, the fixture's tools, and the
generation prompt its template ends with. Once whole, and streamed in pieces: split at the
family's markers (as special tokens arrive) and at seeded random points (1 to 8 characters,
three seeds); a stream's result is what an OpenAI client accumulates from the deltas.
CanIToolCall's own checks (expected parse, graceful errors, no marker leakage, JSON-object
arguments that fit the schema, call order, stream == non-stream, split invariance) give each
fixture its status: pass, soft pass (whitespace only), fail, or unsupported (no family).
tests/test_canitoolcall.py runs the same adapter, one test per fixture.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from canitoolcall import checks
from canitoolcall.fixtures import Family as CorpusFamily
from canitoolcall.fixtures import Fixture, load_families, load_fixtures
from canitoolcall.results import Observation, ParsedToolCall, ParseResult, Status, StreamAccumulator

from multiseq.tools import ArgumentsDelta, ReasoningDelta, TextDelta, Tool, ToolCallStart, output_parser
from multiseq.tools.families import family_names

# The corpus's family slugs, as multiseq names the formats.
FAMILY_OF = {"qwen3-hermes": "hermes", "qwen3-xml": "qwen3-xml", "gpt-oss": "gpt-oss", "deepseek": "deepseek",
             "kimi": "kimi", "glm": "glm", "llama": "llama3", "mistral": "mistral", "gemma4": "gemma4"}
RANDOM_SEEDS = (1, 2, 3)
MAX_PIECE = 8


@dataclass(frozen=True)
class Replay:
    """How to read one fixture: multiseq's family, the sub-format, the prompt's end."""

    family: str
    variant: str | None
    prompt: str
    tools: tuple[Tool, ...]


def replay_of(fixture: Fixture, families: dict[str, CorpusFamily]) -> Replay | None:
    """None when multiseq has no family for the fixture's format (unsupported)."""
    name = FAMILY_OF.get(fixture.family)
    if name not in family_names():
        return None
    corpus = families.get(fixture.family)
    reference = corpus.reference_for(fixture.reference_model) if corpus else None
    prompt = fixture.generation_prompt if fixture.generation_prompt is not None else (
        reference.default_generation_prompt if reference else "") or ""
    tools = tuple(Tool(spec["function"]["name"], spec["function"].get("description"),
                       spec["function"].get("parameters")) for spec in fixture.tools)
    return Replay(name, reference.variant if reference else None, prompt, tools)


def read(replay: Replay, pieces: list[str]) -> ParseResult:
    """The pieces through one output parser, accumulated as a client accumulates deltas."""
    parser = output_parser(replay.family, tools=replay.tools, prompt=replay.prompt, variant=replay.variant)
    accumulator = StreamAccumulator()
    try:
        for delta in [delta for piece in pieces for delta in parser.feed(piece)] + parser.close():
            if isinstance(delta, TextDelta):
                accumulator.add_content(delta.text)
            elif isinstance(delta, ReasoningDelta):
                accumulator.add_reasoning(delta.text)
            elif isinstance(delta, ToolCallStart):
                accumulator.add_tool_call(delta.index, name=delta.name)
            elif isinstance(delta, ArgumentsDelta):
                accumulator.add_tool_call(delta.index, arguments=delta.text)
    except Exception as error:  # a parser that raises is an outcome the checks judge
        return ParseResult(exception=f"{type(error).__name__}: {error}")
    return accumulator.result()


def whole(replay: Replay, fixture: Fixture) -> ParseResult:
    """The whole text at once, as the result (not the deltas) says."""
    parser = output_parser(replay.family, tools=replay.tools, prompt=replay.prompt, variant=replay.variant)
    try:
        parser.feed(fixture.raw_output)
        parser.close()
        parsed = parser.result()
    except Exception as error:
        return ParseResult(exception=f"{type(error).__name__}: {error}")
    return ParseResult(content=parsed.content, reasoning_content=parsed.reasoning,
                       tool_calls=tuple(ParsedToolCall(call.name, call.arguments) for call in parsed.tool_calls))


def split_at_markers(text: str, markers: list[str]) -> list[str]:
    """Every marker its own piece, and the text between markers one piece each."""
    if not markers:
        return [text]
    pattern = "(" + "|".join(re.escape(marker) for marker in sorted(markers, key=len, reverse=True)) + ")"
    return [piece for piece in re.split(pattern, text) if piece]


def split_at_random(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces, start = [], 0
    while start < len(text):
        size = rng.randint(1, MAX_PIECE)
        pieces.append(text[start:start + size])
        start += size
    return pieces


def stream_splits(fixture: Fixture, corpus: CorpusFamily | None) -> dict[str, list[str]]:
    markers = list(corpus.markers) if corpus else []
    splits = {"one": [fixture.raw_output], "special": split_at_markers(fixture.raw_output, markers)}
    splits.update({f"rand:{seed}:{MAX_PIECE}": split_at_random(fixture.raw_output, seed) for seed in RANDOM_SEEDS})
    return splits


def observe(fixture: Fixture, replay: Replay, corpus: CorpusFamily | None) -> Observation:
    streams = {name: read(replay, pieces) for name, pieces in stream_splits(fixture, corpus).items()}
    return Observation(nonstream=whole(replay, fixture), streams=streams)


def fixture_status(fixture: Fixture, families: dict[str, CorpusFamily]) -> tuple[Status, list[str]]:
    """The fixture's status and, when it does not pass, what failed."""
    replay = replay_of(fixture, families)
    if replay is None:
        return Status.UNSUPPORTED, [f"multiseq has no family for {fixture.family}"]
    corpus = families.get(fixture.family)
    rows = checks.run_checks(fixture, corpus, observe(fixture, replay, corpus))
    status = checks.case_status(rows)
    problems = [f"{row.check} [{row.strategy}]: {row.status.value} {row.detail or ''}".strip()
                for row in rows if row.status in (Status.FAIL, Status.ERROR)]
    return status, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", action="append", help="only this corpus family (repeatable)")
    parser.add_argument("--show-failures", action="store_true")
    args = parser.parse_args()
    families = load_families()
    table: dict[str, Counter] = {}
    for fixture in load_fixtures(families=args.family):
        status, problems = fixture_status(fixture, families)
        table.setdefault(fixture.family, Counter())[status] += 1
        if args.show_failures and status in (Status.FAIL, Status.ERROR):
            print(f"{fixture.id}:\n  " + "\n  ".join(problems), file=sys.stderr)
    order = (Status.PASS, Status.SOFT_PASS, Status.FAIL, Status.ERROR, Status.UNSUPPORTED)
    print("| family | fixtures | pass | soft pass | fail | error | unsupported |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    total = Counter()
    for family, counts in sorted(table.items()):
        total.update(counts)
        print(f"| {family} | {sum(counts.values())} | " + " | ".join(str(counts[status]) for status in order) + " |")
    print(f"| **all** | {sum(total.values())} | " + " | ".join(f"**{total[status]}**" for status in order) + " |")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
