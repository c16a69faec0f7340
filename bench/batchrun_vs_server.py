"""The whole `multiseq batch-run` command against llama-server on the same prompts, in turn.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/batchrun_vs_server.py --model gemma3-270m --parallel 16 --rounds 2
    python bench/batchrun_vs_server.py --sampling greedy --rounds 1 --prompts 16

Workload (issue 42's): --prompts short distinct prompts (bench/workloads.py's short prompts, sent
as plain completion prompts) x --max-tokens tokens, end of generation ignored, greedy or sampled
(top-k 40, top-p 0.95, temperature 0.8), at --parallel slots. multiseq: the whole command,
`multiseq batch-run PROMPTS -o OUT -np N -n M --ignore-eos ...`, timed from its start to its
exit (start-up, model load and writing the results included). llama-server: built from the
llama.cpp that llama-cpp-python vendors (bench/peers.py), -np N with N streaming clients, timed
from the first request to the last token (its start-up and model load not counted). Each
round runs both systems for each sampling, one after the other, so that drifts of the
machine's speed touch both. Generated tokens per second and multiseq / llama-server are
printed per round, then per sampling over all rounds (the ratio of the summed times, the
median round, the spread); the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path
from workloads import short_prompts

from multiseq.models import resolve

SAMPLINGS = {
    "greedy": ({"temperature": 0.0}, ["--temperature", "0"]),
    "sampled": ({"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.0},
                ["--temperature", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0"]),
}


def run_batch_run(prompts_file: Path, out: Path, args, sampling_flags: list[str]) -> float:
    """Generated tokens per second of the whole batch-run command."""
    command = [sys.executable, "-m", "multiseq.cli.main", "batch-run", str(prompts_file), "-o", str(out),
               "-m", args.model, "-np", str(args.parallel), "-n", str(args.max_tokens), "--ignore-eos",
               "-t", str(args.threads), "--slot-ctx", str(args.slot_ctx), *sampling_flags]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    generated = sum(json.loads(line)["completion_tokens"] for line in out.read_text().splitlines())
    assert generated == args.prompts * args.max_tokens, f"batch-run generated {generated} tokens"
    return generated / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--slot-ctx", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sampling", default="greedy,sampled")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    tools = peers.ensure_llama_tools(log=lambda line: print(line, file=sys.stderr))
    model_path = resolve(args.model).path
    prompts = short_prompts(args.prompts)
    figures: dict[str, list[dict]] = {name: [] for name in args.sampling.split(",")}
    with tempfile.TemporaryDirectory(prefix="multiseq-vs-server-") as tmp:
        prompts_file = Path(tmp) / "prompts.jsonl"
        prompts_file.write_text("".join(json.dumps({"id": str(index), "prompt": prompt}) + "\n"
                                        for index, prompt in enumerate(prompts)))
        for round_number in range(args.rounds):
            for name in figures:
                server_sampling, flags = SAMPLINGS[name]
                multiseq = run_batch_run(prompts_file, Path(tmp) / "out.jsonl", args, flags)
                server = peers.run_llama_server(tools, model_path, prompts, args.max_tokens, args.parallel,
                                                args.threads, args.slot_ctx, server_sampling,
                                                log=lambda line: print(line, file=sys.stderr),
                                                seeds=list(range(len(prompts))))["tokens_per_s"]
                figures[name].append({"round": round_number + 1, "multiseq_tok_s": round(multiseq, 1),
                                      "llama_server_tok_s": round(server, 1), "ratio": round(multiseq / server, 3)})
                print(f"round {round_number + 1} {name}: batch-run {multiseq:.1f} tok/s, llama-server {server:.1f} "
                      f"tok/s, {multiseq / server:.2f}x", flush=True)
    overall = {name: overall_ratios(rounds) for name, rounds in figures.items() if rounds}
    for name, ratios in overall.items():
        print(f"{name}, all {len(figures[name])} rounds: {ratios['whole_run']:.3f}x over the whole run, "
              f"median round {ratios['median_round']:.3f}x, rounds {ratios['lowest_round']:.2f}-"
              f"{ratios['highest_round']:.2f}x", flush=True)
    print(json.dumps({"model": args.model, "parallel": args.parallel, "prompts": args.prompts,
                      "max_tokens": args.max_tokens, "threads": args.threads, "figures": figures,
                      "overall": overall}))


def overall_ratios(rounds: list[dict]) -> dict[str, float]:
    """multiseq / llama-server over every round of one sampling: as one run (the same tokens in
    each round, so the ratio of the rounds' summed times), the median round, and the spread.
    llama-server's own rate moves by about 5% from round to round on a 2-core machine, which a
    single round's ratio carries whole."""
    ratios = sorted(figure["ratio"] for figure in rounds)
    whole_run = sum(1 / figure["llama_server_tok_s"] for figure in rounds) / \
        sum(1 / figure["multiseq_tok_s"] for figure in rounds)
    return {"whole_run": round(whole_run, 3), "median_round": round(statistics.median(ratios), 3),
            "lowest_round": ratios[0], "highest_round": ratios[-1]}


if __name__ == "__main__":
    main()
