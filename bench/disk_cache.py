"""The disk tier (--cache-disk) across a restart of `multiseq serve`: an agent's first request
and eight agent sessions, each computed before the restart and resumed after it.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/disk_cache.py [--claude PATH] [--request FILE] [--threads 2] [--sessions 8]

1. Claude Code's real first request: `claude -p "Say hello."` is run once against a capturing
   loopback server (HOME is a scratch folder; nothing leaves the machine) and its largest
   /v1/messages body kept (or --request FILE gives one). It is sent, streamed, to
   `serve -m smollm2-135m --cache-disk DIR -np 1`, the server is stopped (SIGTERM) and started
   again, and the same request is sent: the time to the first text delta, cold and after the
   restart (target: at most 0.15x).
2. Eight agent sessions (a shared ~1,500-token instruction, three turns each) on `serve -np 4
   --batch-invariant`, then a restart, then each session's next turn: the prompt tokens the
   resumed turns compute with the disk tier and without it (target: at most 0.2x), and whether
   every resumed turn's greedy text is the same in both.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path
from workloads import agent_system_prompt, agent_user_messages

MODEL = "smollm2-135m"
CLAUDE = "/tmp/agents/node_modules/.bin/claude"


def capture_claude_request(claude: str) -> dict:
    """Claude Code's first /v1/messages body, as it sends it to a server that answers 400."""
    bodies: list[bytes] = []

    class Capture(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the handler's protocol names it
            bodies.append(self.rfile.read(int(self.headers.get("content-length", 0))))
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"type":"error","error":{"type":"invalid_request_error","message":"captured"}}')

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as home:
        (Path(home) / "work").mkdir()
        env = dict(os.environ, HOME=home, ANTHROPIC_BASE_URL=f"http://127.0.0.1:{server.server_address[1]}",
                   ANTHROPIC_API_KEY="sk-local", DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        subprocess.run([claude, "-p", "Say hello."], env=env, cwd=Path(home) / "work", capture_output=True, timeout=120)
    server.shutdown()
    if not bodies:
        raise SystemExit(f"{claude} sent no request")
    return json.loads(max(bodies, key=len))


def serve(folder: Path, name: str, extra: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    port = peers._free_port()
    command = [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", MODEL, "--port", str(port),
               "-t", str(threads), *extra]
    return peers.start_server(command, folder / f"{name}.log", port)


def stop(process: subprocess.Popen) -> float:
    """SIGTERM, and the seconds until the process ended (its kept prefixes written by then)."""
    started = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=600)
    return time.perf_counter() - started


def messages_first_delta(base: str, body: dict) -> tuple[float, dict]:
    """Seconds to the first text delta of a streamed /v1/messages request, and its usage."""
    request = urllib.request.Request(f"{base}/v1/messages", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "x-api-key": "x",
                                              "anthropic-version": "2023-06-01"})
    started, first, usage = time.perf_counter(), None, {}
    with urllib.request.urlopen(request, timeout=1800) as response:
        for line in response:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if first is None and event.get("type") == "content_block_delta":
                first = time.perf_counter() - started
            usage.update(event.get("message", {}).get("usage", {}) or event.get("usage", {}) or {})
    if first is None:
        raise SystemExit(f"no text delta came: {usage}")
    return first, usage


def agent_first_request(args, folder: Path) -> dict:
    body = json.loads(Path(args.request).read_text()) if args.request else capture_claude_request(args.claude)
    body.update(model=MODEL, max_tokens=8, stream=True, temperature=0)
    cache = folder / "claude-cache"
    options = ["-np", "1", "-c", str(args.context), "--cache-disk", str(cache)]
    process, base = serve(folder, "claude-cold", options, args.threads)
    cold, cold_usage = messages_first_delta(base, body)
    stop_seconds = stop(process)
    process, base = serve(folder, "claude-warm", options, args.threads)
    warm, warm_usage = messages_first_delta(base, body)
    stop(process)
    files = list(cache.rglob("*.kv"))
    return {"request_bytes": len(json.dumps(body)), "prompt_tokens": cold_usage.get("input_tokens"),
            "ttft_cold_s": round(cold, 2), "ttft_after_restart_s": round(warm, 2), "ratio": round(warm / cold, 3),
            "cached_after_restart": warm_usage.get("cache_read_input_tokens"), "stop_s": round(stop_seconds, 2),
            "files": len(files), "file_mb": round(sum(path.stat().st_size for path in files) / 2**20, 1)}


def chat(base: str, messages: list[dict]) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0}
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def sessions_resumed(args, folder: Path, disk: bool) -> dict:
    """Three turns of each session, a restart, then each session's fourth: what that costs."""
    system = {"role": "system", "content": agent_system_prompt(1500)}
    users = [agent_user_messages(session, 4) for session in range(args.sessions)]
    options = ["-np", "4", "-c", "16384", "--batch-invariant"]
    if disk:
        options += ["--cache-disk", str(folder / "agents-cache")]
    histories = [[system] for _ in users]
    process, base = serve(folder, f"agents-{disk}", options, args.threads)
    for turn in range(3):
        for session, history in enumerate(histories):
            history.append({"role": "user", "content": users[session][turn]})
            history.append({"role": "assistant", "content": chat(base, history)["choices"][0]["message"]["content"]})
    stop(process)
    process, base = serve(folder, f"agents-{disk}-after", options, args.threads)
    computed, texts, started = 0, [], time.perf_counter()
    for session, history in enumerate(histories):
        reply = chat(base, [*history, {"role": "user", "content": users[session][3]}])
        usage = reply["usage"]
        computed += usage["prompt_tokens"] - (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        texts.append(reply["choices"][0]["message"]["content"])
    resumed_s = time.perf_counter() - started
    stop(process)
    return {"computed": computed, "texts": texts, "resumed_s": round(resumed_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--claude", default=shutil.which("claude") or CLAUDE)
    parser.add_argument("--request", help="a /v1/messages body to send instead of capturing Claude Code's")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--skip", choices=["agent", "sessions"], action="append", default=[])
    args = parser.parse_args()
    summary: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if "agent" not in args.skip:
            summary["first_request"] = agent_first_request(args, folder)
            print(json.dumps(summary["first_request"]), flush=True)
        if "sessions" not in args.skip:
            with_disk = sessions_resumed(args, folder, disk=True)
            without = sessions_resumed(args, folder, disk=False)
            summary["sessions"] = {"computed_with_disk": with_disk["computed"], "computed_without": without["computed"],
                                   "ratio": round(with_disk["computed"] / without["computed"], 3),
                                   "resumed_s_with_disk": with_disk["resumed_s"], "resumed_s_without": without["resumed_s"],
                                   "texts_equal": with_disk["texts"] == without["texts"]}
            print(json.dumps(summary["sessions"]), flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
