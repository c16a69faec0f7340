"""A second model loaded while 16 streams run on the first: how long the streams' pieces wait
during the load, and how soon the new model answers.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/second_model.py [--streams 16] [--threads 2] [--runs 3]

One `multiseq serve -m smollm2-135m -m gemma3-270m -np 16 -c 16384`, Gemma unloaded (POST /models/unload)
before each run. Each run: 16 greedy streams on SmolLM2 alone, then the same 16 again with a
chat to Gemma sent 3 s in (its load happens then, on a thread of its own). Reported per run: the
largest ratio, over the streams, of a stream's longest gap between two pieces with the load to
its longest gap without (target: at most 2x), and the seconds from the Gemma request to its
first token (the load, then its prefill); and, within the pass with the load, the largest
ratio of a stream's longest gap while the model loaded to its longest gap outside that time (the
load's own effect, free of the spread between two passes). With --control the second pass has no
load either: what the first ratio reads between two passes alike. The last line is one JSON object.
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


def first_token_seconds(base: str, window: list[float] | None = None) -> float:
    """Seconds from a streamed Gemma chat's request to its first piece (its request's and first
    piece's perf_counter times appended to `window`)."""
    body = {"model": SECOND, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
            "stream": True}
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {") and b'"content"' in line:
                if window is not None:
                    window.extend((started, time.perf_counter()))
                return time.perf_counter() - started
    raise SystemExit("the second model gave no piece")


def one_run(base: str, streams: int, control: bool = False) -> dict:
    post(base, "/models/unload", {"model": SECOND})
    _, alone = stories(base, streams)
    loaded: dict = {"seconds": float("nan")}
    window: list[float] = []
    loading = threading.Timer(3.0, lambda: None if control else loaded.update(
        seconds=first_token_seconds(base, window)))
    loading.start()
    _, beside = stories(base, streams)
    loading.join()
    ratios = [longest_gap([with_load]) / longest_gap([without]) for without, with_load in zip(alone, beside)]
    return {"worst_gap_ratio": max(ratios), "gap_alone_max_s": longest_gap(alone),
            "gap_beside_load_max_s": longest_gap(beside), "second_model_first_token_s": loaded["seconds"],
            "worst_in_load_ratio": in_load_ratio(beside, window) if window else float("nan")}


def in_load_ratio(arrivals: list[list[float]], window: list[float]) -> float:
    """The largest ratio, over the streams, of a stream's longest gap ending while the second
    model loaded (its request to its first piece, plus 0.5 s) to its longest gap ending outside
    that time in the same pass: what the load itself adds, free of the pass-to-pass spread."""
    start, end = window[0], window[1] + 0.5
    ratios = []
    for times in arrivals:
        inside = longest_gap([times], start, end)
        outside = max(longest_gap([times], 0.0, start), longest_gap([times], end))
        if outside > 0:
            ratios.append(inside / outside)
    return max(ratios)


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
              f"token {run['second_model_first_token_s']:.2f} s after its request; within the pass, the worst "
              f"stream's longest gap during the load {run['worst_in_load_ratio']:.2f}x its longest outside it")
    print(json.dumps({"streams": args.streams, "runs": runs}))


if __name__ == "__main__":
    main()
