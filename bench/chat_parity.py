"""Greedy chat answers against llama-server's: the same 16 chats through `multiseq serve`, through
llama-server (the model's Jinja template, as it renders by default) and through `multiseq
batch-run`, temperature 0, on the same model.

    python bench/chat_parity.py [--model smollm2-135m] [--max-tokens 48] [--parallel 1] [--threads 2]

llama-server (built from the pinned sources by bench/peers.py) gets the model's own template: the
GGUF's, or for a registry model whose GGUF has none, the Jinja file multiseq uses for it
(--chat-template-file). Both servers run -np PARALLEL with flash attention off and a full-size
sliding-window cache (llama-server's --swa-full, multiseq's default: with llama-server's smaller
one Gemma's attention runs over another cache size, and 5 of 16 greedy answers part on near-tied
logits from the same prompt tokens); the chats are sent one at a time, so each is computed alone
on both. Each chat's prompt tokens (usage) and
answer are compared; batch-run runs the same chats from a file with the same settings. Prints a
line per chat and, last, one JSON line of the counts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import _free_port, _stop, ensure_llama_tools, start_server  # noqa: E402
from templates import post  # noqa: E402

QUESTIONS = [
    "Who wrote Hamlet?", "What is the capital of France?", "Name three primary colors.",
    "How many legs does a spider have?", "What is 12 times 12?", "Translate 'good morning' into Spanish.",
    "Give me a synonym for 'happy'.", "What gas do plants take in?", "Write a haiku about the sea.",
    "What is the boiling point of water in Celsius?", "Who painted the Mona Lisa?",
    "List two uses of a paperclip.", "What does CPU stand for?", "Suggest a name for a pet turtle.",
    "What is the largest planet in the solar system?", "Say hello in French.",
]
SYSTEM = "You are a helpful assistant. Answer in one sentence."


def chats() -> list[list[dict]]:
    """16 chats: plain questions, half of them under a system message, two with a past turn."""
    conversations = []
    for index, question in enumerate(QUESTIONS):
        messages = [{"role": "user", "content": question}]
        if index % 2:
            messages.insert(0, {"role": "system", "content": SYSTEM})
        if index % 8 == 3:
            messages[-1:-1] = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello!"}]
        conversations.append(messages)
    return conversations


def answers(base: str, conversations: list[list[dict]], max_tokens: int) -> list[dict]:
    found = []
    for messages in conversations:
        reply = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens,
                                                    "temperature": 0, "top_k": 1, "seed": 1})
        if "error" in reply:
            found.append({"error": str(reply["error"])[:200]})
            continue
        found.append({"text": reply["choices"][0]["message"].get("content") or "",
                      "prompt_tokens": reply["usage"]["prompt_tokens"]})
    return found


def batch_run(model: str, conversations: list[list[dict]], args: argparse.Namespace, workdir: Path) -> list[dict]:
    prompts, results = workdir / "chats.jsonl", workdir / "results.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(index), "messages": messages}) + "\n"
                               for index, messages in enumerate(conversations)))
    subprocess.run([sys.executable, "-m", "multiseq.cli.main", "batch-run", str(prompts), "-o", str(results),
                    "-m", model, "-np", str(args.parallel), "-t", str(args.threads), "-fa", "off",
                    "-n", str(args.max_tokens), "--temperature", "0", "--top-k", "1", "--no-dashboard"], check=True,
                   stderr=subprocess.DEVNULL)
    records = {record["id"]: record for record in map(json.loads, results.read_text().splitlines())}
    return [{"text": records[str(index)]["text"], "prompt_tokens": records[str(index)]["prompt_tokens"]}
            for index in range(len(conversations))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from multiseq import models

    resolved = models.resolve(args.model)
    template = ["--chat-template-file", resolved.chat_template_fallback] if resolved.chat_template_fallback else []
    conversations = chats()
    both = ["-np", str(args.parallel), "-t", str(args.threads), "-fa", "off"]
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        port = _free_port()
        process, base = start_server([str(ensure_llama_tools().server), "-m", str(resolved.path), *template, *both,
                                      "-c", str(2048 * args.parallel), "--swa-full", "--port", str(port), "--no-webui"],
                                     workdir / "llama-server.log", port)
        try:
            theirs = answers(base, conversations, args.max_tokens)
        finally:
            _stop(process)
        port = _free_port()
        process, base = start_server([sys.executable, "-m", "multiseq.cli.main", "serve", "-m", args.model, *both,
                                      "--slot-ctx", "2048", "--port", str(port)], workdir / "multiseq.log", port)
        try:
            ours = answers(base, conversations, args.max_tokens)
        finally:
            _stop(process)
        batch = batch_run(args.model, conversations, args, workdir)
    same_prompt = same_text = batch_same = 0
    for messages, peer, mine, line in zip(conversations, theirs, ours, batch):
        prompts_match = peer.get("prompt_tokens") == mine.get("prompt_tokens")
        texts_match = "text" in peer and peer.get("text") == mine.get("text")
        same_prompt += prompts_match
        same_text += texts_match
        batch_same += line == mine
        print(f"{messages[-1]['content'][:40]:40s} prompt tokens {peer.get('prompt_tokens')}/{mine.get('prompt_tokens')}"
              f" {'same' if texts_match else 'DIFFERENT'} answer{'' if line == mine else ' (batch-run differs)'}: "
              f"{json.dumps(mine.get('text', mine.get('error')))[:60]}")
        if not texts_match:
            print(f"{'':40s} llama-server: {json.dumps(peer.get('text', peer.get('error')))[:80]}")
    print(json.dumps({"model": args.model, "chats": len(conversations), "same_prompt_tokens": same_prompt,
                      "same_answer": same_text, "batch_run_same_as_serve": batch_same}))


if __name__ == "__main__":
    main()
