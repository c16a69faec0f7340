"""A LoRA adapter on SmolLM2, multiseq against llama-server: the same greedy text from the same
adapter file, and the tokens/s of 16 clients.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/lora.py [--clients 16] [--max-tokens 32] [--scale 1.0]

The adapter is random (tests/tiny_models.lora_adapter_for: rank 8 on every layer's attn_q, f16,
written once into a temporary folder). Each server is started with it (`multiseq serve --lora-scaled
FILE:SCALE -np CLIENTS`, `llama-server --lora-scaled FILE:SCALE -np CLIENTS`, flash attention off
in both, -c 1024 a slot), then: one greedy completion per prompt, alone, for the texts; then
`--clients` greedy completions at once, for the tokens/s (`--without`: no adapter, the two
servers' own ratio in the same setting). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path
from multiseq import models
from rag import post

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tiny_models import lora_adapter_for  # noqa: E402 - the tests' adapter builder

PROMPTS = ["The capital of France is", "Water boils at", "The largest planet is", "A good breakfast is",
           "Photosynthesis is", "The first computer", "In winter, the days", "Music can"]


def commands(adapter: str, scale: float, clients: int, threads: int, port: int) -> dict[str, list[str]]:
    model = str(models.resolve("smollm2-135m").path)
    lora = ["--lora-scaled", f"{adapter}:{scale}"] if adapter else []
    tools = peers.ensure_llama_tools()
    return {"multiseq": [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", "smollm2-135m", "-np", str(clients),
                         "-c", str(1024 * clients), "-t", str(threads), "-fa", "off", "--port", str(port),
                         "--no-dashboard", *lora],
            "llama-server": [str(tools.server), "-m", model, "-np", str(clients), "-c", str(1024 * clients),
                             "-t", str(threads), "-fa", "off", "--host", "127.0.0.1", "--port", str(port), *lora]}


def complete(base: str, prompt: str, max_tokens: int) -> dict:
    return post(base, "/v1/completions", {"model": "smollm2-135m", "prompt": prompt, "max_tokens": max_tokens,
                                          "temperature": 0})


def measure(command: list[str], name: str, folder: Path, port: int, clients: int, max_tokens: int) -> dict:
    process, base = peers.start_server(command, folder / f"{name}.log", port)
    try:
        texts = [complete(base, prompt, max_tokens)["choices"][0]["text"] for prompt in PROMPTS]
        wanted = [PROMPTS[index % len(PROMPTS)] for index in range(clients)]
        started = time.perf_counter()
        replies = peers.each_by_clients(clients, wanted, lambda prompt: complete(base, prompt, max_tokens))
        seconds = time.perf_counter() - started
    finally:
        peers._stop(process)
    tokens = sum(reply["usage"]["completion_tokens"] for reply in replies)
    return {"texts": texts, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--without", action="store_true", help="no adapter: the two servers' own ratio")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="multiseq-lora-") as folder_name:
        folder = Path(folder_name)
        adapter = str(lora_adapter_for(models.resolve("smollm2-135m").path, folder / "adapter.gguf", rank=8,
                                       std=0.1))
        port = peers._free_port()
        given = None if args.without else adapter
        results = {name: measure(command, name, folder, port, args.clients, args.max_tokens)
                   for name, command in commands(given, args.scale, args.clients, args.threads, port).items()}
    mine, theirs = results["multiseq"], results["llama-server"]
    equal = sum(a == b for a, b in zip(mine["texts"], theirs["texts"]))
    print(f"greedy texts equal: {equal} of {len(PROMPTS)}")
    for prompt, a, b in zip(PROMPTS, mine["texts"], theirs["texts"]):
        if a != b:
            print(f"  {prompt!r}: multiseq {a!r} / llama-server {b!r}")
    print(f"{args.clients} clients: multiseq {mine['tokens_per_s']:.1f} tokens/s, llama-server "
          f"{theirs['tokens_per_s']:.1f} ({mine['tokens_per_s'] / theirs['tokens_per_s']:.2f}x)")
    print(json.dumps({"clients": args.clients, "scale": None if args.without else args.scale, "equal_texts": equal, "results": results}))


if __name__ == "__main__":
    main()
