"""How a quantized KV cache changes a model's outputs, in multiseq and in llama-server.

Usage (from the repository root, in the project's virtual environment):

    python bench/kv_quality.py                                   # SmolLM2 135M and Gemma 3 270M
    python bench/kv_quality.py --models gemma3-270m --types q8_0 --no-server
    python bench/kv_quality.py --threads 4 --types q8_0,q4_0,q5_0

Eight short chat prompts, rendered with the model's chat template, each answered greedily with
exactly 48 tokens (end-of-generation tokens banned: ignore_eos), once with an f16/f16 KV cache
(the reference) and once per quantized type (`--types`, K and V alike), flash attention on.

multiseq: runner/llama/backend.py's LlamaBackend driven directly, one slot, the prompt in one decode
and then one token per decode. Reported per type: how many of the 8 answers are the f16 answer
token for token; and, teacher-forced along f16's answer (the same prompt and the same tokens,
fed in the same decodes, to the f16 and the quantized context), KL(p_f16 || p_quant) of the
next-token distributions (the raw logits, softmax in float64) averaged over every position of
every prompt, its maximum, and the share of positions where the greedy pick (end tokens banned)
differs.

llama-server (skipped with --no-server): built from the llama.cpp that llama-cpp-python vendors
(bench/peers.py), started once per type with -np 1 -fa on -ctk TYPE -ctv TYPE (and --no-jinja, so
that it renders the chats with the same built-in template as multiseq); each prompt is sent to
/v1/chat/completions (temperature 0, 48 tokens, ignore_eos, no prompt cache), and the answers
are compared by text with its own f16 answers. Its distributions cannot be read over HTTP, so
its KL is null. As a check that both sides compute the same thing, its answers are also
compared with multiseq's of the same type ("server = multiseq").

A table per model is printed, then, as the last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

import peers  # bench/ is the script's own folder, first on sys.path

from multiseq.llama.backend import LlamaBackend
from multiseq.llama.batch import BatchEntry
from multiseq.loading import open_model
from multiseq.models import resolve

REFERENCE_TYPE = "f16"
PROMPTS = ("The capital of France is", "Write a haiku about the sea", "List three primary colors",
           "What is 17 times 23?", "Name a famous physicist", "Translate 'good morning' to French",
           "Why is the sky blue?", "Give me a synonym for happy")
ANSWER_TOKENS = 48
SLOT_CTX = 512  # room to spare: the rendered prompts are under 20 tokens, the answers 48
SERVER_KL_NOTE = "llama-server does not expose its next-token distributions over HTTP"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- pure helpers (tests/test_bench_kv_quality_unit.py) -----------------------------------

def kl_divergence_rows(reference_logits: np.ndarray, other_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, p = softmax(reference_logits), q = softmax(other_logits), in nats.

    Computed from log-softmaxes in float64: the quantized cache moves probabilities by tiny
    amounts, which float32 differences of probabilities would round away."""
    log_p = _log_softmax(np.asarray(reference_logits, dtype=np.float64))
    log_q = _log_softmax(np.asarray(other_logits, dtype=np.float64))
    return np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def greedy_pick(logits: np.ndarray, banned: list[int]) -> int:
    """The argmax of one logits row with the banned tokens (end of generation) excluded."""
    row = np.array(logits, dtype=np.float32)  # a copy: the backend's rows are views
    row[banned] = -np.inf
    return int(row.argmax())


def count_equal(answers: list, reference: list) -> int:
    return sum(answer == expected for answer, expected in zip(answers, reference, strict=True))


def kl_summary(kl_values: np.ndarray, picks_differ: np.ndarray) -> dict:
    """Mean and max KL over all positions, and the share of positions whose greedy pick differs."""
    return {"mean_kl": float(np.mean(kl_values)), "max_kl": float(np.max(kl_values)),
            "argmax_differs": float(np.mean(picks_differ)), "positions": int(len(kl_values))}


# --- multiseq: LlamaBackend driven one token at a time ------------------------------------

def run_sequence(backend: LlamaBackend, prompt: list[int], banned: list[int],
                 forced: list[int] | None = None) -> tuple[list[int], np.ndarray]:
    """Answer the prompt with ANSWER_TOKENS tokens in slot 0: the greedy picks, or, teacher-forced,
    the `forced` tokens. Returns the tokens fed and the logits row before each one.

    The decodes are the same in both modes (the prompt in one, then one token each), so a
    forced run on the reference cache gives back its greedy run's rows exactly."""
    backend.clear_slot(0)
    rows = [np.array(backend.decode([BatchEntry(0, prompt, 0, True)])[0])]
    tokens: list[int] = []
    for step in range(ANSWER_TOKENS):
        token = forced[step] if forced is not None else greedy_pick(rows[-1], banned)
        tokens.append(token)
        if step + 1 < ANSWER_TOKENS:  # the last token's distribution is not part of the answer
            rows.append(np.array(backend.decode([BatchEntry(0, [token], len(prompt) + step, True)])[0]))
    return tokens, np.stack(rows)


def measure_multiseq(model, prompts: list[list[int]], types: list[str], threads: int) -> tuple[dict, dict]:
    """Per quantized type: answers equal to f16's, and the KL summary along f16's answers; and
    every type's answers as text (f16's included), for the comparison with llama-server."""
    banned = model.end_of_generation_tokens()
    backends = {kv_type: LlamaBackend(model, 1, SLOT_CTX, SLOT_CTX, threads, cache_types=(kv_type, kv_type),
                                      flash_attn="on")
                for kv_type in [REFERENCE_TYPE, *types]}
    try:
        answers: dict[str, list[list[int]]] = {kv_type: [] for kv_type in backends}
        kl_values: dict[str, list[np.ndarray]] = {kv_type: [] for kv_type in types}
        picks_differ: dict[str, list[np.ndarray]] = {kv_type: [] for kv_type in types}
        for index, prompt in enumerate(prompts):
            # One prompt at a time: the reference rows of one answer are 50 MB on a 262k vocabulary.
            reference, reference_rows = run_sequence(backends[REFERENCE_TYPE], prompt, banned)
            answers[REFERENCE_TYPE].append(reference)
            reference_picks = [greedy_pick(row, banned) for row in reference_rows]
            for kv_type in types:
                answers[kv_type].append(run_sequence(backends[kv_type], prompt, banned)[0])
                _, rows = run_sequence(backends[kv_type], prompt, banned, forced=reference)
                kl_values[kv_type].append(kl_divergence_rows(reference_rows, rows))
                picks_differ[kv_type].append(np.array(reference_picks) != [greedy_pick(row, banned) for row in rows])
            log(f"  multiseq: prompt {index + 1}/{len(prompts)} done")
    finally:
        for backend in backends.values():
            backend.close()
    figures = {kv_type: {"equal_answers": count_equal(answers[kv_type], answers[REFERENCE_TYPE]), "of": len(prompts),
                         **kl_summary(np.concatenate(kl_values[kv_type]), np.concatenate(picks_differ[kv_type]))}
               for kv_type in types}
    texts = {kv_type: [answer_text(model, tokens) for tokens in type_answers]
             for kv_type, type_answers in answers.items()}
    return figures, texts


def answer_text(model, tokens: list[int]) -> str:
    return b"".join(model.token_bytes(token) for token in tokens).decode("utf-8", "replace")


# --- llama-server -------------------------------------------------------------------------

def server_answers(tools, model_name: str, kv_type: str, threads: int) -> list[str]:
    """The 8 answers of a llama-server started with the KV type, by text."""
    port = peers._free_port()
    base = f"http://127.0.0.1:{port}"
    resolved = resolve(model_name)
    # The prompts rendered as multiseq renders them: with llama.cpp's built-in templates, not
    # the GGUF's Jinja (SmolLM2's adds a system prompt), and for a GGUF without a template
    # (Gemma 3 270M) the registry's built-in one; under --jinja, llama-server would take
    # `--chat-template gemma` for Jinja text and send every prompt as the word "gemma".
    template = ["--chat-template", resolved.chat_template_fallback] if resolved.chat_template_fallback else []
    command = peers.server_command(tools, resolved.path, 1, threads, SLOT_CTX, port, flash_attn="on",
                                   extra_args=["-ctk", kv_type, "-ctv", kv_type, "--no-jinja", *template])
    with tempfile.TemporaryDirectory(prefix="multiseq-kv-quality-") as tmp:
        log_path = Path(tmp) / "server.log"
        with open(log_path, "wb") as log_file:  # a file, not a pipe: a full pipe would stall the server
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            peers._wait_healthy(process, base)
            return [chat_completion(base, prompt) for prompt in PROMPTS]
        except Exception as error:
            raise RuntimeError(f"llama-server ({kv_type}) failed: {error}\n--- server log tail ---\n"
                               f"{peers._tail(log_path)}") from error
        finally:
            peers._stop(process)


def chat_completion(base: str, prompt: str) -> str:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": ANSWER_TOKENS, "temperature": 0,
            "ignore_eos": True, "cache_prompt": False}
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with peers._HTTP.open(request, timeout=600) as response:
        reply = json.load(response)
    generated = reply["usage"]["completion_tokens"]
    if generated != ANSWER_TOKENS:
        raise RuntimeError(f"llama-server generated {generated} tokens, not {ANSWER_TOKENS}, for {prompt!r}")
    return reply["choices"][0]["message"]["content"]


def measure_server(tools, model_name: str, types: list[str], threads: int, multiseq_texts: dict) -> dict:
    """Per type: answers equal to llama-server's own f16 answers (f16 itself left out), and, as
    a check that both run the same computation, answers equal to multiseq's of the same type."""
    answers = {kv_type: server_answers(tools, model_name, kv_type, threads) for kv_type in [REFERENCE_TYPE, *types]}
    figures = {}
    for kv_type, texts in answers.items():
        figures[kv_type] = {"same_as_multiseq": count_equal(texts, multiseq_texts[kv_type]), "of": len(PROMPTS)}
        if kv_type != REFERENCE_TYPE:
            figures[kv_type].update(equal_answers=count_equal(texts, answers[REFERENCE_TYPE]), mean_kl=None,
                                    max_kl=None, kl_note=SERVER_KL_NOTE)
    return figures


# --- the run --------------------------------------------------------------------------------

def measure_model(name: str, args: argparse.Namespace, tools) -> dict:
    log(f"{name}: multiseq")
    model = open_model(name)
    try:
        prompts = [model.tokenize(model.render_chat(({"role": "user", "content": text},))) for text in PROMPTS]
        multiseq, multiseq_texts = measure_multiseq(model, prompts, args.types, args.threads)
    finally:
        model.close()
    result = {"prompt_tokens": [len(prompt) for prompt in prompts], "multiseq": multiseq, "llama_server": None}
    if tools is not None:
        log(f"{name}: llama-server")
        result["llama_server"] = measure_server(tools, name, args.types, args.threads, multiseq_texts)
    return result


def print_table(name: str, result: dict) -> None:
    """One row per type; "server = multiseq" counts llama-server's answers equal (by text) to
    multiseq's of the same type: 8/8 means both ran the same computation."""
    print(f"\n{name}: KV types against f16/f16, {len(PROMPTS)} prompts x {ANSWER_TOKENS} greedy tokens")
    print(f"{'type':<6} {'multiseq equal':>14} {'mean KL':>9} {'max KL':>9} {'argmax differs':>14} "
          f"{'llama-server equal':>18} {'server = multiseq':>17}")
    server = result["llama_server"]
    rows = {REFERENCE_TYPE: None, **result["multiseq"]}
    for kv_type, figures in rows.items():
        ours = ("reference", "", "", "") if figures is None else (
            f"{figures['equal_answers']}/{figures['of']}", f"{figures['mean_kl']:.2e}", f"{figures['max_kl']:.2e}",
            f"{figures['argmax_differs']:.1%}")
        theirs = ("-", "-") if server is None else (
            "reference" if figures is None else f"{server[kv_type]['equal_answers']}/{server[kv_type]['of']}",
            f"{server[kv_type]['same_as_multiseq']}/{server[kv_type]['of']}")
        print(f"{kv_type:<6} {ours[0]:>14} {ours[1]:>9} {ours[2]:>9} {ours[3]:>14} {theirs[0]:>18} {theirs[1]:>17}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m", help="comma-separated model names")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--types", default="q8_0,q4_0", help="comma-separated KV types to compare with f16")
    parser.add_argument("--no-server", action="store_true", help="skip llama-server")
    args = parser.parse_args(argv)
    args.models = [name for name in args.models.split(",") if name]
    args.types = [kv_type for kv_type in args.types.split(",") if kv_type and kv_type != REFERENCE_TYPE]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tools = None if args.no_server else peers.ensure_llama_tools(log=log)
    results = {name: measure_model(name, args, tools) for name in args.models}
    for name, result in results.items():
        print_table(name, result)
    print(json.dumps({"benchmark": "kv_quality", "reference": f"{REFERENCE_TYPE}/{REFERENCE_TYPE}",
                      "prompts": list(PROMPTS), "answer_tokens": ANSWER_TOKENS, "threads": args.threads,
                      "flash_attn": "on", "models": results}))


if __name__ == "__main__":
    main()
