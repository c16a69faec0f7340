"""/infill against llama-server's, request for request: llama.vscode-shaped bodies (the text
around the cursor, chunks of other files, its limits) sent to `multiseq serve` and to
llama-server on the same model, with the same slot context and batch; each answer's prompt
(the text of the tokens laid out, which both servers return), its token count and its greedy
text must be the same.

    python bench/infill.py [--threads 2]

The model is the tiny random-weight qwen2 with DeepSeek-R1-Distill-Qwen's vocabulary
(tests/tiny_models.py), whose Qwen2 FIM tokens (<|fim_prefix|>..., <|repo_name|>, <|file_sep|>)
llama.cpp finds; the registry's models have none. llama-server is built from the pinned sources
(bench/peers.py). llama.vscode asks for samplers ["top_k", "top_p", "infill"] (llama-server's
infill sampler, not applied here); the bodies here ask for greedy (temperature 0, and the
temperature sampler where llama-server's list would skip it), so that the texts can be compared.
Exit code 1 when any answer differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from peers import _free_port, _stop, ensure_llama_tools, start_server  # noqa: E402
from tiny_models import deepseek_qwen_header, tiny_model_with_tokenizer_of  # noqa: E402

MULTISEQ = str(Path(sys.executable).parent / "multiseq")
SLOT_CTX = 4096  # llama-server's -b 2048 and this context: the layout's cuts are the same on both


def code(name: str, lines: int) -> str:
    """Python-looking text of about 12 tokens a line."""
    return "".join(f"def {name}_{index}(value):\n    return value * {index} + {index % 7}\n\n" for index in range(lines))


def editor_body(prefix: str, suffix: str, chunks: list[tuple[str, str]], prompt: str = "", **more) -> dict:
    """What llama.vscode sends (src/llama-server.ts, createRequestPayload), greedy."""
    return {"input_prefix": prefix, "input_suffix": suffix,
            "input_extra": [{"text": text, "time": 0, "filename": filename} for filename, text in chunks],
            "prompt": prompt, "n_predict": 16, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "temperature"], "temperature": 0, "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 60000, **more}


def cases() -> dict[str, dict]:
    chunk = ("helpers.py", code("helper", 6))
    return {
        "cursor in a function": editor_body("def area(width, height):\n    ", "\n\nprint(area(2, 3))\n", [chunk]),
        "no other files": editor_body("import os\n\ndef main():\n", "\n", []),
        "typed text after the cursor": editor_body("class Point:\n    def __init__(self, x, y):\n        ",
                                                   "\n", [chunk], prompt="self."),
        "n_indent": editor_body("def f(items):\n    for item in items:\n", "\nf([])\n", [chunk], n_indent=8),
        "prefix longer than 3/4 batch": editor_body(code("before", 200) + "def last(", ")\n", [chunk]),
        "suffix longer than 1/4 batch": editor_body("def first(", ")\n" + code("after", 100), [chunk]),
        "chunks beyond the context": editor_body("x = ", "\n", [(f"file{index}.py", code(f"m{index}", 40))
                                                                for index in range(8)]),
        "a marker's text in a file": editor_body("# <|fim_middle|> is text here\ny = ", "\n", [chunk]),
        "token ids in the prefix": editor_body(["def g(", 87, "):\n    "], "\n", [chunk]),
    }


def post(base: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}/infill", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    tools = ensure_llama_tools()
    with tempfile.TemporaryDirectory(prefix="multiseq-infill-") as folder:
        workdir = Path(folder)
        model = tiny_model_with_tokenizer_of(deepseek_qwen_header(), workdir / "tiny-fim.gguf")
        port = _free_port()
        peer, peer_base = start_server([str(tools.server), "-m", str(model), "-np", "1", "-c", str(SLOT_CTX),
                                 "-t", str(args.threads), "-tb", str(args.threads), "-fa", "off", "--no-webui",
                                 "--host", "127.0.0.1", "--port", str(port), "--log-verbosity", "2"],
                                workdir / "llama-server.log", port)
        try:
            theirs = {name: post(peer_base, body) for name, body in cases().items()}
        finally:
            _stop(peer)
        port = _free_port()
        ours_process, ours_base = start_server([MULTISEQ, "serve", "-m", str(model), "-np", "1", "--slot-ctx", str(SLOT_CTX),
                                         "-t", str(args.threads), "-fa", "off", "--port", str(port)],
                                        workdir / "multiseq.log", port)
        try:
            ours = {name: post(ours_base, body) for name, body in cases().items()}
        finally:
            _stop(ours_process)
    failures = report(theirs, ours)
    sys.exit(1 if failures else 0)


def report(theirs: dict[str, dict], ours: dict[str, dict]) -> int:
    print(f"{'case':34} {'prompt tokens':>14} {'same prompt':>12} {'same text':>10}  text")
    failures = 0
    for name, peer in theirs.items():
        mine = ours[name]
        same_prompt = mine["prompt"] == peer["prompt"] and mine["tokens_evaluated"] == peer["tokens_evaluated"]
        same_text = mine["content"] == peer["content"]
        failures += not (same_prompt and same_text)
        print(f"{name:34} {peer['tokens_evaluated']:>7}/{mine['tokens_evaluated']:<6} {str(same_prompt):>12} "
              f"{str(same_text):>10}  {json.dumps(mine['content'])[:40]}")
        if not same_text:
            print(f"{'':34} llama-server: {json.dumps(peer['content'])[:80]}")
        if not same_prompt:
            at = next((i for i, (a, b) in enumerate(zip(mine["prompt"], peer["prompt"])) if a != b),
                      min(len(mine["prompt"]), len(peer["prompt"])))
            print(f"{'':34} prompts differ at character {at}: {json.dumps(mine['prompt'][at:at + 60])} vs "
                  f"{json.dumps(peer['prompt'][at:at + 60])}")
    print(f"{len(theirs) - failures} of {len(theirs)} answers the same")
    return failures


if __name__ == "__main__":
    main()
