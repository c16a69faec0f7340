"""A replica killed in the middle of a run of `multiseq serve --ray`: does any request hang?

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/replica_kill.py                                   # 2 replicas, 8 clients, kill at 10 s
    python bench/replica_kill.py --clients 16 --duration 40 --kill-at 15

Starts Ray in this process (loopback, one CPU per replica), puts the application of
`multiseq.ray_serve` (`--replicas` replicas of `--model`, `-np --parallel`, one thread each) on
Ray Serve's proxy at a free port, and runs `--clients` streaming chat clients in a closed loop
(`--max-tokens` each, ignore_eos) for `--duration` seconds. At `--kill-at` seconds one replica's
actor is killed (`ray.kill`, as a crash would end it); Ray Serve starts another. Reported: the
requests that completed and that ended with an error, before and after the kill; for those in
flight at the kill, how long after it each one ended (the target: every one within 10 s, none
left hanging); the requests completed after the kill (the run goes on); and how soon /health
said `ok` again. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import ray
from ray import serve

from multiseq import RunnerConfig, ray_serve
from multiseq.server.app import ServerSettings

HANG_S = 10.0  # a request still open this long after the kill counts as hanging


@dataclass
class Outcome:
    started: float
    ended: float
    ok: bool
    replica: str | None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_request(port: int, model: str, max_tokens: int, number: int) -> Outcome:
    """One streamed chat request to the end: ok when it ended with [DONE] and no error event."""
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_S * 6)
    replica = None
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(
            {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
             "messages": [{"role": "user", "content": f"Request {number}: write about rivers."}]}),
            {"Content-Type": "application/json"})
        response = connection.getresponse()
        replica = response.getheader("x-multiseq-replica")
        events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
        ok = response.status == 200 and events[-1:] == ["data: [DONE]"] and not any('"error"' in e for e in events)
    except (OSError, http.client.HTTPException):
        ok = False
    finally:
        connection.close()
    return Outcome(started, time.monotonic(), ok, replica)


def health_status(port: int) -> str:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())["status"]
    except (OSError, http.client.HTTPException, ValueError, KeyError):
        return "unreachable"


def run(args: argparse.Namespace) -> dict:
    ray.init(num_cpus=args.replicas, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = RunnerConfig(model=args.model, parallel=args.parallel, threads=1, slot_ctx=1024, seed=0)
        settings = ServerSettings(model_name=args.model, data_dir=Path(tempfile.mkdtemp(prefix="replica-kill-")))
        serve.run(ray_serve.build_app(config, settings, args.replicas), name=ray_serve.APP_NAME, route_prefix="/")
        return drive(args, port)
    finally:
        serve.shutdown()
        ray.shutdown()


def drive(args: argparse.Namespace, port: int) -> dict:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    start = time.monotonic()
    stop_at = start + args.duration

    def client(index: int) -> None:
        number = index
        while time.monotonic() < stop_at:
            outcome = one_request(port, args.model, args.max_tokens, number)
            with lock:
                outcomes.append(outcome)
            number += args.clients

    threads = [threading.Thread(target=client, args=(index,), daemon=True) for index in range(args.clients)]
    for thread in threads:
        thread.start()
    time.sleep(args.kill_at)
    with lock:
        seen = [outcome.replica for outcome in outcomes if outcome.replica]
    victim = seen[0] if seen else None
    killed_at = time.monotonic()
    if victim is not None:
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{ray_serve.APP_NAME}#{ray_serve.ENGINE}#{victim}", namespace="serve"),
                 no_restart=True)
        log(f"killed replica {victim} at {killed_at - start:.1f} s")
    healthy_again = None
    while time.monotonic() < stop_at + HANG_S * 6:
        if healthy_again is None and time.monotonic() > killed_at + 1 and health_status(port) == "ok":
            healthy_again = time.monotonic() - killed_at
        if not any(thread.is_alive() for thread in threads):
            break
        time.sleep(0.5)
    hanging = sum(thread.is_alive() for thread in threads)
    in_flight = [o for o in outcomes if o.started < killed_at < o.ended]
    after = [o for o in outcomes if o.started >= killed_at]
    ends_after_kill = [o.ended - killed_at for o in in_flight]
    figures = {
        "replicas": args.replicas, "clients": args.clients, "parallel": args.parallel, "max_tokens": args.max_tokens,
        "duration_s": args.duration, "kill_at_s": args.kill_at, "victim": victim,
        "before_kill": {"ok": sum(o.ok for o in outcomes if o.ended <= killed_at),
                        "error": sum(not o.ok for o in outcomes if o.ended <= killed_at)},
        "in_flight_at_kill": {"ok": sum(o.ok for o in in_flight), "error": sum(not o.ok for o in in_flight),
                              "ended_after_kill_max_s": max(ends_after_kill, default=0.0),
                              "ended_after_kill_median_s": statistics.median(ends_after_kill) if ends_after_kill else 0.0,
                              "on_the_victim": sum(o.replica == victim for o in in_flight)},
        "started_after_kill": {"ok": sum(o.ok for o in after), "error": sum(not o.ok for o in after),
                               "on_the_victim": sum(o.replica == victim for o in after)},
        "hanging_clients": hanging,
        "healthy_again_after_s": healthy_again,
    }
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=4, help="slots per replica")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--duration", type=float, default=40.0, help="seconds the clients keep sending")
    parser.add_argument("--kill-at", type=float, default=10.0, help="seconds into the run when a replica is killed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    figures = run(parse_args(argv))
    flight = figures["in_flight_at_kill"]
    print(f"in flight at the kill: {flight['ok']} completed, {flight['error']} errors, the last ended "
          f"{flight['ended_after_kill_max_s']:.1f} s after it; started after: {figures['started_after_kill']['ok']} "
          f"completed, {figures['started_after_kill']['error']} errors; hanging: {figures['hanging_clients']}; "
          f"/health ok again after {figures['healthy_again_after_s']} s")
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
