"""Benchmark of real-world JSON schemas: a fixed sample of JSONSchemaBench, multiseq against
llama-server's json_schema.

Usage (from the repository root, in the project's virtual environment):

    python bench/schemabench.py                          # SmolLM2, -np 8, greedy, 384 tokens, 60 schemas
    python bench/schemabench.py --limit 3 --max-tokens 16 --systems multiseq  # a quick end-to-end check
    python bench/schemabench.py --make-sample ~/src/jsonschemabench         # rebuild the sample file

The sample (bench/jsonschemabench_sample.jsonl, one schema per line with its collection and
file name) is 6 schemas from each of JSONSchemaBench's 10 collections (the data/ folder of
github.com/guidance-ai/jsonschemabench, commit ba103c73): in each collection, the 6 files whose
"collection/file" has the smallest SHA-256. --make-sample applies that rule to a checkout.

Every schema is one chat request, rendered once with the model's template so that both systems
get the same text: a system message asking for JSON, and a user message with the schema
(minified, cut at PROMPT_SCHEMA_CHARS characters). Systems:

  multiseq      each request as a JSON line with the schema, read as batch-run reads it (the
                schema is compiled then: a schema that cannot be is refused there) and submitted
                to a Runner as it is read, at -np N
  llama-server  the same prompts through POST /completion with the same "json_schema", from N
                concurrent clients, at -np N (built once from the pinned llama.cpp sources)

Greedy, up to --max-tokens, no ignore_eos. For each system: schemas refused, outputs that ended
by themselves, how many of those validate against their schema, outputs returned as valid that
do not validate, and the wall time from the first request to the last result (model loading and a
warm-up request excluded; multiseq's compiling of the schemas included, as llama-server's is).
Outputs are validated by multiseq.sampling.schema_check.SchemaCheck for both systems (jsonschema: the
schema's draft, formats checked where jsonschema can, a repeated key is invalid). multiseq returns
an output that does not validate as failed (schema_error); llama-server returns every output
that ended as a success.

Progress goes to stderr; one line per system; the last line printed is one JSON object with every
figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path

from multiseq import FinishReason, Request, Runner, RunnerConfig, SamplingParams
from multiseq.formats.reader import parse_jsonl_line
from multiseq.llama.backend import LlamaModel
from multiseq.loading import open_model
from multiseq.sampling.schema_check import SchemaCheck

ALL_SYSTEMS = ("multiseq", "llama-server")
SAMPLE = Path(__file__).resolve().parent / "jsonschemabench_sample.jsonl"
PER_COLLECTION = 6
SLOT_CTX = 2048  # the prompt (at most ~700 tokens) and 384 generated tokens fit
PROMPT_SCHEMA_CHARS = 1500
SYSTEM_PROMPT = "You are a helpful assistant. Answer with one JSON document only."
REQUEST_TIMEOUT_S = 900.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the sample ---------------------------------------------------------------------------------

def make_sample(checkout: Path, out: Path = SAMPLE) -> None:
    """Write the sample from a JSONSchemaBench checkout (its data/ folder): in each collection,
    sorted by name, the PER_COLLECTION files whose "collection/file" has the smallest SHA-256."""
    data = checkout / "data"
    lines = []
    for collection in sorted(path.name for path in data.iterdir() if path.is_dir()):
        names = sorted((path.name for path in (data / collection).iterdir() if path.suffix == ".json"),
                       key=lambda name: hashlib.sha256(f"{collection}/{name}".encode()).hexdigest())
        for name in names[:PER_COLLECTION]:
            schema = json.loads((data / collection / name).read_text(encoding="utf-8"))
            lines.append(json.dumps({"collection": collection, "name": name, "schema": schema},
                                    ensure_ascii=False, separators=(",", ":")))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log(f"wrote {len(lines)} schemas to {out}")


def load_sample(limit: int | None) -> list[dict]:
    entries = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return entries[:limit] if limit else entries


def messages_for(schema: dict) -> tuple[dict, ...]:
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    if len(text) > PROMPT_SCHEMA_CHARS:
        text = text[:PROMPT_SCHEMA_CHARS] + " ..."
    return ({"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Write a JSON document that follows this JSON schema:\n{text}"})


# --- figures ------------------------------------------------------------------------------------

def figures(system: str, outcomes: list[dict], wall_s: float, entries: list[dict]) -> dict:
    """Counts over the per-schema outcomes: {refused, ended, returned_valid, text, tokens}."""
    checks = [SchemaCheck(entry["schema"]) for entry in entries]
    ended = [index for index, outcome in enumerate(outcomes) if outcome["ended"]]
    valid = [index for index in ended if checks[index].error(outcomes[index]["text"]) is None]
    returned_invalid = [index for index in ended
                        if outcomes[index]["returned_valid"] and index not in valid]
    flagged = [index for index in ended if not outcomes[index]["returned_valid"]]
    generated = sum(outcome["tokens"] for outcome in outcomes)
    return {
        "system": system, "num_schemas": len(outcomes),
        "refused": sum(outcome["refused"] for outcome in outcomes),
        "ended": len(ended), "valid": len(valid),
        "returned_valid_but_invalid": len(returned_invalid),
        "flagged_invalid": len(flagged),
        "wall_s": wall_s, "generated_tokens": generated, "tokens_per_s": generated / wall_s if wall_s else None,
        "schemas": [{"schema": f"{entry['collection']}/{entry['name']}", **outcome, "valid": index in valid}
                    for index, (entry, outcome) in enumerate(zip(entries, outcomes))],
    }


# --- multiseq -----------------------------------------------------------------------------------

def run_multiseq(model: LlamaModel, prompts: list[str], entries: list[dict], args: argparse.Namespace) -> dict:
    config = RunnerConfig(model=model.path, parallel=args.parallel, slot_ctx=SLOT_CTX,
                          n_batch=max(512, args.parallel), threads=args.threads, seed=0)
    defaults = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    lines = [json.dumps({"id": str(index), "prompt": prompt, "json_schema": entry["schema"]})
             for index, (prompt, entry) in enumerate(zip(prompts, entries))]
    with Runner.on_model(model, config) as runner:
        # Builds llguidance's view of the vocabulary (once per model), as llama-server's warm-up
        # request warms it; no schema of the sample is compiled by it.
        runner.run_batch([Request(prompt=prompts[0], sampling=SamplingParams(max_tokens=2, temperature=0,
                                                                              json_object=True))])
        started = time.perf_counter()
        items, handles = [], []
        for number, line in enumerate(lines, start=1):  # read and submitted as batch-run does
            item = parse_jsonl_line(line, number, defaults)
            items.append(item)
            handles.append(runner.submit(item.request) if item.is_valid else None)
        results = [handle.result() if handle is not None else None for handle in handles]
        wall = time.perf_counter() - started
    outcomes = []
    for item, result in zip(items, results):
        refused = result is None or result.is_invalid_request
        ended = not refused and result.finish_reason is FinishReason.STOP
        outcomes.append({"refused": refused, "ended": ended, "returned_valid": ended and result.ok,
                         "text": "" if refused else result.text, "tokens": 0 if refused else result.completion_tokens,
                         "error": item.error if result is None else (result.error or result.schema_error),
                         "approximated": [] if result is None else list(result.approximated)})
    return figures("multiseq", outcomes, wall, entries)


# --- llama-server -------------------------------------------------------------------------------

def _complete(base: str, prompt: str, schema: dict, max_tokens: int) -> dict:
    """One non-streamed POST /completion with the schema; a refusal (an HTTP error naming the
    schema) is an outcome, not an exception."""
    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "cache_prompt": False,
            "json_schema": schema}
    request = urllib.request.Request(base + "/completion", data=json.dumps(body).encode(),
                                      headers={"Content-Type": "application/json"}, method="POST")
    try:
        with peers._HTTP.open(request, timeout=REQUEST_TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        message = error.read().decode("utf-8", "replace")
        return {"refused": True, "ended": False, "returned_valid": False, "text": "", "tokens": 0,
                "error": f"HTTP {error.code}: {message[:300]}", "approximated": []}
    ended = answer.get("stop_type") != "limit"
    return {"refused": False, "ended": ended, "returned_valid": ended, "text": answer.get("content", ""),
            "tokens": int(answer.get("tokens_predicted", 0)), "error": None, "approximated": []}


def run_server(model: LlamaModel, prompts: list[str], entries: list[dict], args: argparse.Namespace) -> dict:
    tools = peers.ensure_llama_tools(log=log)
    port = peers._free_port()
    base = f"http://127.0.0.1:{port}"
    command = peers.server_command(tools, model.path, args.parallel, args.threads, SLOT_CTX, port)
    work: queue.Queue = queue.Queue()
    outcomes: list[dict | None] = [None] * len(prompts)
    with tempfile.TemporaryDirectory(prefix="multiseq-schemabench-") as folder:
        log_path = Path(folder) / "server.log"
        log("$ " + " ".join(command))
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            peers._wait_healthy(process, base)
            _complete(base, prompts[0], {"type": "object"}, 2)  # warm-up, not measured
            for index in range(len(prompts)):
                work.put(index)

            def client() -> None:
                while True:
                    try:
                        index = work.get_nowait()
                    except queue.Empty:
                        return
                    outcomes[index] = _complete(base, prompts[index], entries[index]["schema"], args.max_tokens)

            started = time.perf_counter()
            clients = [threading.Thread(target=client, daemon=True) for _ in range(args.parallel)]
            for thread in clients:
                thread.start()
            for thread in clients:
                thread.join()
            wall = time.perf_counter() - started
        except Exception as error:
            raise RuntimeError(f"llama-server run failed: {error}\n--- server log tail ---\n"
                               f"{peers._tail(log_path)}") from error
        finally:
            peers._stop(process)
    missing = [index for index, outcome in enumerate(outcomes) if outcome is None]
    if missing:
        raise RuntimeError(f"llama-server: no answer for schemas {missing[:10]}")
    return figures("llama-server", outcomes, wall, entries) | {"command": " ".join(command)}


# --- main ---------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--parallel", type=int, default=8, help="slots for multiseq and llama-server")
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--limit", type=int, default=None, help="only the first N schemas of the sample")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--make-sample", type=Path, metavar="CHECKOUT",
                        help="write the sample file from a JSONSchemaBench checkout, and run nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.make_sample is not None:
        make_sample(args.make_sample)
        return None
    systems = args.systems.split(",")
    unknown = sorted(set(systems) - set(ALL_SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {', '.join(ALL_SYSTEMS)}")
    entries = load_sample(args.limit)
    model = open_model(args.model)
    prompts = [model.render_chat(messages_for(entry["schema"])) for entry in entries]
    results: dict[str, dict] = {}
    try:
        for system in systems:
            log(f"[{args.model}] {system} -np {args.parallel}, {len(entries)} schemas, up to {args.max_tokens} tokens ...")
            run = run_server if system == "llama-server" else run_multiseq
            results[system] = figure = run(model, prompts, entries, args)
            print(f"{args.model:13} {system:12} -np {args.parallel:<3} refused {figure['refused']:3}  "
                  f"ended {figure['ended']:3}  valid {figure['valid']:3}  "
                  f"returned as valid but invalid {figure['returned_valid_but_invalid']:3}  "
                  f"wall {figure['wall_s']:7.1f} s", flush=True)
    finally:
        model.close()
    report = {"model": args.model, "parallel": args.parallel, "threads": args.threads, "max_tokens": args.max_tokens,
              "num_schemas": len(entries), "sample": SAMPLE.name, "figures": results}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
