"""Batch API benchmark: one OpenAI batch file through `multiseq serve`'s Batch API and through
`multiseq batch-run`, at the same model, -np, slot size and threads.

Usage (from the repository root, in the project's virtual environment with the test extras,
which bring the openai client; nothing else running):

    python bench/batchapi.py --lines 1000 --parallel 16 --max-tokens 32
    python bench/batchapi.py --interactive 20 --lines 400 --parallel 8 --max-tokens 64

The file holds --lines chat requests (distinct short instructions), each greedy and generating
exactly --max-tokens tokens (ignore_eos), so both runs do the same work. batch-run's time is its
own summary's wall time, first submission to last result (model loading excluded). The API's
time is what a client sees of a server whose model is loaded: upload, create, poll every
--poll seconds until completed, download the output. Both outputs are checked: every
custom_id once, every line a 200 of --max-tokens tokens. The last line printed is one JSON
object; `api_over_batch_run` is the API's wall time over batch-run's (the target: at most 1.1).

With --interactive N it measures priorities instead: the time to first token of N interactive
chats (streamed, one after another, 16 tokens each) on the idle server, then again while the
batch runs in the background; `busy_over_idle_ttft_p95` is the second p95 over the first (the
target: at most 1.5), and `preemptions` how many batch lines gave up their slot meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import peers  # bench/ is the script's own folder, first on sys.path
from load import APIS, send
from workloads import short_prompts

from multiseq import models

CHAT_URL = "/v1/chat/completions"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_batch_file(path: Path, lines: int, max_tokens: int, model: str) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for index, prompt in enumerate(short_prompts(lines)):
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True}
            handle.write(json.dumps({"custom_id": f"line-{index}", "method": "POST", "url": CHAT_URL,
                                     "body": body}) + "\n")


def check_output(lines: list[str], expected: int, max_tokens: int) -> int:
    """Every custom_id once, every line a 200 of max_tokens tokens; the tokens generated."""
    records = [json.loads(line) for line in lines]
    ids = {record["custom_id"] for record in records}
    if len(records) != expected or len(ids) != expected:
        raise RuntimeError(f"{len(records)} lines, {len(ids)} distinct custom_ids; expected {expected}")
    tokens = 0
    for record in records:
        response = record["response"]
        if response["status_code"] != 200 or response["body"]["usage"]["completion_tokens"] != max_tokens:
            raise RuntimeError(f"line {record['custom_id']} did not generate {max_tokens} tokens: {response}")
        tokens += response["body"]["usage"]["completion_tokens"]
    return tokens


def engine_args(args) -> list[str]:
    return ["-m", args.model, "-np", str(args.parallel), "--slot-ctx", str(args.slot_ctx), "-t", str(args.threads)]


def run_batch_run(source: Path, args, workdir: Path) -> dict:
    output, stats = workdir / "batch-run-output.jsonl", workdir / "batch-run-stats.json"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "multiseq.cli.main", "batch-run", str(source), "-o", str(output),
                    *engine_args(args), "--no-dashboard", "--stats-json", str(stats)],
                   check=True, stderr=subprocess.DEVNULL)
    process_s = time.perf_counter() - started
    summary = json.loads(stats.read_text())
    tokens = check_output(output.read_text().splitlines(), args.lines, args.max_tokens)
    return {"wall_s": summary["wall_s"], "process_s": process_s, "generated_tokens": tokens,
            "tokens_per_s": tokens / summary["wall_s"]}


@contextmanager
def serving(args, workdir: Path):
    """A multiseq serve process with its model loaded: (openai client, port); stopped after."""
    from openai import OpenAI

    port = peers._free_port()
    command = [sys.executable, "-m", "multiseq.cli.main", "serve", *engine_args(args), "--port", str(port),
               "--no-dashboard", "--data-dir", str(workdir / "data"),
               *(["--step-tokens", str(args.step_tokens)] if args.step_tokens else [])]
    log_path = workdir / "serve.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            peers._wait_healthy(process, f"http://127.0.0.1:{port}", timeout_s=300)
            yield OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0), port
        except (RuntimeError, OSError) as error:
            raise RuntimeError(f"{error}\n{peers._tail(log_path)}") from None
        finally:
            peers._stop(process)


def start_batch(client, source: Path):
    with source.open("rb") as handle:
        uploaded = client.files.create(file=handle, purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h")


def run_batch_api(source: Path, args, workdir: Path) -> dict:
    with serving(args, workdir) as (client, _):
        started = time.perf_counter()
        batch = start_batch(client, source)
        while batch.status not in ("completed", "failed", "cancelled"):
            time.sleep(args.poll)
            batch = client.batches.retrieve(batch.id)
        if batch.status != "completed" or batch.output_file_id is None:
            raise RuntimeError(f"the batch ended {batch.status}: {batch.errors}")
        lines = client.files.content(batch.output_file_id).text.splitlines()
        wall_s = time.perf_counter() - started
    tokens = check_output(lines, args.lines, args.max_tokens)
    return {"wall_s": wall_s, "generated_tokens": tokens, "tokens_per_s": tokens / wall_s}


def interactive_ttfts(port: int, model: str, count: int, offset: int) -> list[float]:
    """Time to first token of `count` streamed chats sent one after another."""
    ttfts = []
    for prompt in short_prompts(offset + count)[offset:]:
        chat = [{"role": "user", "content": f"In one sentence: {prompt}"}]
        exchange = asyncio.run(send("127.0.0.1", port, APIS["chat"], chat, 16, model))
        ttfts.append(exchange.ttft)
    return ttfts


def run_interactive_beside_batch(source: Path, args, workdir: Path, model: str) -> dict:
    with serving(args, workdir) as (client, port):
        idle = interactive_ttfts(port, model, args.interactive, offset=10_000)
        batch = start_batch(client, source)
        while client.batches.retrieve(batch.id).request_counts.completed < args.parallel:
            time.sleep(args.poll)  # the batch holds every slot
        busy = interactive_ttfts(port, model, args.interactive, offset=20_000)
        counts = client.batches.retrieve(batch.id).request_counts
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        client.batches.cancel(batch.id)
    preemptions = next((float(line.split()[-1]) for line in metrics.splitlines()
                        if line.startswith("multiseq_preemptions_total")), None)
    figures = {"idle_ttft_p50_s": float(np.percentile(idle, 50)), "idle_ttft_p95_s": float(np.percentile(idle, 95)),
               "busy_ttft_p50_s": float(np.percentile(busy, 50)), "busy_ttft_p95_s": float(np.percentile(busy, 95)),
               "batch_lines_done_meanwhile": counts.completed, "preemptions": preemptions}
    figures["busy_over_idle_ttft_p95"] = figures["busy_ttft_p95_s"] / figures["idle_ttft_p95_s"]
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--model", default=models.DEFAULT_MODEL)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--slot-ctx", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--poll", type=float, default=0.1, help="seconds between two GET /v1/batches/{id}")
    parser.add_argument("--step-tokens", type=int, default=None, help="multiseq serve's --step-tokens (default: its own)")
    parser.add_argument("--interactive", type=int, default=0,
                        help="measure this many interactive chats' TTFT, idle and beside the batch, instead")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model = models.resolve(args.model).name
    with tempfile.TemporaryDirectory(prefix="multiseq-batchapi-") as tmp:
        workdir = Path(tmp)
        source = workdir / "batch.jsonl"
        write_batch_file(source, args.lines, args.max_tokens, model)
        if args.interactive:
            log(f"{args.interactive} interactive chats, idle, then beside a {args.lines}-line batch, -np {args.parallel} ...")
            report = {"model": model, "lines": args.lines, "parallel": args.parallel, "threads": args.threads,
                      **run_interactive_beside_batch(source, args, workdir, model)}
            print(json.dumps(report))
            return report
        log(f"batch-run: {args.lines} lines, -np {args.parallel}, {args.max_tokens} tokens each ...")
        batch_run = run_batch_run(source, args, workdir)
        log(f"  {batch_run['wall_s']:.2f} s, {batch_run['tokens_per_s']:.1f} tokens/s")
        log("the Batch API of multiseq serve, same file ...")
        batch_api = run_batch_api(source, args, workdir)
        log(f"  {batch_api['wall_s']:.2f} s, {batch_api['tokens_per_s']:.1f} tokens/s")
    report = {"model": model, "lines": args.lines, "parallel": args.parallel, "threads": args.threads,
              "max_tokens": args.max_tokens, "batch_run": batch_run, "batch_api": batch_api,
              "api_over_batch_run": batch_api["wall_s"] / batch_run["wall_s"]}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
