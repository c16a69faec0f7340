"""One long chat beside three short ones, on `-c 16384 -np 4`: what a KV pool is for.

A fixed window per slot (`--no-kv-unified`: 4,096 tokens each here) cannot hold an 11,000-token
chat at all; one pool can, beside the short chats. multiseq's default holds the pool in a
window per slot until a session needs more, then in one pool: this runs the four chats
together (streamed, greedy, `ignore_eos`) against each layout asked for and reports, per layout,
whether each chat was answered, the wall time, the short chats' output tok/s while the long
one runs, the long one's time to first token, and the server's layout moves (/metrics).

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/long_beside_short.py --layouts default,pool,windows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402

from multiseq import models  # noqa: E402

LAYOUT_FLAGS = {"default": [], "pool": ["--kv-unified"], "windows": ["--no-kv-unified"]}
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def long_text(words: int) -> str:
    return " ".join(f"Entry {index}: the harbor log notes a boat named Wave {index % 97} at dawn." for index in
                    range(words // 12))


def ask(base: str, model: str, content: str, max_tokens: int, result: dict) -> None:
    """One streamed greedy chat; its time to first token, tokens and end, into `result`."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(f"{base}/v1/chat/completions", body, {"content-type": "application/json"})
    started = time.perf_counter()
    try:
        with _HTTP.open(request, timeout=1800) as response:
            for line in response:
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("choices") and event["choices"][0]["delta"].get("content") and "ttft_s" not in result:
                    result["ttft_s"] = time.perf_counter() - started
                if event.get("usage"):
                    result["prompt_tokens"] = event["usage"]["prompt_tokens"]
                    result["completion_tokens"] = event["usage"]["completion_tokens"]
                if event.get("error"):
                    result["error"] = event["error"].get("message")
    except urllib.error.HTTPError as error:
        result["error"] = f"HTTP {error.code}: {error.read()[:200].decode(errors='replace')}"
    result["seconds"] = time.perf_counter() - started


def layout_metrics(base: str) -> dict:
    text = _HTTP.open(f"{base}/metrics", timeout=30).read().decode()
    wanted = ("multiseq_kv_layout_moves_total", "multiseq_kv_layout_move_seconds_total", "multiseq_kv_pool_in_windows")
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.split(" ")[0] in wanted}


def run_layout(args, layout: str, workdir: Path) -> dict:
    port = peers._free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", args.model, "-np", "4", "-c", "16384",
               "-t", str(args.threads), "--port", str(port), "--no-dashboard", *LAYOUT_FLAGS[layout]]
    log_path = workdir / f"{layout}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        peers._wait_healthy(process, base, timeout_s=300)
        results = [{"chat": "long"}, *({"chat": f"short {index}"} for index in range(3))]
        started = time.perf_counter()
        threads = [threading.Thread(target=ask, args=(base, args.model, long_text(args.long_words), 16, results[0]))]
        threads += [threading.Thread(target=ask, args=(base, args.model, f"Tell me a story about boat {index}.", args.short_tokens,
                                                       results[1 + index])) for index in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        metrics = layout_metrics(base) if layout != "windows" else {}
    finally:
        peers._stop(process)
    short = results[1:]
    return {"layout": layout, "wall_s": round(wall, 1), "answered": sum("error" not in r for r in results),
            "long": results[0], "short_tok_s": round(sum(r.get("completion_tokens", 0) for r in short) /
                                                    max(r["seconds"] for r in short), 1),
            "metrics": metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="default,pool,windows")
    parser.add_argument("--model", default=models.DEFAULT_MODEL)
    parser.add_argument("--long-words", type=int, default=6000, help="the long chat's size in words (about)")
    parser.add_argument("--short-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    figures = []
    with tempfile.TemporaryDirectory() as folder:
        for layout in args.layouts.split(","):
            figure = run_layout(args, layout, Path(folder))
            print(json.dumps(figure), file=sys.stderr, flush=True)
            figures.append(figure)
    print(json.dumps({"model": args.model, "figures": figures}))


if __name__ == "__main__":
    main()
