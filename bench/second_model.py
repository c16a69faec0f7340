"""A second model loaded while 16 streams run on the first: how long the streams' pieces wait
during the load, and how soon the new model answers.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/second_model.py [--streams 16] [--threads 2] [--runs 3]

One `multiseq serve -m smollm2-135m -m gemma3-270m -np 16 -c 16384`, Gemma unloaded (POST /models/unload)
before each run. Each run: 16 greedy streams on SmolLM2 alone, then the same 16 again with a
chat to Gemma sent 3 s in (its load happens then, on a thread of its own). Reported per run: the
largest ratio, over the streams, of a stream's longest gap between two pieces with the load to
its longest gap without (target: at most 2x), and the seconds from the Gemma request to its
first token (the load, then its prefill). With --control the second pass has no load either:
what the ratio reads between two passes alike. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path
from rag import longest_gap, post, stories

CHAT, SECOND = "smollm2-135m", "gemma3-270m"


def first_token_seconds(base: str) -> float:
    """Seconds from a streamed Gemma chat's request to its first piece."""
    body = {"model": SECOND, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
            "stream": True}
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {") and b'"content"' in line:
                return time.perf_counter() - started
    raise SystemExit("the second model gave no piece")


def one_run(base: str, streams: int, control: bool = False) -> dict:
    post(base, "/models/unload", {"model": SECOND})
    _, alone = stories(base, streams)
    loaded: dict = {"seconds": float("nan")}
    loading = threading.Timer(3.0, lambda: None if control else loaded.update(seconds=first_token_seconds(base)))
    loading.start()
    _, beside = stories(base, streams)
    loading.join()
    ratios = [longest_gap([with_load]) / longest_gap([without]) for without, with_load in zip(alone, beside)]
    return {"worst_gap_ratio": max(ratios), "gap_alone_max_s": longest_gap(alone),
            "gap_beside_load_max_s": longest_gap(beside), "second_model_first_token_s": loaded["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--control", action="store_true",
                        help="no load in the second pass: the ratio's spread between two passes alike")
    args = parser.parse_args()
    port = peers._free_port()
    command = [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", CHAT, "-m", SECOND, "-np", str(args.streams),
               "-c", str(args.streams * 1024), "-t", str(args.threads), "--port", str(port), "--no-dashboard"]
    with tempfile.TemporaryDirectory(prefix="multiseq-second-") as folder:
        process, base = peers.start_server(command, Path(folder) / "serve.log", port)
        try:
            post(base, "/models/load", {"model": SECOND})  # loaded once (the file cached), as a reload is
            runs = [one_run(base, args.streams, args.control) for _ in range(args.runs)]
        finally:
            peers._stop(process)
    for number, run in enumerate(runs, 1):
        print(f"run {number}: worst stream's longest gap {run['worst_gap_ratio']:.2f}x its own without the load "
              f"({run['gap_beside_load_max_s']:.3f} s vs {run['gap_alone_max_s']:.3f} s at most); {SECOND}'s first "
              f"token {run['second_model_first_token_s']:.2f} s after its request")
    print(json.dumps({"streams": args.streams, "runs": runs}))


if __name__ == "__main__":
    main()
