"""LoRA adapters on SmolLM2, multiseq against llama-server: the same greedy text from the same
adapter file, and the tokens/s of 16 clients.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/lora.py [--clients 16] [--max-tokens 32] [--scale 1.0]
    python bench/lora.py --two [--clients 16]

With --two, two adapters of one base: `multiseq serve --lora-modules a=FILE --lora-modules b=FILE`
against `llama-server --lora FILE --lora FILE` with each request's `lora` field naming its
adapter (llama-server's per-request adapters); half the clients on each. Reported: each
adapter's greedy texts against llama-server's, tokens/s, and each adapter's time to first token
(p95) with 16 clients streaming.

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
import urllib.request
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


def two_adapter_commands(adapters: list[str], clients: int, threads: int, port: int) -> dict[str, list[str]]:
    base = commands(None, 1.0, clients, threads, port)
    modules = [argument for name, path in zip("ab", adapters) for argument in ("--lora-modules", f"{name}={path}")]
    loras = [argument for path in adapters for argument in ("--lora", path)]
    return {"multiseq": base["multiseq"] + modules, "llama-server": base["llama-server"] + loras}


def two_adapter_body(server: str, adapter: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    body = {"model": "smollm2-135m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}
    if server == "multiseq":
        return body | {"model": adapter}
    return body | {"lora": [{"id": "ab".index(adapter), "scale": 1.0}]}  # the others: scale 0


def streamed(base: str, body: dict) -> tuple[float, int]:
    """(seconds to the first text, pieces) of a streamed completion."""
    request = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    started, first, pieces = time.perf_counter(), None, 0
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0].get("text"):
                first = first if first is not None else time.perf_counter() - started
                pieces += 1
    return (first if first is not None else float("nan")), pieces


def measure_two(name: str, command: list[str], folder: Path, port: int, clients: int, max_tokens: int) -> dict:
    process, base = peers.start_server(command, folder / f"{name}.log", port)
    try:
        texts = {adapter: [post(base, "/v1/completions", two_adapter_body(name, adapter, prompt, max_tokens, False))
                           ["choices"][0]["text"] for prompt in PROMPTS[:4]] for adapter in "ab"}
        work = [("ab"[index % 2], PROMPTS[index % len(PROMPTS)]) for index in range(clients)]
        started = time.perf_counter()
        timed = peers.each_by_clients(clients, work, lambda item: (item[0], *streamed(
            base, two_adapter_body(name, item[0], item[1], max_tokens, True))))
        seconds = time.perf_counter() - started
    finally:
        peers._stop(process)
    ttft = {adapter: sorted(first for each, first, _ in timed if each == adapter) for adapter in "ab"}
    p95 = {adapter: values[min(len(values) - 1, int(0.95 * len(values)))] for adapter, values in ttft.items()}
    pieces = sum(count for _, _, count in timed)
    return {"texts": texts, "pieces": pieces, "seconds": seconds, "pieces_per_s": pieces / seconds, "ttft_p95_s": p95}


def main_two(args) -> None:
    with tempfile.TemporaryDirectory(prefix="multiseq-lora-") as folder_name:
        folder = Path(folder_name)
        smol = models.resolve("smollm2-135m").path
        adapters = [str(lora_adapter_for(smol, folder / f"{name}.gguf", rank=8, std=0.1, seed=seed))
                    for seed, name in enumerate("ab")]
        port = peers._free_port()
        results = {name: measure_two(name, command, folder, port, args.clients, args.max_tokens)
                   for name, command in two_adapter_commands(adapters, args.clients, args.threads, port).items()}
    mine, theirs = results["multiseq"], results["llama-server"]
    for adapter in "ab":
        equal = sum(a == b for a, b in zip(mine["texts"][adapter], theirs["texts"][adapter]))
        print(f"adapter {adapter}: greedy texts equal {equal} of {len(mine['texts'][adapter])}")
    print(f"{args.clients} clients over 2 adapters: multiseq {mine['pieces_per_s']:.1f} pieces/s, llama-server "
          f"{theirs['pieces_per_s']:.1f} ({mine['pieces_per_s'] / theirs['pieces_per_s']:.2f}x)")
    for name, result in results.items():
        a, b = result["ttft_p95_s"]["a"], result["ttft_p95_s"]["b"]
        print(f"{name}: TTFT p95 a {a:.2f} s, b {b:.2f} s ({max(a, b) / min(a, b):.2f}x)")
    print(json.dumps({"clients": args.clients, "two_adapters": True, "results": results}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--without", action="store_true", help="no adapter: the two servers' own ratio")
    parser.add_argument("--two", action="store_true", help="two adapters of one base, half the clients each")
    args = parser.parse_args()
    if args.two:
        main_two(args)
        return
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
