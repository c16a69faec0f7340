"""How long a model's load holds the GIL in one piece: what every other stream of the process
waits for while it loads.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/load_gil.py [--model gemma3-270m] [--runs 3]

Each run is a fresh process (the constraints' tokenizer is built once per process) that opens
the model as `multiseq serve` does (the runner, then what serving prepares: `_prepared` of
multiseq.server.serve), while a thread wakes every 5 ms and notes how late it woke. Two cases,
alternating: other models idle at the load (the tokenizer is built then), and other models
streaming (its build is left for an idle moment). Reported: the longest late wake-up of each
load, and its wall time. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, threading, time
from multiseq import models
from multiseq.config import RunnerConfig
from multiseq.loop.runner import Runner
from multiseq.server.serve import _prepared

path = str(models.resolve(sys.argv[1]).path)
busy = sys.argv[2] == "busy"
longest, stop = [0.0], threading.Event()

def tick():
    last = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.005)
        now = time.perf_counter()
        longest[0] = max(longest[0], now - last - 0.005)
        last = now

ticker = threading.Thread(target=tick, daemon=True)
ticker.start()
started = time.perf_counter()
runner = _prepared(Runner, lambda: busy)(RunnerConfig(model=path, parallel=4, threads=1))
wall = time.perf_counter() - started
stop.set()
ticker.join()
runner.close()
print(json.dumps({"longest_hold_ms": round(longest[0] * 1000, 1), "load_s": round(wall, 2)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"others idle": [], "others streaming": []}
    for _ in range(args.runs):
        for case, flag in (("others idle", "idle"), ("others streaming", "busy")):
            output = subprocess.run([sys.executable, "-c", CHILD, args.model, flag], capture_output=True, text=True,
                                    check=True).stdout
            results[case].append(json.loads(output.strip().splitlines()[-1]))
            print(case, results[case][-1], flush=True)
    print(json.dumps({"model": args.model, **results}))


if __name__ == "__main__":
    main()
