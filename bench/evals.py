"""lm-evaluation-harness against `multiseq serve`, as its users run it: `local-completions`
with the server's own tokenizer (`tokenizer_backend=remote`), a local multiple-choice task
(scored by loglikelihood: echo with logprobs) and a generate_until task, at 1 and at N
concurrent requests. Every loglikelihood is checked against a one-sequence reference,
llama-cpp-python's `Llama(logits_all=True)` on the same tokens.

    python bench/evals.py [--model smollm2-135m] [--questions 60] [--concurrent 16]

Needs `pip install 'lm_eval[api]==0.4.13'` (and llama-cpp-python, which multiseq installs).
Runs offline: the tasks' data are local JSON files (HF_DATASETS_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import _free_port, _stop, _tail, _wait_healthy, open_reference_llama  # noqa: E402

MULTISEQ = str(Path(sys.executable).parent / "multiseq")  # the command, beside this Python
MC_TASK = """task: arith_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
fewshot_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
GEN_TASK = """task: arith_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def write_tasks(folder: Path, questions: int) -> None:
    """Sums with four answers each (the same questions every run)."""
    rng = random.Random(0)
    with open(folder / "arith.jsonl", "w") as data:
        for _ in range(questions):
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            wrong = rng.sample([x for x in range(a + b - 5, a + b + 6) if x != a + b and x > 0], 3)
            choices = [str(x) for x in [a + b, *wrong]]
            rng.shuffle(choices)
            data.write(json.dumps({"question": f"What is {a} plus {b}?", "choices": choices,
                                   "answer": choices.index(str(a + b))}) + "\n")
    (folder / "mc.yaml").write_text(MC_TASK.format(data=folder / "arith.jsonl"))
    (folder / "gen.yaml").write_text(GEN_TASK.format(data=folder / "arith.jsonl"))


def run_lm_eval(base: str, model: str, folder: Path, task: str, concurrent: int, fewshot: int = 0) -> tuple[float, Path]:
    out = folder / f"out-{task}-{concurrent}"
    command = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
               f"base_url={base}/v1/completions,model={model},tokenizer_backend=remote,"
               f"num_concurrent={concurrent},tokenized_requests=True",
               "--tasks", task, "--include_path", str(folder), "--output_path", str(out), "--log_samples",
               "--num_fewshot", str(fewshot)]
    env = os.environ | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(f"lm_eval failed:\n{completed.stderr[-3000:]}")
    return seconds, out


def samples_of(out: Path, task: str) -> list[dict]:
    [path] = glob.glob(str(out / "**" / f"samples_{task}_*.jsonl"), recursive=True)
    return [json.loads(line) for line in open(path)]


def metric_of(out: Path, task: str, metric: str) -> float:
    [path] = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    return json.load(open(path))["results"][task][f"{metric},none"]


@contextlib.contextmanager
def serving(args, folder: Path, log_name: str):
    """`multiseq serve` on the model, from nothing (its base URL while the block runs)."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = folder / log_name
    server = subprocess.Popen([MULTISEQ, "serve", "-m", args.model, "-np", str(args.concurrent), "-t", str(args.threads),
                               "-fa", args.flash_attn, "--port", str(port)], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        _wait_healthy(server, base)
        yield base
    except Exception:
        print(_tail(log), file=sys.stderr)
        raise
    finally:
        _stop(server)


def prompt_tokens_computed(base: str) -> int:
    """The server's count of prompt tokens prefilled (not reused), from /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("multiseq_prompt_tokens_computed_total"):
                return int(float(line.split()[-1]))
    raise RuntimeError("no multiseq_prompt_tokens_computed in /metrics")


def tokenize(base: str, text: str) -> list[int]:
    body = json.dumps({"prompt": text, "add_special_tokens": False}).encode()
    request = urllib.request.Request(base + "/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)["tokens"]


def reference_loglikelihoods(model_path: str, pairs: list[tuple[list[int], list[int]]], threads: int) -> list[float]:
    """The continuation's summed log probability, one sequence at a time, every row kept."""
    from llama_cpp import Llama

    llama = Llama(model_path=model_path, n_ctx=512, n_threads=threads, logits_all=True, verbose=False)
    values = []
    for context, continuation in pairs:
        llama.reset()
        tokens = context + continuation
        llama.eval(tokens)
        total = 0.0
        for position in range(len(context), len(tokens)):
            row = np.asarray(llama.scores[position - 1], dtype=np.float64)
            peak = row.max()
            total += float(row[tokens[position]] - (peak + np.log(np.exp(row - peak).sum())))
        values.append(total)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--fewshot", type=int, default=5, help="examples before each question (a long shared context)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    # The reference (llama-cpp-python's defaults) runs without flash attention; on a CPU,
    # llama.cpp's flash attention moves a token's log probability by up to 0.25 here.
    parser.add_argument("--flash-attn", default="off", choices=["on", "off", "auto"])
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="multiseq-evals-"))
    write_tasks(folder, args.questions)
    timings, computed_tokens = {}, {}
    # A fresh server for each run: what one run left in the prefix cache would serve the next.
    for concurrent in (args.concurrent, 1):
        with serving(args, folder, f"serve-{concurrent}.log") as base:
            timings[concurrent], out = run_lm_eval(base, args.model, folder, "arith_mc", concurrent, args.fewshot)
            computed_tokens[concurrent] = prompt_tokens_computed(base)
            print(f"arith_mc, {concurrent} concurrent: {timings[concurrent]:.1f} s, "
                  f"acc {metric_of(out, 'arith_mc', 'acc'):.3f}, prompt tokens computed {computed_tokens[concurrent]}",
                  flush=True)
    mc_out = folder / f"out-arith_mc-{args.concurrent}"
    with serving(args, folder, "serve-gen.log") as base:
        gen_seconds, gen_out = run_lm_eval(base, args.model, folder, "arith_gen", args.concurrent)
        print(f"arith_gen, {args.concurrent} concurrent: {gen_seconds:.1f} s, exact_match "
              f"{metric_of(gen_out, 'arith_gen', 'exact_match'):.3f}", flush=True)
        pairs, served = [], []
        for sample in samples_of(mc_out, "arith_mc"):
            for argument, response in zip(sample["arguments"].values(), sample["resps"]):
                context, continuation = argument["arg_0"], argument["arg_1"]
                whole, context_tokens = tokenize(base, context + continuation), tokenize(base, context)
                pairs.append((whole[:len(context_tokens)], whole[len(context_tokens):]))
                served.append(float(response[0][0]))
    model_path = subprocess.run([MULTISEQ, "models", "path", args.model],
                                capture_output=True, text=True, check=True).stdout.strip()
    reference = reference_loglikelihoods(model_path, pairs, args.threads)
    worst = max(abs(a - b) for a, b in zip(served, reference))
    distinct = sum(len(context) for context, _ in pairs[::4]) + sum(len(continuation) for _, continuation in pairs)
    computed = sum(len(context) + len(continuation) for context, continuation in pairs)
    summary = {"model": args.model, "flash_attn": args.flash_attn, "fewshot": args.fewshot, "questions": args.questions, "loglikelihood_requests": len(pairs),
               "mc_seconds": timings, "ratio_concurrent_to_one": timings[args.concurrent] / timings[1],
               "prompt_tokens_computed": computed_tokens, "gen_seconds": gen_seconds, "max_abs_diff_vs_reference": worst,
               "same_choice_as_reference": sum(
                   max(range(4), key=lambda i: served[q + i]) == max(range(4), key=lambda i: reference[q + i])
                   for q in range(0, len(pairs), 4)), "tokens_distinct": distinct, "tokens_scored": computed}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
