"""Reranking through /v1/rerank: multiseq serve against llama-server on the same reranker, the
same queries and documents, the same concurrent clients; the scores compared, then the rate.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/rerank.py                              # a tiny BERT cross-encoder built here
    python bench/rerank.py --model bge-reranker-v2-m3-Q8_0.gguf --queries 64 --documents 16

The tiny reranker (tests/tiny_models.py: 2 layers of 64, a WordPiece vocabulary, a classifier
head) costs next to nothing to run, so its rate is the servers' own work per request: parsing,
tokenizing, scheduling, answering. Each of --clients clients posts queries one after another,
each with --documents documents of 20-120 words; llama-server is started with `--reranking
-np --parallel -ub -b 1024` (its documents must fit a micro-batch), multiseq with `serve -np
--parallel`. Reported: documents per second and the largest difference between the two
servers' scores of the same document (llama-server lays out a query and a document the way
multiseq does: the same scores). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import peers  # noqa: E402 - bench/ is the script's own folder, first on sys.path

from tiny_models import BERT_WORDS, tiny_bert  # noqa: E402

WORDS = [word for word in BERT_WORDS if word.isalpha()]


def workload(queries: int, documents: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    return [(" ".join(rng.choices(WORDS, k=8)),
             [" ".join(rng.choices(WORDS, k=rng.randint(20, 120))) for _ in range(documents)])
            for _ in range(queries)]


def post(base: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}/v1/rerank", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def drive(base: str, work: list[tuple[str, list[str]]], clients: int) -> tuple[float, list[dict[int, float]]]:
    """Seconds to rank every query's documents with `clients` clients; each query's scores."""
    def rank(query_and_documents: tuple[str, list[str]]) -> dict[int, float]:
        query, documents = query_and_documents
        answer = post(base, {"query": query, "documents": documents})
        return {result["index"]: result["relevance_score"] for result in answer["results"]}

    post(base, {"query": work[0][0], "documents": work[0][1][:2]})  # warm-up
    started = time.perf_counter()
    scores = peers.each_by_clients(clients, work, rank)
    return time.perf_counter() - started, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a reranker GGUF (default: a tiny BERT cross-encoder)")
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    tools = peers.ensure_llama_tools(log=lambda line: print(line, file=sys.stderr))
    work = workload(args.queries, args.documents)
    figures = {}
    with tempfile.TemporaryDirectory(prefix="multiseq-rerank-") as folder:
        model = Path(args.model) if args.model else tiny_bert(Path(folder) / "reranker.gguf", pooling="rank",
                                                               rank_head=True)
        commands = {
            "llama-server": [str(tools.server), "-m", str(model), "--reranking", "-np", str(args.parallel),
                             "-c", str(args.parallel * 512), "-ub", "1024", "-b", "1024", "-t", str(args.threads),
                             "--host", "127.0.0.1", "--port", "{port}", "--no-webui", "--log-verbosity", "2"],
            "multiseq": [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", str(model), "-np",
                         str(args.parallel), "--slot-ctx", "512", "-t", str(args.threads), "--port", "{port}",
                         "-b", "1024", "--no-dashboard", "--max-queue", "4096"],
        }
        all_scores = {}
        for system, command in commands.items():
            port = peers._free_port()
            process, base = peers.start_server([part.replace("{port}", str(port)) for part in command],
                                               Path(folder) / f"{system}.log", port)
            try:
                seconds, all_scores[system] = drive(base, work, args.clients)
            finally:
                peers._stop(process)
            ranked = args.queries * args.documents
            figures[system] = {"seconds": round(seconds, 2), "documents_per_s": round(ranked / seconds, 1)}
            print(f"{system}: {ranked} documents in {seconds:.2f} s, {ranked / seconds:.1f} documents/s", flush=True)
    largest = max(abs(all_scores["multiseq"][query][index] - all_scores["llama-server"][query][index])
                  for query in range(len(work)) for index in all_scores["multiseq"][query])
    ratio = figures["multiseq"]["documents_per_s"] / figures["llama-server"]["documents_per_s"]
    print(f"multiseq / llama-server: {ratio:.2f}x; largest score difference {largest:.2e}", flush=True)
    print(json.dumps({"model": str(args.model or "tiny BERT reranker"), "queries": args.queries,
                      "documents": args.documents, "clients": args.clients, "parallel": args.parallel,
                      "figures": figures, "ratio": round(ratio, 3), "largest_score_difference": largest}))


if __name__ == "__main__":
    main()
