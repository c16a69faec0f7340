"""Streams beside an embedding job: 16 chats stream while a long chat prompt is prefilled, then
while 16 clients embed documents, on `multiseq serve` and on llama-server (`--embeddings`, the
same slots). The longest gap between two pieces of a stream in each window says whether the
streams kept going.

    python bench/embeddings_beside_streams.py [--documents 48] [--streams 16] [--threads 2]
        [--systems multiseq,llama-server]

Both servers get 32 slots of 1,024 tokens (`-np 32 -c 32768`; llama-server also `--pooling mean
-ub 1024 -b 1024`), so that the embedding clients find slots beside the streams. Streams are greedy
completions with ignore_eos; a stream that ends starts again (a gap is counted within a stream only).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embeddings import documents, embed_all, server_commands  # noqa: E402
from peers import _free_port, _stop, ensure_llama_tools, start_server  # noqa: E402

from multiseq import models  # noqa: E402

LONG_PROMPT = " ".join(documents(8, seed=3))[:3600]  # about 800 tokens, a prompt no stream shares


class Streams:
    """`count` streaming completions, each started again when it ends, with every piece's time."""

    def __init__(self, base: str, count: int) -> None:
        self.host, self.port = base.removeprefix("http://").split(":")
        self.arrivals: list[list[list[float]]] = [[] for _ in range(count)]  # per stream, per request
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(index,), daemon=True) for index in range(count)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _run(self, index: int) -> None:
        while not self._stop.is_set():
            times: list[float] = []
            self.arrivals[index].append(times)
            body = {"prompt": f"Stream {index} tells a long story:", "max_tokens": 900, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            connection = http.client.HTTPConnection(self.host, int(self.port), timeout=600)
            connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            for line in response:
                if self._stop.is_set():
                    break
                if line.startswith(b"data: {"):
                    times.append(time.perf_counter())
            connection.close()

    def longest_gap(self, start: float, end: float) -> float:
        """The longest gap between two pieces of one request that ended inside [start, end]."""
        gaps = [after - before for stream in self.arrivals for times in stream
                for before, after in zip(times, times[1:]) if start <= after <= end]
        return max(gaps, default=0.0)


def long_prompt(base: str) -> None:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=600)
    body = {"prompt": LONG_PROMPT, "max_tokens": 1, "temperature": 0}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    connection.getresponse().read()
    connection.close()


def measure(command: list[str], log: Path, port: int, texts: list[str], streams: int) -> dict:
    process, base = start_server(command, log, port)
    try:
        running = Streams(base, streams)
        running.start()
        time.sleep(8)  # every stream started and decoding
        steady_start = time.perf_counter()
        time.sleep(4)
        prompt_start = time.perf_counter()
        long_prompt(base)
        prompt_end = time.perf_counter()
        time.sleep(3)
        embed_start = time.perf_counter()
        _, seconds, tokens = embed_all(base, texts, 16)
        embed_end = time.perf_counter()
        running.stop()
        return {"steady": running.longest_gap(steady_start, prompt_start),
                "long prompt": running.longest_gap(prompt_start, prompt_end + 0.5),
                "embedding": running.longest_gap(embed_start, embed_end),
                "prompt seconds": prompt_end - prompt_start, "embedding seconds": seconds, "tokens": tokens}
    finally:
        _stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=48)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--systems", default="multiseq,llama-server")
    args = parser.parse_args()
    texts = documents(args.documents)
    model_path = str(models.resolve(args.model).path)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="multiseq-beside-") as folder:
        for system in args.systems.split(","):
            port = _free_port()
            commands = server_commands(ensure_llama_tools() if system == "llama-server" else None, model_path,
                                       args.model, 32, 32768, args.threads)
            command = commands[system](port)
            rows[system] = measure(command, Path(folder) / f"{system}.log", port, texts, args.streams)
    print(f"{'system':14} {'steady':>8} {'long prompt':>12} {'embedding':>10}   longest gap between a stream's "
          f"pieces (s); prompt s, embedding s, tokens/s")
    for system, row in rows.items():
        print(f"{system:14} {row['steady']:8.2f} {row['long prompt']:12.2f} {row['embedding']:10.2f}   "
              f"{row['prompt seconds']:.1f}, {row['embedding seconds']:.1f}, "
              f"{row['tokens'] / row['embedding seconds']:.1f}")


if __name__ == "__main__":
    main()
