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
64 tokens), shared-prefix (64 chats sharing a ~440-token system prompt, ~60 tokens of their
own, x 48 tokens greedy, rendered with the model's template and sent as the same text to
every system; llama-server runs it with its default prompt cache and with caching off, and
multiseq also without its prefix cache). Every request generates exactly its token budget
(EOS ignored), with the same threads for every system. On greedy workloads, the greedy texts
of llama-server (prompt cache on) and of multiseq without prefix reuse are compared with
multiseq's, request by request.

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

import numpy as np

import peers  # bench/ is the script's own folder, first on sys.path
from workloads import Workload, short_prompts, standard_workloads

from multiseq import Request, Runner, RunnerConfig, SamplingParams
from multiseq.formats.summary import percentile
from multiseq.llama.backend import LlamaModel
from multiseq.loading import open_model

ALL_SYSTEMS = ("multiseq", "multiseq-invariant", "llama-server", "llama-cpp-python", "llama-batched-bench", "memory")
SHARED_PREFIX = "shared-prefix"
SAME_PARALLELISM_PEERS = ("llama-server", "llama-server prompt-cache", "multiseq no-prefix-cache",
                          "multiseq batch-invariant")
# Compared with multiseq's greedy text, request by request (a speed-up must not change it).
GREEDY_TEXT_PEERS = ("llama-server prompt-cache", "multiseq no-prefix-cache")
SLOT_CTX = 1024  # per slot: the longest workload needs ~470 tokens (prompt + generation)
MEMORY_CHECKPOINT = 200


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def request_seed(workload: Workload, index: int) -> int | None:
    """Sampled workloads give request i the seed base + i on every system."""
    base = workload.sampling.get("seed")
    return None if base is None else base + index


def multiseq_requests(workload: Workload) -> list[Request]:
    fields = {key: value for key, value in workload.sampling.items() if key != "seed"}
    return [Request(prompt=prompt, id=f"b{index}",
                    sampling=SamplingParams(max_tokens=workload.max_tokens, ignore_eos=True,
                                            seed=request_seed(workload, index), **fields))
            for index, prompt in enumerate(workload.prompts)]


def run_multiseq(model: LlamaModel, workload: Workload, parallel: int, threads: int,
                 prefix_cache: bool = True, batch_invariant: bool = False) -> dict:
    """One workload through a fresh runner: aggregate rate, TTFT, and the step profile."""
    config = RunnerConfig(model=model.path, parallel=parallel, slot_ctx=SLOT_CTX, n_batch=max(512, parallel),
                          threads=threads, seed=0, prefix_cache=prefix_cache, batch_invariant=batch_invariant)
    with Runner.on_model(model, config) as runner:
        runner.run_batch([Request(prompt="Warm up.", sampling=SamplingParams(max_tokens=4))])
        runner.reset_stats()
        started = time.perf_counter()
        results = runner.run_batch(multiseq_requests(workload))
        wall = time.perf_counter() - started
        stats = runner.stats()
    assert all(r.ok and r.completion_tokens == workload.max_tokens for r in results), "every request ran in full"
    generated = sum(r.completion_tokens for r in results)
    ttfts = [r.timings.ttft_s for r in results]
    # All requests are queued at once, so TTFT includes the wait for a slot; llama-server's
    # clients send a request only when a slot's previous one is done. TTFT from admission is
    # the figure to hold against the server's.
    admitted_ttfts = [r.timings.ttft_s - r.timings.queue_wait_s for r in results]
    phase_total = sum(stats.phase_seconds.values())
    return {
        "system": "multiseq batch-invariant" if batch_invariant else
                  "multiseq" if prefix_cache else "multiseq no-prefix-cache",
        "parallel": parallel,
        "num_requests": len(results),
        "generated_tokens": generated,
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "wall_s": wall,
        "tokens_per_s": generated / wall,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "ttft_from_admission_p50_s": percentile(admitted_ttfts, 50),
        "ttft_from_admission_p95_s": percentile(admitted_ttfts, 95),
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "prefill_tokens_per_s": stats.prefill_tokens_per_s,
        "avg_seqs_per_decode_step": stats.avg_seqs_per_decode_step,
        "step_profile_share": {phase: seconds / phase_total for phase, seconds in stats.phase_seconds.items()},
        "outside_decode_share": stats.outside_decode_share,
        "prompt_tokens_computed": stats.prompt_tokens,
        "prompt_tokens_reused": stats.prompt_tokens_reused,
        "prefix_hit_rate": stats.prefix_hit_rate,
        "texts": [r.text for r in results],
    }


def resident_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run_memory(model: LlamaModel, parallel: int, threads: int, num_requests: int, checkpoint: int) -> dict:
    """Resident memory at request `checkpoint` and at the last of a long run of short requests:
    a runner that leaks per request grows between the two."""
    prompts = short_prompts(num_requests)
    marks: dict[int, float] = {}
    finished = 0

    def on_finish(_result) -> None:
        nonlocal finished
        finished += 1
        if finished in (checkpoint, num_requests):
            marks[finished] = resident_mb()

    config = RunnerConfig(model=model.path, parallel=parallel, slot_ctx=SLOT_CTX, threads=threads, seed=0)
    with Runner.on_model(model, config) as runner:
        handles = [runner.submit(Request(prompt=prompt, sampling=SamplingParams(max_tokens=16, seed=index)),
                                 on_finish=on_finish)
                   for index, prompt in enumerate(prompts)]
        for handle in handles:
            handle.result()
        del handles
    growth = marks[num_requests] / marks[checkpoint] - 1
    return {"system": "multiseq memory", "parallel": parallel, "num_requests": num_requests,
            "checkpoint_request": checkpoint, "rss_mb_at_checkpoint": marks[checkpoint],
            "rss_mb_at_end": marks[num_requests], "rss_growth": growth}


def request_seeds(workload: Workload) -> list[int | None]:
    return [request_seed(workload, index) for index in range(len(workload.prompts))]


def peer_sampling(workload: Workload) -> dict:
    return {key: value for key, value in workload.sampling.items() if key != "seed"}


def run_peers(systems: list[str], model: LlamaModel, workload: Workload, args: argparse.Namespace):
    """The peers on the same workload, one figure at a time: llama-server, sequential
    llama-cpp-python, and the batched-bench ceiling (greedy workloads only: it does not sample)."""
    needs_tools = {"llama-server", "llama-batched-bench"} & set(systems)
    tools = peers.ensure_llama_tools(log=log) if needs_tools else None
    if "llama-server" in systems:
        # The shared-prefix workload is what llama-server's own prompt cache is for: it runs
        # with its defaults (cache on) as well as with every kind of prompt caching off.
        caches = (True, False) if workload.name == SHARED_PREFIX else (False,)
        for parallel in (int(p) for p in args.server_parallel.split(",")):
            for prompt_cache in caches:
                log(f"[{workload.name}] llama-server -np {parallel} prompt cache {'on' if prompt_cache else 'off'} ...")
                yield peers.run_llama_server(tools, model.path, workload.prompts, workload.max_tokens, parallel,
                                             args.threads, SLOT_CTX, peer_sampling(workload), log=log,
                                             seeds=request_seeds(workload), prompt_cache=prompt_cache)
    if "llama-cpp-python" in systems:
        log(f"[{workload.name}] llama-cpp-python sequential ...")
        reference = peers.open_reference_llama(model.path, SLOT_CTX, args.threads)
        try:
            yield peers.run_sequential_llama(reference, workload.prompts, workload.max_tokens, peer_sampling(workload),
                                             banned_tokens=model.end_of_generation_tokens(),
                                             seeds=request_seeds(workload))
        finally:
            reference.close()
    if "llama-batched-bench" in systems and workload.is_greedy:
        batch_sizes = sorted({int(p) for p in args.parallel.split(",")} | {int(p) for p in args.server_parallel.split(",")})
        prompt_tokens = round(np.mean([len(model.tokenize(prompt)) for prompt in workload.prompts]))
        log(f"[{workload.name}] llama-batched-bench B={batch_sizes} ...")
        yield peers.run_batched_bench(tools, model.path, batch_sizes, prompt_tokens, workload.max_tokens,
                                      args.threads, log=log)


def run_systems(systems: list[str], model: LlamaModel, workload: Workload, args: argparse.Namespace):
    """multiseq at each --parallel (and, on the shared-prefix workload, without its prefix
    cache at the largest server parallelism), then the peers."""
    if "multiseq" in systems:
        for parallel in (int(p) for p in args.parallel.split(",")):
            log(f"[{workload.name}] multiseq -np {parallel} ...")
            yield run_multiseq(model, workload, parallel, args.threads)
        if workload.name == SHARED_PREFIX:
            parallel = max(int(p) for p in args.server_parallel.split(","))
            log(f"[{workload.name}] multiseq -np {parallel} --no-prefix-cache ...")
            yield run_multiseq(model, workload, parallel, args.threads, prefix_cache=False)
    if "multiseq-invariant" in systems:
        parallel = max(int(p) for p in args.server_parallel.split(","))
        log(f"[{workload.name}] multiseq -np {parallel} --batch-invariant ...")
        unpacked = open_model(model.path, repack_weights=False)  # the workload is already rendered text
        try:
            yield run_multiseq(unpacked, workload, parallel, args.threads, batch_invariant=True)
        finally:
            unpacked.close()
    yield from run_peers(systems, model, workload, args)


def without_texts(figure: dict) -> dict:
    return {key: value for key, value in figure.items() if key != "texts"}


def greedy_text_matches(figures: list[dict]) -> dict[str, str]:
    """For each peer in GREEDY_TEXT_PEERS: how many of its texts equal multiseq's at the same
    parallelism, as "equal/total"."""
    ours = {f["parallel"]: f["texts"] for f in figures if f["system"] == "multiseq"}
    found = {}
    for figure in figures:
        if figure["system"] in GREEDY_TEXT_PEERS and figure["parallel"] in ours:
            equal = sum(a == b for a, b in zip(ours[figure["parallel"]], figure["texts"]))
            found[f"{figure['system']} np{figure['parallel']}"] = f"{equal}/{len(figure['texts'])}"
    return found


def ratios(figures: list[dict]) -> dict[str, float]:
    """multiseq's aggregate rate over each peer's, at the same parallelism where it has one."""
    ours = {f["parallel"]: f["tokens_per_s"] for f in figures if f["system"] == "multiseq"}
    found: dict[str, float] = {}
    for figure in figures:
        peer = figure["system"].replace("-", "_").replace(" ", "_")
        if figure["system"] in SAME_PARALLELISM_PEERS and figure["parallel"] in ours:
            found[f"multiseq_np{figure['parallel']}_vs_{peer}_np{figure['parallel']}"] = \
                ours[figure["parallel"]] / figure["tokens_per_s"]
        elif figure["system"] == "llama-cpp-python sequential":
            for parallel, rate in ours.items():
                found[f"multiseq_np{parallel}_vs_llama_cpp_python_sequential"] = rate / figure["tokens_per_s"]
        elif figure["system"] == "llama-batched-bench":
            for row in figure["rows"]:
                if row["batch"] in ours:
                    found[f"multiseq_np{row['batch']}_vs_batched_bench_tg_B{row['batch']}"] = \
                        ours[row["batch"]] / row["tg_tokens_per_s"]
    return found


def _figure_line(model_name: str, workload: str, figure: dict) -> str:
    if figure["system"] == "multiseq memory":
        return (f"{model_name:13} {workload:14} resident memory {figure['rss_mb_at_checkpoint']:.0f} MB at request "
                f"{figure['checkpoint_request']}, {figure['rss_mb_at_end']:.0f} MB at request {figure['num_requests']}: "
                f"{100 * figure['rss_growth']:+.1f}%")
    if figure["system"] == "llama-batched-bench":
        rows = ", ".join(f"B={row['batch']} {row['tg_tokens_per_s']:.1f}" for row in figure["rows"])
        return f"{model_name:13} {workload:14} llama-batched-bench decode tok/s: {rows}"
    label = figure["system"] + (f" -np {figure['parallel']}" if "parallel" in figure else "")
    extra = ""
    if figure.get("outside_decode_share") is not None:
        extra = (f" (from admission {figure['ttft_from_admission_p50_s']:.2f} s), "
                 f"outside decode {100 * figure['outside_decode_share']:.1f}%")
    return (f"{model_name:13} {workload:14} {label:28} {figure['tokens_per_s']:7.1f} tok/s  "
            f"wall {figure['wall_s']:6.2f} s  ttft p50 {figure['ttft_p50_s']:.2f} s{extra}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m")
    parser.add_argument("--workloads", default="short-greedy,short-sampled,long-greedy,shared-prefix")
    parser.add_argument("--parallel", default="1,8,16,32", help="multiseq slot counts")
    parser.add_argument("--server-parallel", default="8,16", help="llama-server slot counts")
    parser.add_argument("--prompts", type=int, default=64, help="requests per workload")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--memory-requests", type=int, default=2000, help="length of the memory run")
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
        model = open_model(model_name)
        for workload_name in args.workloads.split(","):
            workload = workloads[workload_name].rendered_for(model.render_chat)
            figures = []
            for figure in run_systems(systems, model, workload, args):
                figures.append(figure)
                print(_figure_line(model_name, workload_name, figure), flush=True)
            report["results"].setdefault(model_name, {})[workload_name] = {
                "figures": [without_texts(figure) for figure in figures], "ratios": ratios(figures),
                "greedy_text_matches": greedy_text_matches(figures) if workload.is_greedy else {}}
            for name, value in ratios(figures).items():
                print(f"{model_name:13} {workload_name:14} {name}: {value:.2f}", flush=True)
        if "memory" in systems:
            log(f"[{model_name}] memory over {args.memory_requests} requests at -np 16 ...")
            figure = run_memory(model, 16, args.threads, args.memory_requests, MEMORY_CHECKPOINT)
            report["results"].setdefault(model_name, {})["memory"] = figure
            print(_figure_line(model_name, "memory", figure), flush=True)
        model.close()
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
