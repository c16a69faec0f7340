"""What the server's page costs: 16 distinct chats with 4 pages open against none.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/page_cost.py --rounds 4

One `multiseq serve -m smollm2-135m -np 16` is started, then the distinct-chats load of
bench/load.py (64 chats of 128 tokens, 16 clients in a closed loop) runs --rounds times with no
page and --rounds times with --pages pages open, alternating (none first, then pages, and so on:
the same server, warm, for both). A page here is what the browser's page reads: a client of
GET /status/events, reading each state as it comes (the browser drawing it is the browser's
cost, on its own machine). Reported: tokens/s, TTFT p50 and the gaps' p99 of every run, each
side's median and spread, the ratio of the medians, the states each page received per second,
and the server's states built per second (its /status shows none; each page receiving the same
number of states as the others, in step, shows one build per change).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load  # noqa: E402 - bench/load.py, beside this file
import peers  # noqa: E402

MODEL = "smollm2-135m"


class PageReader:
    """One open page: reads GET /status/events on a thread until stopped; counts the states."""

    def __init__(self, port: int) -> None:
        self._port = port
        self.states = 0
        self._connection: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> PageReader:
        self._thread.start()
        return self

    def _read(self) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=60)
        self._connection.request("GET", "/status/events")
        response = self._connection.getresponse()
        try:
            while line := response.readline():
                if line.startswith(b"data: "):
                    json.loads(line[6:])  # what the page does with it, short of drawing
                    self.states += 1
        except (OSError, ValueError, AttributeError):  # closed by stop()
            pass

    def stop(self) -> None:
        if self._connection is not None and self._connection.sock is not None:
            self._connection.sock.shutdown(2)
        self._thread.join(10)


def one_run(port: int, chats: load.ChatLoad, clients: int, pages: int) -> dict:
    readers = [PageReader(port).start() for _ in range(pages)]
    time.sleep(0.5)  # the pages have their first state before the load starts
    states_before = [reader.states for reader in readers]
    exchanges, wall_s = asyncio.run(load.closed_loop("127.0.0.1", port, chats, clients, MODEL, load.APIS["chat"]))
    for reader in readers:
        reader.stop()
    figure = load.summarize("multiseq", "distinct", exchanges, wall_s)
    received = [reader.states - before for reader, before in zip(readers, states_before)]
    return {"pages": pages, "tokens_per_s": figure["tokens_per_s"], "ttft_p50_s": figure["ttft_p50_s"],
            "gap_p99_s": figure["gap_p99_s"], "wall_s": wall_s,
            "states_per_page_per_s": [count / wall_s for count in received]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pages", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    server_args = argparse.Namespace(model=MODEL, parallel=16, slot_ctx=1024, threads=2, step_tokens=None)
    chats = load.chat_loads(64)["distinct"]
    port = peers._free_port()
    runs = []
    with tempfile.TemporaryDirectory() as tmp, load.running(load.multiseq_command(server_args, port), port,
                                                            Path(tmp) / "serve.log"):
        one_run(port, chats, args.clients, 0)  # warm-up, not counted
        for _ in range(args.rounds):
            for pages in (0, args.pages):
                runs.append(one_run(port, chats, args.clients, pages))
                load.log(json.dumps(runs[-1]))
    none = [run["tokens_per_s"] for run in runs if run["pages"] == 0]
    some = [run["tokens_per_s"] for run in runs if run["pages"]]
    print(json.dumps({"runs": runs, "tokens_per_s_no_page": [min(none), statistics.median(none), max(none)],
                      f"tokens_per_s_{args.pages}_pages": [min(some), statistics.median(some), max(some)],
                      "ratio_of_medians": statistics.median(some) / statistics.median(none)}, indent=1))


if __name__ == "__main__":
    main()
