"""A long call's arguments through the output reader, streamed as a server feeds it: how much of
the call is written before its arguments start to reach the client, and what reading it costs.

Usage (from the repository root, in the project's virtual environment):

    python bench/streamed_arguments.py [--chars 20000] [--piece 4] [--runs 5]

For each family whose long arguments stream (Hermes, Mistral's two forms, Llama 3, the generic
format, gpt-oss, Kimi K2, DeepSeek V3/R1, Phi-4-mini; and the parameter-block ones: Qwen3-Coder's qwen3-xml, MiniMax M2,
GLM, Kimi K3): one call writing a file of about --chars
characters (a `content` argument with quotes, newlines and non-ASCII text), fed to the reader in pieces of --piece characters (a token's text is about 4). Reported:
the characters of the output written when the first arguments delta came out, the number of
arguments deltas, and the reader's time for the whole output (the best of --runs). Run it on
the commit before a change to compare (the reader is the same entry point). The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

from multiseq.tools import ArgumentsDelta, Tool, ToolFormat
from multiseq.tools.reading import output_parser

FORMATS = {
    "hermes": (ToolFormat.HERMES, '<tool_call>\n{"name": "write_file", "arguments": ', "}\n</tool_call>"),
    "mistral": (ToolFormat.MISTRAL, '[TOOL_CALLS][{"name": "write_file", "arguments": ', "}]"),
    "llama3": (ToolFormat.LLAMA3, '{"name": "write_file", "parameters": ', "}"),
    "generic": (ToolFormat.GENERIC, '{"tool_calls": [{"name": "write_file", "arguments": ', "}]}"),
    "mistral-v11": (ToolFormat.MISTRAL, "[TOOL_CALLS]write_file[ARGS]", ""),
    "gpt-oss": ("gpt-oss", "<|channel|>commentary to=functions.write_file <|constrain|>json<|message|>", "<|call|>"),
    "kimi": ("kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0<|tool_call_argument_begin|>",
             "<|tool_call_end|><|tool_calls_section_end|>"),
    "deepseek": ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>write_file\n```json\n",
                 "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "phi4-mini": ("phi4-mini", '<|tool_call|>[{"name": "write_file", "arguments": ', "}]<|/tool_call|>"),
}
# Parameter-block families: the file's text as the value of their content parameter.
BLOCKS = {
    "qwen3-xml": ("<tool_call>\n<function=write_file>\n<parameter=path>\nmain.py\n</parameter>\n"
                  "<parameter=content>\n", "\n</parameter>\n</function>\n</tool_call>"),
    "minimax-m2": ('<minimax:tool_call>\n<invoke name="write_file">\n<parameter name="path">\nmain.py\n'
                   '</parameter>\n<parameter name="content">\n', "\n</parameter>\n</invoke>\n</minimax:tool_call>"),
    "glm": ("<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>main.py</arg_value>\n<arg_key>content</arg_key>\n"
            "<arg_value>", "</arg_value>\n</tool_call>"),
    # Kimi K3's XTML (the family tells it from its tokens): the think element closed, then the tools element.
    "kimi-k3": ('<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool="write_file" index="1"<|sep|>'
                '<|open|>argument key="path" type="string"<|sep|>main.py<|close|>argument<|sep|>'
                '<|open|>argument key="content" type="string"<|sep|>',
                "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"),
}
FAMILY_OF = {"kimi-k3": "kimi"}  # a block's reader, where its name is not its family's
TOOLS = (Tool("write_file", "Write a file", {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}}}),)


def file_text(chars: int) -> str:
    lines, total = [], 0
    while total < chars:
        line = f"print('line {len(lines)}: \"hello\" wörld')\n"
        lines.append(line)
        total += len(line)
    return "".join(lines)


def read(tool_format, text: str, piece: int) -> tuple[int | None, int, float]:
    """(characters written at the first arguments delta, arguments deltas, seconds)."""
    parser = output_parser(tool_format, tools=TOOLS)
    first, deltas = None, 0
    started = time.perf_counter()
    for start in range(0, len(text), piece):
        for delta in parser.feed(text[start:start + piece]):
            if isinstance(delta, ArgumentsDelta):
                deltas += 1
                first = start + piece if first is None else first
    for delta in parser.close():
        if isinstance(delta, ArgumentsDelta):
            deltas += 1
            first = len(text) if first is None else first
    return first, deltas, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--piece", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    arguments = json.dumps({"path": "main.py", "content": file_text(args.chars)}, ensure_ascii=False)
    summary = {}
    content = file_text(args.chars)
    outputs = {name: (tool_format, before + arguments + after) for name, (tool_format, before, after) in FORMATS.items()}
    outputs |= {name: (FAMILY_OF.get(name, name), before + content + after) for name, (before, after) in BLOCKS.items()}
    for name, (tool_format, text) in outputs.items():
        try:
            output_parser(tool_format)
        except ValueError:  # a family the tree measured does not have
            print(name, "unknown here", flush=True)
            continue
        runs = [read(tool_format, text, args.piece) for _ in range(args.runs)]
        first, deltas, _ = runs[0]
        seconds = min(run[2] for run in runs)
        summary[name] = {"output_chars": len(text), "chars_at_first_arguments": first, "arguments_deltas": deltas,
                         "reader_ms": round(seconds * 1000, 1),
                         "us_per_piece": round(seconds * 1e6 / -(-len(text) // args.piece), 2)}
        print(name, json.dumps(summary[name]), flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
