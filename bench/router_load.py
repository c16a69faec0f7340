"""A model loaded at its first request: seconds from the request to its first token, multiseq
serve against llama-server's router mode, both started from one models file.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/router_load.py [--runs 3] [--idle 5] [--threads 2]

One INI file in llama-server's preset shape serves SmolLM2 (loaded at start) and Gemma 3 270M
(`load-on-startup = false`) from the same GGUF files: `multiseq serve --models-preset FILE` and
`llama-server --models-preset FILE` (its router, a child process per model). Each run starts a
fresh server, waits for SmolLM2 to be loaded, leaves the server idle `--idle` seconds (as a server
is between requests), then times a streamed greedy completion on Gemma from its request to its first
content piece (the load, then the prefill) and to its end; the two servers alternate, run by run.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path
from multiseq import models

CHAT, SECOND = "smollm2-135m", "gemma3-270m"


def preset_file(folder: Path, threads: int) -> Path:
    """The models file both servers read: the registry's two files, Gemma loaded on demand."""
    text = (f"version = 1\n\n[*]\nc = 4096\nnp = 4\nt = {threads}\n\n"
            f"[{CHAT}]\nmodel = {models.resolve(CHAT).path}\nload-on-startup = true\n\n"
            f"[{SECOND}]\nmodel = {models.resolve(SECOND).path}\nload-on-startup = false\n")
    path = folder / "models.ini"
    path.write_text(text)
    return path


def commands(preset: Path, port: int) -> dict[str, list[str]]:
    tools = peers.ensure_llama_tools()
    return {"multiseq": [sys.executable, "-m", "multiseq.cli.main", "serve", "--models-preset", str(preset),
                         "--port", str(port), "--no-dashboard"],
            "llama-server": [str(tools.server), "--models-preset", str(preset), "--host", "127.0.0.1",
                             "--port", str(port)]}


def model_states(base: str) -> dict[str, str]:
    with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as response:
        cards = json.load(response)["data"]
    return {card["id"]: (card.get("status") or {}).get("value", "loaded") for card in cards}


def wait_for_chat_model(base: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = model_states(base)
        if states.get(CHAT) == "loaded":
            if states.get(SECOND) not in (None, "unloaded"):
                raise SystemExit(f"{SECOND} should wait for its first request: {states}")
            return
        time.sleep(0.2)
    raise SystemExit(f"{CHAT} not loaded after {timeout_s:.0f} s")


def timed_chat(base: str) -> tuple[float, float, str]:
    """(seconds to the first piece, seconds to the end, the text) of a streamed greedy Gemma
    completion (a completion: the file carries no chat template)."""
    body = {"model": SECOND, "prompt": "The three primary colours are", "max_tokens": 8, "temperature": 0,
            "stream": True}
    request = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    started, first, text = time.perf_counter(), None, ""
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                piece = choice.get("text") or ""
                if piece and first is None:
                    first = time.perf_counter() - started
                text += piece
    if first is None:
        raise SystemExit("the second model gave no piece")
    return first, time.perf_counter() - started, text


def one_run(name: str, command: list[str], port: int, idle_s: float, folder: Path) -> dict:
    process, base = peers.start_server(command, folder / f"{name}.log", port)
    try:
        wait_for_chat_model(base)
        time.sleep(idle_s)
        first, total, text = timed_chat(base)
    finally:
        peers._stop(process)
        subprocess.run(["pkill", "-f", "--", f"--port {port}"], check=False)  # the router's children, if any stayed
    return {"server": name, "first_token_s": first, "total_s": total, "text": text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle before the request")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="multiseq-router-") as folder:
        preset = preset_file(Path(folder), args.threads)
        for _ in range(args.runs):
            for name, command in commands(preset, port := peers._free_port()).items():
                runs.append(one_run(name, command, port, args.idle, Path(folder)))
                print(f"{name}: {SECOND}'s first token {runs[-1]['first_token_s']:.2f} s after its request, "
                      f"done in {runs[-1]['total_s']:.2f} s: {runs[-1]['text']!r}", flush=True)
    medians = {name: statistics.median(run["first_token_s"] for run in runs if run["server"] == name)
               for name in ("multiseq", "llama-server")}
    print(f"median first token: multiseq {medians['multiseq']:.2f} s, llama-server's router "
          f"{medians['llama-server']:.2f} s ({medians['multiseq'] / medians['llama-server']:.2f}x)")
    print(json.dumps({"runs": runs, "median_first_token_s": medians}))


if __name__ == "__main__":
    main()
