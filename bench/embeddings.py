"""Embedding a corpus through /v1/embeddings: `multiseq serve` against llama-server on the same
model, 16 concurrent clients, one document per request, mean pooling. Every vector is compared
with llama-server's (cosine), and the throughput with llama.cpp's own prefill rate measured in
the same run (llama-batched-bench, 16 x 128-token prompts).

    python bench/embeddings.py [--documents 400] [--clients 16] [--model smollm2-135m] [--threads 2]
        [--skip-peer] [--rounds 1]

The same documents then go through `batch-run` as a file of `{"id", "input"}` lines (the whole
command timed, its model load included), its vectors compared with the server's.

llama-server (built from the pinned sources by bench/peers.py) runs as the issue gives it:
`--embeddings --pooling mean -np 16 -c 16384 -ub 1024 -b 1024`; multiseq as `serve --pooling mean
-np 16 -c 16384`. The documents are 30-300 words of seeded random English (about 170 tokens each
on SmolLM2's vocabulary). Where multiseq's and llama-server's vectors part, both are checked against
llama.cpp's own pooling of the document alone (llama-cpp-python, one micro-batch): llama-server with
`-np` keeps a KV stream per slot, and llama.cpp's split of a batch over streams (equal tokens per
sequence) cuts a document across micro-batches, whose pooled sums overwrite each other. Exit code
1 when one of multiseq's vectors is off (cosine < 0.999 to the reference).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import _free_port, _stop, ensure_llama_tools, run_batched_bench, start_server  # noqa: E402

from multiseq import models  # noqa: E402

MULTISEQ = str(Path(sys.executable).parent / "multiseq")
WORDS = ("the of and to in is was for on that with as by at from it his an were are which this be has had or "
         "not but also have its one their first after new two other been more who time into during they all "
         "when there city only some would most where school year over used between may about known later "
         "river history people world state music water several under three being many while until both "
         "called american part then war film team best since national those these against each area early "
         "team game season village population county system light energy house party family market north "
         "south east west century church small large government public number power field station club "
         "built named second well high work same long found became around through life because based old").split()


def documents(count: int, seed: int = 7) -> list[str]:
    """Seeded random documents of 30-300 words, in sentences."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(30, 300))]
        sentences, start = [], 0
        while start < len(words):
            end = min(len(words), start + rng.randint(6, 18))
            sentences.append(" ".join(words[start:end]).capitalize() + ".")
            start = end
        texts.append(" ".join(sentences))
    return texts


def embed_all(base: str, texts: list[str], clients: int) -> tuple[list[np.ndarray], float, int]:
    """Every text through /v1/embeddings, `clients` at a time: the vectors, the seconds, the tokens."""
    work: queue.Queue = queue.Queue()
    for index in range(len(texts)):
        work.put(index)
    vectors: list = [None] * len(texts)
    tokens = [0]
    errors: list[str] = []

    def client() -> None:
        while True:
            try:
                index = work.get_nowait()
            except queue.Empty:
                return
            body = json.dumps({"input": texts[index], "encoding_format": "float"}).encode()
            request = urllib.request.Request(f"{base}/v1/embeddings", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=1800) as response:
                    answer = json.load(response)
            except Exception as error:  # noqa: BLE001 - reported, and the run fails
                errors.append(f"document {index}: {error}")
                return
            vectors[index] = np.asarray(answer["data"][0]["embedding"], dtype=np.float64)
            tokens[0] += answer["usage"]["prompt_tokens"]

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise SystemExit("\n".join(errors[:5]))
    return vectors, time.perf_counter() - started, tokens[0]


def batch_run(workdir: Path, texts: list[str], args) -> tuple[list[np.ndarray], float, int]:
    """The documents as a file of embedding lines through batch-run (the whole command, its
    model load included): the vectors, the seconds, the tokens."""
    source, out = workdir / "documents.jsonl", workdir / "vectors.jsonl"
    source.write_text("".join(json.dumps({"id": str(index), "input": text}) + "\n" for index, text in enumerate(texts)))
    started = time.perf_counter()
    subprocess.run([MULTISEQ, "batch-run", str(source), "-m", args.model, "--pooling", "mean", "-np", str(args.clients),
                    "--slot-ctx", "1024", "-t", str(args.threads), "-o", str(out), "--no-dashboard"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    records = {record["id"]: record for record in map(json.loads, out.read_text().splitlines())}
    vectors = [np.asarray(records[str(index)]["embedding"], dtype=np.float64) for index in range(len(texts))]
    return vectors, seconds, sum(record["prompt_tokens"] for record in records.values())


def server_commands(tools, model_path: str, model: str, parallel: int, context: int, threads: int) -> dict:
    """Per system, its command on a port: llama-server with embeddings (the issue's flags) and
    multiseq serve, both pooling by mean with `parallel` slots sharing `context` tokens."""
    both = ["--pooling", "mean", "-np", str(parallel), "-c", str(context), "-t", str(threads)]
    return {"llama-server": lambda port: [str(tools.server), "-m", model_path, "--embeddings", *both, "-ub", "1024",
                                          "-b", "1024", "-tb", str(threads), "--no-webui", "--host", "127.0.0.1",
                                          "--port", str(port)],
            "multiseq": lambda port: [MULTISEQ, "serve", "-m", model, *both, "--port", str(port)]}


def run(command: list[str], log: Path, port: int, texts: list[str], clients: int):
    process, base = start_server(command, log, port)
    try:
        return embed_all(base, texts, clients)
    finally:
        _stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--skip-peer", action="store_true", help="multiseq alone (no vectors compared)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of both servers, their order alternating "
                                                              "(the table shows the first round)")
    args = parser.parse_args()
    texts = documents(args.documents)
    model_path = str(models.resolve(args.model).path)
    tools = ensure_llama_tools()
    rate = run_batched_bench(tools, model_path, [16], 128, 1, args.threads, log=lambda line: None)
    prefill_rate = rate["rows"][0]["pp_tokens_per_s"]
    commands = server_commands(tools, model_path, args.model, args.clients, 16384, args.threads)
    systems = ["multiseq"] if args.skip_peer else ["llama-server", "multiseq"]
    rows, rounds = {}, []
    with tempfile.TemporaryDirectory(prefix="multiseq-embeddings-") as folder:
        workdir = Path(folder)
        for number in range(args.rounds):  # the order alternates, so that the machine's drift falls on both
            seconds = {}
            for system in systems if number % 2 == 0 else systems[::-1]:
                port = _free_port()
                row = run(commands[system](port), workdir / f"{system}.log", port, texts, args.clients)
                rows.setdefault(system, row)
                seconds[system] = row[1]
            rounds.append(seconds)
        rows["batch-run"] = batch_run(workdir, texts, args)
    report(rows, prefill_rate, len(texts))
    if len(rounds) > 1 and len(systems) > 1:
        ratios = [round_["llama-server"] / round_["multiseq"] for round_ in rounds]
        print(f"multiseq / llama-server throughput by round: {', '.join(f'{ratio:.2f}x' for ratio in ratios)}; "
              f"median {float(np.median(ratios)):.2f}x")
    same = min(cosine(a, b) for a, b in zip(rows["batch-run"][0], rows["multiseq"][0]))
    print(f"batch-run's vectors against serve's: min cosine {same:.6f}")
    if "llama-server" in rows:
        sys.exit(check_vectors(rows, texts, model_path, args.threads))


def reference_vectors(model_path: str, texts: dict[int, str], threads: int) -> dict[int, np.ndarray]:
    """llama.cpp's own mean pooling of each text alone, in one micro-batch (llama-cpp-python)."""
    from llama_cpp import LLAMA_POOLING_TYPE_MEAN, Llama

    llama = Llama(model_path=model_path, embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN, n_ctx=2048,
                  n_batch=2048, n_ubatch=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        return {index: np.asarray(llama.embed(text, normalize=False), dtype=np.float64) for index, text in texts.items()}
    finally:
        llama.close()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def check_vectors(rows: dict, texts: list[str], model_path: str, threads: int) -> int:
    """Where multiseq's and llama-server's vectors part (cosine < 0.999), and every 20th
    document, both against the reference; 1 when one of multiseq's is off."""
    ours, theirs = rows["multiseq"][0], rows["llama-server"][0]
    apart = [index for index, (a, b) in enumerate(zip(ours, theirs)) if cosine(a, b) < 0.999]
    checked = sorted(set(apart) | set(range(0, len(texts), 20)))
    reference = reference_vectors(model_path, {index: texts[index] for index in checked}, threads)
    print(f"{len(apart)} of {len(texts)} documents apart (cosine < 0.999); against llama.cpp's own pooling of each "
          f"document alone ({len(checked)} documents: those, and every 20th):")
    for name, vectors in (("multiseq", ours), ("llama-server", theirs)):
        values = [cosine(vectors[index], reference[index]) for index in checked]
        print(f"  {name:14} min {min(values):.6f}  median {float(np.median(values)):.6f}  "
              f"below 0.999: {sum(value < 0.999 for value in values)}")
    return int(min(cosine(ours[index], reference[index]) for index in checked) < 0.999)


def report(rows: dict, prefill_rate: float, count: int) -> None:
    print(f"llama-batched-bench prefill (16 x 128 tokens): {prefill_rate:.1f} tokens/s")
    print(f"{'system':14} {'seconds':>8} {'tokens':>7} {'tokens/s':>9} {'docs/s':>7} {'x prefill':>10}")
    for system, (_, seconds, tokens) in rows.items():
        print(f"{system:14} {seconds:8.1f} {tokens:7d} {tokens / seconds:9.1f} {count / seconds:7.2f} "
              f"{tokens / seconds / prefill_rate:10.2f}")
    if "llama-server" in rows:
        ours, theirs = rows["multiseq"][0], rows["llama-server"][0]
        cosines = [cosine(a, b) for a, b in zip(ours, theirs)]
        speed = rows["llama-server"][1] / rows["multiseq"][1]
        print(f"multiseq / llama-server throughput: {speed:.2f}x; cosine to llama-server's vectors: "
              f"min {min(cosines):.6f}, median {float(np.median(cosines)):.6f}")


if __name__ == "__main__":
    main()
