"""Chat rendering against llama-server: every chat template llama.cpp ships, on the same
conversations, through multiseq's rendering and llama-server's `/apply-template`.

    python bench/templates.py [--model smollm2-135m] [--templates DIR] [--only NAME]
        [--record tests/data/llama-server-renderings.json] [--show-diffs]

llama-server (built from the pinned sources by bench/peers.py) is started once per template with
`--chat-template-file` on the model (its BOS and EOS texts are the template's); each conversation
(CONVERSATIONS: one user message, system and user, several turns, a tool call and its result,
enable_thinking true and false, tools offered, a developer message, a reasoning turn, a turn of
a call with its reasoning, two calls answered out of order, text parts) is posted to its /apply-template. multiseq renders the same body as its /apply-template
does: the body read by the same translator as a chat (openai_body_item), the prompt rendered by
the model's ToolSupport. A template llama-server cannot load is reported as such.

`--record` writes llama-server's prompts (by their SHA-256) or errors per template and
conversation, and its capabilities of each template, with the date they were rendered on, for
tests/test_template_parity.py. Prints a table (template: same /
differs, the conversations that differ) and, last, one JSON line of the counts.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import hashlib
import json
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import _free_port, _stop, ensure_llama_tools, start_server  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "tests" / "data" / "llama.cpp-templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CALL_2 = {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
TURNS = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Who wrote Hamlet?"}]

# name -> a Chat Completions body (the fields /apply-template reads)
CONVERSATIONS: dict[str, dict] = {
    "user": {"messages": [{"role": "user", "content": "Who wrote Hamlet?"}]},
    "system_user": {"messages": [{"role": "system", "content": "You are a terse assistant."},
                                 {"role": "user", "content": "Who wrote Hamlet?"}]},
    "turns": {"messages": TURNS},
    "tool_call": {"messages": [{"role": "user", "content": "Weather in Paris?"},
                               {"role": "assistant", "content": None, "tool_calls": [CALL]},
                               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}],
                  "tools": [WEATHER]},
    "thinking_on": {"messages": TURNS, "chat_template_kwargs": {"enable_thinking": True}},
    "thinking_off": {"messages": TURNS, "chat_template_kwargs": {"enable_thinking": False}},
    "tools": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]},
    "developer": {"messages": [{"role": "developer", "content": "Answer in French."},
                               {"role": "user", "content": "Who wrote Hamlet?"}]},
    "reasoning": {"messages": [{"role": "user", "content": "2+2?"},
                               {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
                               {"role": "user", "content": "3+3?"}]},
    "reasoning_call": {"messages": [{"role": "user", "content": "Weather in Paris?"},
                                    {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL],
                                     "reasoning_content": "The user wants the weather."},
                                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}],
                       "tools": [WEATHER]},
    "two_calls": {"messages": [{"role": "user", "content": "Weather in Paris and Rome?"},
                               {"role": "assistant", "content": None, "tool_calls": [CALL, CALL_2]},
                               {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
                               {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"sunny\"}"},
                               {"role": "assistant", "content": "Sunny in Paris, rain in Rome."},
                               {"role": "user", "content": "Thanks!"}],
                  "tools": [WEATHER]},
    "parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Who wrote"},
                                                        {"type": "text", "text": "Hamlet?"}]}]},
}


def post(base: str, path: str, body: dict, timeout: float = 60) -> dict:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        text = error.read().decode("utf-8", "replace")
        try:
            return {"error": json.loads(text).get("error", {}).get("message", text)}
        except ValueError:
            return {"error": text}


def llama_server_renderings(server: Path, model_path: Path, template: Path, workdir: Path) -> dict[str, dict]:
    """Each conversation's prompt ({"prompt"}) or error ({"error"}) from llama-server, or
    {"load_error"} for every conversation when the server does not start with the template."""
    port = _free_port()
    log = workdir / f"{template.stem}.log"
    command = [str(server), "-m", str(model_path), "--chat-template-file", str(template), "--port", str(port),
               "-c", "512", "-np", "1", "-t", "1", "--no-warmup"]
    try:
        process, base = start_server(command, log, port, timeout_s=120)
    except SystemExit as error:
        return {name: {"load_error": str(error).splitlines()[-1][:300]} for name in CONVERSATIONS}
    try:
        renderings = {name: post(base, "/apply-template", body) for name, body in CONVERSATIONS.items()}
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(base + "/props", timeout=60) as response:
            renderings["caps"] = json.loads(response.read())["chat_template_caps"]
        return renderings
    finally:
        _stop(process)


def multiseq_renderings(model_path: Path, template: Path,
                        now: datetime.datetime | None = None) -> dict[str, dict]:
    """Each conversation's prompt or error as multiseq's /apply-template gives it."""
    from multiseq.config import SamplingParams
    from multiseq.formats.fields import ItemError
    from multiseq.formats.reader import openai_body_item
    from multiseq.errors import BackendError
    from multiseq.llama.backend import LlamaModel
    from multiseq.tools.support import ToolSupport

    try:
        model = LlamaModel(str(model_path), chat_template=str(template), vocab_only=True)
    except BackendError as error:
        return {name: {"load_error": str(error)} for name in CONVERSATIONS}
    support = ToolSupport(model.chat_template_source)
    renderings: dict[str, dict] = {}
    for name, body in CONVERSATIONS.items():
        try:
            request = openai_body_item("x", body, True, SamplingParams()).request
            renderings[name] = {"prompt": support.render(model, request, now=now)}
        except (ItemError, ValueError, BackendError) as error:
            renderings[name] = {"error": str(error)}
    renderer = model._jinja_renderer(model.chat_template) if model.chat_template.jinja_source else None
    renderings["caps"] = vars(renderer.caps) if renderer is not None and renderer.caps is not None else {}
    model.close()
    return renderings


def digest(rendering: dict) -> dict:
    """A rendering as recorded: a prompt by its SHA-256 and length (the whole texts come to
    0.8 MB), an error or the capabilities as they are."""
    if "prompt" not in rendering:
        return rendering
    prompt = rendering["prompt"]
    return {"sha256": hashlib.sha256(prompt.encode("utf-8")).hexdigest(), "chars": len(prompt)}


def verdict(theirs: dict, ours: dict) -> str:
    if "load_error" in theirs:
        return "llama-server does not load it"
    if "prompt" in theirs and "prompt" in ours:
        return "same" if theirs["prompt"] == ours["prompt"] else "differs"
    if "error" in theirs and "error" in ours:
        return "both refuse"
    return "only llama-server refuses" if "error" in theirs else "only multiseq refuses"


def show_diff(theirs: dict, ours: dict) -> str:
    a = theirs.get("prompt", f"<error: {theirs.get('error')}>")
    b = ours.get("prompt", f"<error: {ours.get('error')}>")
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), "llama-server", "multiseq", n=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--templates", type=Path, default=TEMPLATES)
    parser.add_argument("--only", help="templates whose file name holds this text")
    parser.add_argument("--record", type=Path, help="write llama-server's renderings here (JSON)")
    parser.add_argument("--show-diffs", action="store_true")
    args = parser.parse_args()

    from multiseq import models

    model_path = models.resolve(args.model).path
    server = ensure_llama_tools().server
    templates = sorted(path for path in args.templates.glob("*.jinja") if not args.only or args.only in path.name)
    recorded: dict[str, dict] = {}
    counts: dict[str, int] = {}
    today = datetime.datetime.now()
    with tempfile.TemporaryDirectory() as workdir:
        for template in templates:
            theirs = llama_server_renderings(server, model_path, template, Path(workdir))
            ours = multiseq_renderings(model_path, template, now=today)
            recorded[template.name] = theirs
            verdicts = {name: verdict(theirs[name], ours[name]) for name in CONVERSATIONS}
            differing = [name for name, word in verdicts.items() if word not in ("same", "both refuse")]
            if "caps" in theirs and "caps" in ours and theirs["caps"] != ours["caps"]:
                differing.append("caps (" + ", ".join(sorted(key for key in theirs["caps"]
                                                              if theirs["caps"][key] != ours["caps"].get(key))) + ")")
            overall = ("llama-server does not load it" if all("load_error" in r for r in theirs.values())
                       else "same" if not differing else "differs")
            counts[overall] = counts.get(overall, 0) + 1
            detail = ", ".join(f"{name} ({verdicts[name]})" if name in verdicts else name for name in differing)
            print(f"{template.name:55s} {overall}{': ' + detail if detail else ''}", flush=True)
            if args.show_diffs:
                for name in (name for name in differing if name in verdicts):
                    print(f"--- {name}\n{show_diff(theirs[name], ours[name])}")
    if args.record:
        args.record.write_text(json.dumps({
            "rendered_on": today.strftime("%Y-%m-%d"), "model": args.model, "conversations": CONVERSATIONS,
            "renderings": {template: {name: digest(rendering) for name, rendering in renderings.items()}
                           for template, renderings in recorded.items()}}, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({"templates": len(templates), **counts}))


if __name__ == "__main__":
    main()
