"""Benchmark suite: multiseq and its peers on the same workloads, in one run.

Usage (from the repository root, in the project's virtual environment):

    python bench/suite.py                                  # every system, model and workload
    python bench/suite.py --systems multiseq --parallel 1,8,16 --workloads short-greedy
    python bench/suite.py --models gemma3-270m --systems multiseq,llama-server

Systems: multiseq (at each --parallel), llama-server (-np 8 and 16, as many concurrent
clients), llama-cpp-python (its `Llama`, one prompt after another), llama-batched-bench (the
raw decode ceiling). llama-server and llama-batched-bench are built once from the llama.cpp
sources vendored in the pinned llama-cpp-python sdist, into ~/.cache/multiseq.

Workloads: short-greedy (64 short prompts x 128 tokens, temperature 0), short-sampled (the
same with temperature 0.8, top_k 40, top_p 0.95), long-greedy (64 prompts of 200-400 tokens x
64 tokens). Every request generates exactly its token budget (EOS ignored), with the same
threads for every system.

Progress goes to stderr; each figure is printed as it is measured; the last line printed is
one JSON object with every figure and the ratios of multiseq against each peer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import models  # noqa: E402
from bench.workloads import Workload, standard_workloads  # noqa: E402
from runner import Request, Runner, RunnerConfig, SamplingParams  # noqa: E402
from runner.backend import LlamaBackend, LlamaModel  # noqa: E402

ALL_SYSTEMS = ("multiseq", "llama-server", "llama-cpp-python", "llama-batched-bench")
SLOT_CTX = 1024  # per slot: the longest workload needs ~470 tokens (prompt + generation)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def request_seed(workload: Workload, index: int) -> int | None:
    """Sampled workloads give request i the seed base + i on every system."""
    base = workload.sampling.get("seed")
    return None if base is None else base + index


def _percentile(values: list[float], percent: float) -> float | None:
    return float(np.percentile(values, percent)) if values else None


def multiseq_requests(workload: Workload) -> list[Request]:
    fields = {key: value for key, value in workload.sampling.items() if key != "seed"}
    return [Request(prompt=prompt, id=f"b{index}",
                    sampling=SamplingParams(max_tokens=workload.max_tokens, ignore_eos=True,
                                            seed=request_seed(workload, index), **fields))
            for index, prompt in enumerate(workload.prompts)]


def run_multiseq(model: LlamaModel, workload: Workload, parallel: int, threads: int) -> dict:
    """One workload through a fresh runner: aggregate rate, TTFT, and the step profile."""
    backend = LlamaBackend(model, parallel, SLOT_CTX, max(512, parallel), threads)
    config = RunnerConfig(model=model.path, parallel=parallel, slot_ctx=SLOT_CTX, n_batch=max(512, parallel),
                          threads=threads, seed=0)
    with Runner(config, backend=backend) as runner:
        runner.run_batch([Request(prompt="Warm up.", sampling=SamplingParams(max_tokens=4))])
        runner.reset_stats()
        started = time.perf_counter()
        results = runner.run_batch(multiseq_requests(workload))
        wall = time.perf_counter() - started
        stats = runner.stats()
    assert all(r.ok and r.completion_tokens == workload.max_tokens for r in results), "every request ran in full"
    generated = sum(r.completion_tokens for r in results)
    ttfts = [r.timings.ttft_s for r in results]
    phase_total = sum(stats.phase_seconds.values())
    return {
        "system": "multiseq",
        "parallel": parallel,
        "num_requests": len(results),
        "generated_tokens": generated,
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "wall_s": wall,
        "tokens_per_s": generated / wall,
        "ttft_p50_s": _percentile(ttfts, 50),
        "ttft_p95_s": _percentile(ttfts, 95),
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "prefill_tokens_per_s": stats.prefill_tokens_per_s,
        "avg_seqs_per_decode_step": stats.avg_seqs_per_decode_step,
        "step_profile_share": {phase: seconds / phase_total for phase, seconds in stats.phase_seconds.items()},
        "outside_decode_share": stats.outside_decode_share,
    }


def _figure_line(model_name: str, workload: str, figure: dict) -> str:
    label = figure["system"] + (f" -np {figure['parallel']}" if "parallel" in figure else "")
    extra = ""
    if figure.get("outside_decode_share") is not None:
        extra = f", outside decode {100 * figure['outside_decode_share']:.1f}%"
    return (f"{model_name:13} {workload:14} {label:28} {figure['tokens_per_s']:7.1f} tok/s  "
            f"wall {figure['wall_s']:6.2f} s  ttft p50 {figure['ttft_p50_s']:.2f} s{extra}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m")
    parser.add_argument("--workloads", default="short-greedy,short-sampled,long-greedy")
    parser.add_argument("--parallel", default="1,8,16,32", help="multiseq slot counts")
    parser.add_argument("--server-parallel", default="8,16", help="llama-server slot counts")
    parser.add_argument("--prompts", type=int, default=64, help="requests per workload")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    systems = args.systems.split(",")
    workloads = standard_workloads(args.prompts)
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "threads": args.threads,
        "results": {},
    }
    for model_name in args.models.split(","):
        resolved = models.resolve(model_name)
        model = LlamaModel(str(resolved.path), chat_template_fallback=resolved.chat_template_fallback)
        for workload_name in args.workloads.split(","):
            workload = workloads[workload_name]
            figures = []
            if "multiseq" in systems:
                for parallel in (int(p) for p in args.parallel.split(",")):
                    log(f"[{model_name} {workload_name}] multiseq -np {parallel} ...")
                    figures.append(run_multiseq(model, workload, parallel, args.threads))
                    print(_figure_line(model_name, workload_name, figures[-1]), flush=True)
            report["results"].setdefault(model_name, {})[workload_name] = figures
        model.close()
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
