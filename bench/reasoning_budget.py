"""A reasoning budget against llama-server's, on a tiny model with a real reasoning template.

    python bench/reasoning_budget.py [--budget 32] [--threads 2]

The model is the tiny random-weight qwen2 with DeepSeek-R1-Distill-Qwen's vocabulary and chat
template (tests/tiny_models.py), the template as DeepSeek's later revision writes it: it opens
`<think>` for the model. A random model would think until max_tokens, so each answer's length
is the budget's doing. The same greedy chat goes to `multiseq serve --reasoning-budget N` through
Chat Completions, Responses and Messages (each also with the budget in the request, in its own
field), and to llama-server `--jinja --reasoning-budget N` through Chat Completions. Reported per
answer: its reasoning's tokens (counted by the server's own /tokenize: llama-server's reasoning
holds the template's "\n" after <think>, which both count toward the budget, as llama.cpp's
sampler counts the generation prompt), whether the reasoning and the answer are llama-server's to
the character, and the answer's start. Exit code 1 when a reasoning is longer than the budget or
either differs from llama-server's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from peers import _free_port, _stop, ensure_llama_tools, start_server  # noqa: E402
from tiny_models import deepseek_qwen_header, read_header, tiny_model_with_tokenizer_of  # noqa: E402

MULTISEQ = str(Path(sys.executable).parent / "multiseq")
QUESTION = "Is the sea salty? Think it through."
MAX_TOKENS = 96
SLOT_CTX = 1024


def post(base: str, path: str, body: dict, headers: dict | None = None) -> dict:
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def opening_template(model: Path) -> str:
    """DeepSeek R1's template, opening <think> for the model as its later revision does."""
    template = read_header(model).value("tokenizer.chat_template")
    opening = template.replace("{{'<｜Assistant｜>'}}{% endif %}", "{{'<｜Assistant｜><think>\\n'}}{% endif %}")
    assert opening != template, "the template's last line changed: update the replacement"
    return opening


def chat_body(budget: int | None) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True}
    return body if budget is None else body | {"reasoning_budget_tokens": budget}


def ask_chat(base: str, budget: int | None) -> tuple[str, str]:
    message = post(base, "/v1/chat/completions", chat_body(budget))["choices"][0]["message"]
    return message.get("reasoning_content") or "", message.get("content") or ""


def ask_responses(base: str, budget: int) -> tuple[str, str]:
    answer = post(base, "/v1/responses", {"model": "tiny", "input": QUESTION, "max_output_tokens": MAX_TOKENS,
                                          "temperature": 0, "ignore_eos": True, "thinking_token_budget": budget})
    reasoning = "".join(part["text"] for item in answer["output"] if item["type"] == "reasoning"
                        for part in item.get("content") or item.get("summary") or [])
    text = "".join(part["text"] for item in answer["output"] if item["type"] == "message" for part in item["content"])
    return reasoning, text


def ask_messages(base: str, budget: int) -> tuple[str, str]:
    answer = post(base, "/v1/messages", {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0,
                                         "messages": [{"role": "user", "content": QUESTION}],
                                         "thinking": {"type": "enabled", "budget_tokens": budget}},
                  {"anthropic-version": "2023-06-01"})
    reasoning = "".join(block["thinking"] for block in answer["content"] if block["type"] == "thinking")
    text = "".join(block["text"] for block in answer["content"] if block["type"] == "text")
    return reasoning, text


def count_tokens(base: str, text: str) -> int:
    return len(post(base, "/tokenize", {"content": text, "add_special": False})["tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    tools = ensure_llama_tools()
    answers: dict[str, tuple[str, str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="multiseq-budget-") as folder:
        workdir = Path(folder)
        model = tiny_model_with_tokenizer_of(deepseek_qwen_header(), workdir / "tiny-r1.gguf")
        template = workdir / "r1-opening.jinja"
        template.write_text(opening_template(model))
        common = ["-m", str(model), "-np", "1", "-t", str(args.threads), "-fa", "off", "--reasoning-budget",
                  str(args.budget)]
        port = _free_port()
        peer, base = start_server([str(tools.server), *common, "-c", str(SLOT_CTX), "-tb", str(args.threads),
                                   "--chat-template-file", str(template), "--jinja", "--no-webui", "--host", "127.0.0.1", "--port", str(port),
                                   "--log-verbosity", "2"], workdir / "llama-server.log", port)
        try:
            for name, budget in (("llama-server, Chat (--reasoning-budget)", None),
                                 ("llama-server, Chat (reasoning_budget_tokens)", args.budget)):
                reasoning, text = ask_chat(base, budget)
                answers[name] = (reasoning, text, count_tokens(base, reasoning))
        finally:
            _stop(peer)
        port = _free_port()
        ours, base = start_server([MULTISEQ, "serve", *common, "--alias", "tiny", "--chat-template", str(template),
                                   "--slot-ctx", str(SLOT_CTX), "--port", str(port)],
                                  workdir / "multiseq.log", port)
        try:
            for name, ask in (("multiseq, Chat (--reasoning-budget)", lambda: ask_chat(base, None)),
                              ("multiseq, Chat (reasoning_budget_tokens)", lambda: ask_chat(base, args.budget)),
                              ("multiseq, Responses (thinking_token_budget)", lambda: ask_responses(base, args.budget)),
                              ("multiseq, Messages (thinking.budget_tokens)", lambda: ask_messages(base, args.budget))):
                reasoning, text = ask()
                answers[name] = (reasoning, text, count_tokens(base, reasoning))
        finally:
            _stop(ours)
    sys.exit(report(answers, args.budget))


def report(answers: dict[str, tuple[str, str, int]], budget: int) -> int:
    reference, answer = answers["llama-server, Chat (--reasoning-budget)"][:2]
    print(f"{'server, API (budget from)':46} {'reasoning tokens':>16} {'= llama-server':>15} {'answer =':>9}  answer")
    failures = 0
    for name, (reasoning, text, tokens) in answers.items():
        same = reasoning.strip() == reference.strip()
        # Messages has no ignore_eos: its answer may end sooner; what it wrote must be the start of the others'.
        same_answer = answer.startswith(text) and bool(text) if "Messages" in name else text == answer
        failures += tokens > budget or not same or not same_answer
        print(f"{name:46} {tokens:>16} {str(same):>15} {str(same_answer):>9}  {json.dumps(text)[:40]}")
        if not same:
            mine, theirs = reasoning.strip(), reference.strip()
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
            print(f"{'':46} differs at character {at}: {json.dumps(mine[at:at + 30])} vs {json.dumps(theirs[at:at + 30])}")
    return 1 if failures else 0


if __name__ == "__main__":
    main()
