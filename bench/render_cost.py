"""What rendering a chat costs: a 20-turn conversation with 20 tools, rendered as a request
through the server is (the body read by openai_body_item, the prompt rendered by the model's
ToolSupport), on several of the chat templates llama.cpp ships.

    python bench/render_cost.py [--model smollm2-135m] [--repeats 200] [--turns 20] [--tools 20]
        [--vs-llama-server]

Each template is rendered `repeats` times after a first render (which probes the template's
capabilities once); prints the median and 95th percentile per template and, last, one JSON line.
`--vs-llama-server` also times llama-server's /apply-template on the same body and template (30
requests after one; a round trip on loopback, where llama-server renders as it renders a chat:
its template analysis included, which it runs for every request).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import _free_port, _stop, ensure_llama_tools, start_server  # noqa: E402
from templates import post  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "tests" / "data" / "llama.cpp-templates"
MEASURED = ("Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja", "openai-gpt-oss-120b.jinja",
            "google-gemma-4-31B-it.jinja", "Qwen3-Coder.jinja", None)  # None: the model's own template


def tools(count: int) -> list[dict]:
    return [{"type": "function", "function": {
        "name": f"tool_{index}", "description": f"Tool number {index}: does one thing well. " * 4,
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "A file's path"},
            "limit": {"type": "integer", "description": "At most this many"},
            "flags": {"type": "array", "items": {"type": "string"}}}, "required": ["path"]}}}
        for index in range(count)]


def conversation(turns: int) -> list[dict]:
    """`turns` exchanges: a question, a call, its result, an answer, in turn."""
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent. " * 20}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Step {turn}: look at file_{turn}.py and fix it. " * 3})
        call = {"id": f"call_{turn}", "type": "function",
                "function": {"name": f"tool_{turn % 20}", "arguments": json.dumps({"path": f"file_{turn}.py"})}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": f"def f_{turn}():\n    pass\n" * 10})
        messages.append({"role": "assistant", "content": f"Fixed file_{turn}.py."})
    messages.append({"role": "user", "content": "Now run the tests."})
    return messages


def llama_server_median_ms(model_path: Path, template: Path, body: dict, requests: int = 30) -> float:
    server = ensure_llama_tools().server
    port = _free_port()
    with tempfile.TemporaryDirectory() as workdir:
        process, base = start_server([str(server), "-m", str(model_path), "--chat-template-file", str(template),
                                      "--port", str(port), "-c", "512", "-np", "1", "-t", "1", "--no-warmup"],
                                     Path(workdir) / "server.log", port)
        try:
            post(base, "/apply-template", body)
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                post(base, "/apply-template", body)
                times.append(time.perf_counter() - started)
        finally:
            _stop(process)
    return round(statistics.median(times) * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--tools", type=int, default=20)
    parser.add_argument("--vs-llama-server", action="store_true")
    args = parser.parse_args()

    from multiseq import models
    from multiseq.config import SamplingParams
    from multiseq.formats.reader import openai_body_item
    from multiseq.llama.backend import LlamaModel
    from multiseq.tools.support import ToolSupport

    model_path = models.resolve(args.model).path
    body = {"messages": conversation(args.turns), "tools": tools(args.tools)}
    figures = {}
    for name in MEASURED:
        template = str(TEMPLATES / name) if name else None
        model = LlamaModel(str(model_path), chat_template=template, vocab_only=True)
        support = ToolSupport(model.chat_template_source)
        request = openai_body_item("x", body, True, SamplingParams()).request
        prompt = support.render(model, request)  # the first render probes the template
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            request = openai_body_item("x", body, True, SamplingParams()).request
            support.render(model, request)
            times.append(time.perf_counter() - started)
        times.sort()
        label = name or f"{args.model}'s own"
        figures[label] = {"median_ms": round(statistics.median(times) * 1000, 3),
                          "p95_ms": round(times[int(len(times) * 0.95)] * 1000, 3), "prompt_chars": len(prompt)}
        print(f"{label:45s} median {figures[label]['median_ms']:6.2f} ms, p95 {figures[label]['p95_ms']:6.2f} ms, "
              f"{len(prompt)} characters", flush=True)
        model.close()
        if args.vs_llama_server and name:
            figures[label]["llama_server_median_ms"] = llama_server_median_ms(model_path, TEMPLATES / name, body)
            print(f"{'':45s} llama-server's /apply-template: median "
                  f"{figures[label]['llama_server_median_ms']:.2f} ms", flush=True)
    print(json.dumps({"turns": args.turns, "tools": args.tools, "templates": figures}))


if __name__ == "__main__":
    main()
