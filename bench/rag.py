"""RAG in one server: a chat model, an embedding model and a reranker served together by one
`multiseq serve` (-m three times), 16 chats streaming while documents are embedded and reranked;
against each model served alone.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/rag.py [--documents 400] [--streams 16] [--threads 2]

The embedder and the reranker are tiny BERTs built here (tests/tiny_models.py: a mean-pooling
encoder, and a cross-encoder with a classifier head); the chat model is SmolLM2. Every server
runs `--batch-invariant` (windows of 512 tokens a slot, -np 16), so an answer does not depend on
what shares its batch: each chat's greedy text, each vector and each score must equal the same
model's served alone. Reported: whether they do, and the longest gap between two pieces of a
stream with the chats alone and while the documents were embedded and reranked (target: at
most 2x). The last line is one JSON object.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import peers  # noqa: E402 - bench/ is the script's own folder, first on sys.path
from embeddings import documents  # noqa: E402

from tiny_models import tiny_bert  # noqa: E402

CHAT, EMBEDDER, RERANKER = "smollm2-135m", "embedder.gguf", "reranker.gguf"  # a file is served by its name
STORY_TOKENS = 160  # each stream's length: long enough to span the documents' work


def post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.loads(response.read())


def stream(base: str, index: int, arrivals: list[float]) -> str:
    """One greedy story, its pieces' arrival times noted; its text."""
    body = {"model": CHAT, "prompt": f"Story {index}: once upon a time", "max_tokens": STORY_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True}
    request = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    text = []
    with urllib.request.urlopen(request, timeout=1800) as response:
        for line in response:
            if line.startswith(b"data: {"):
                arrivals.append(time.perf_counter())
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


def stories(base: str, count: int) -> tuple[list[str], list[list[float]]]:
    arrivals: list[list[float]] = [[] for _ in range(count)]
    texts: list[str] = [""] * count

    def run(index: int) -> None:
        texts[index] = stream(base, index, arrivals[index])

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return texts, arrivals


def longest_gap(arrivals: list[list[float]], start: float = 0.0, end: float = float("inf")) -> float:
    return max((after - before for times in arrivals for before, after in zip(times, times[1:])
                if start <= after <= end), default=0.0)


def embed(base: str, texts: list[str]) -> list[list[float]]:
    return peers.each_by_clients(8, texts, lambda text: post(base, "/v1/embeddings", {
        "model": EMBEDDER, "input": text, "encoding_format": "float"})["data"][0]["embedding"])


def rerank(base: str, texts: list[str]) -> list[dict[int, float]]:
    """The documents in groups of 16, each group ranked against a query of its own words."""
    groups = [texts[start:start + 16] for start in range(0, len(texts), 16)]

    def rank(group: list[str]) -> dict[int, float]:
        answer = post(base, "/v1/rerank", {"model": RERANKER, "query": " ".join(group[0].split()[:8]),
                                           "documents": group})
        return {result["index"]: result["relevance_score"] for result in answer["results"]}

    return peers.each_by_clients(4, groups, rank)


def serve_command(models: list[str], port: int, threads: int) -> list[str]:
    command = [sys.executable, "-m", "multiseq.cli.main", "serve"]
    for model in models:
        command += ["-m", model]
    return command + ["-np", "16", "-c", str(16 * 512), "--no-kv-unified", "--batch-invariant", "-t", str(threads),
                      "--port", str(port), "--no-dashboard"]


def started(models: list[str], folder: Path, name: str, threads: int):
    port = peers._free_port()
    process, base = peers.start_server(serve_command(models, port, threads), folder / f"{name}.log", port)
    deadline = time.monotonic() + 300
    while any(card["status"]["value"] != "loaded" for card in json.load(urllib.request.urlopen(f"{base}/v1/models"))
              ["data"]):
        if time.monotonic() > deadline:
            peers._stop(process)
            raise SystemExit(f"the models of {name} did not load: see {folder / name}.log")
        time.sleep(0.2)
    return process, base


def alone(models: dict[str, str], folder: Path, texts: list[str], streams: int, threads: int) -> dict:
    results = {}
    for name, work in (("chat", lambda base: stories(base, streams)), ("embedder", lambda base: embed(base, texts)),
                       ("reranker", lambda base: rerank(base, texts))):
        process, base = started([models[name]], folder, f"alone-{name}", threads)
        try:
            results[name] = work(base)
        finally:
            peers._stop(process)
    return results


def together(models: dict[str, str], folder: Path, texts: list[str], streams: int, threads: int) -> dict:
    process, base = started([models["chat"], models["embedder"], models["reranker"]], folder, "together", threads)
    try:
        chats: dict = {}
        chatting = threading.Thread(target=lambda: chats.update(result=stories(base, streams)))
        chatting.start()
        time.sleep(4)  # the streams decoding
        work_start = time.perf_counter()
        vectors = embed(base, texts)
        scores = rerank(base, texts)
        work_end = time.perf_counter()
        chatting.join()
        return {"chat": chats["result"], "embedder": vectors, "reranker": scores, "window": (work_start, work_end)}
    finally:
        peers._stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=400)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    texts = [" ".join(text.split()[:60]) for text in documents(args.documents)]  # within a 512-token slot
    with tempfile.TemporaryDirectory(prefix="multiseq-rag-") as folder:
        folder = Path(folder)
        models = {"chat": CHAT, "embedder": str(tiny_bert(folder / EMBEDDER, pooling="mean")),
                  "reranker": str(tiny_bert(folder / RERANKER, pooling="rank", rank_head=True))}
        solo = alone(models, folder, texts, args.streams, args.threads)
        shared = together(models, folder, texts, args.streams, args.threads)
    start, end = shared["window"]
    figures = {
        "answers_equal": sum(a == b for a, b in zip(solo["chat"][0], shared["chat"][0])),
        "vectors_equal": sum(a == b for a, b in zip(solo["embedder"], shared["embedder"])),
        "score_groups_equal": sum(a == b for a, b in zip(solo["reranker"], shared["reranker"])),
        "streams": args.streams, "documents": len(texts),
        "gap_alone_max_s": longest_gap(solo["chat"][1]),
        "gap_beside_documents_max_s": longest_gap(shared["chat"][1], start, end),
        "documents_seconds": end - start,
    }
    figures["gap_ratio"] = figures["gap_beside_documents_max_s"] / figures["gap_alone_max_s"]
    print(f"answers equal {figures['answers_equal']}/{args.streams}, vectors equal {figures['vectors_equal']}/"
          f"{len(texts)}, score groups equal {figures['score_groups_equal']}/{len(solo['reranker'])}; longest gap "
          f"{figures['gap_alone_max_s']:.3f} s alone, {figures['gap_beside_documents_max_s']:.3f} s beside the "
          f"documents ({figures['gap_ratio']:.2f}x; embedded and reranked in {figures['documents_seconds']:.1f} s)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
