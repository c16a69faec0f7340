"""`multiseq serve`'s server (serve()) over the fake backend, in a process of its own: what the
shutdown tests send real signals to. It prints `listening on PORT` once the socket is open and
`ready` once the "model" has loaded (after --load-seconds), and exits 0 when stopped.

    python tests/fake_serve.py [--load-seconds S] [--decode-delay S] [--fail-decodes-after N]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from fakes import FakeBackend
from multiseq import Runner, RunnerConfig
from multiseq.server import ServerSettings
from multiseq.server.serve import serve

MODEL = "fake-model"
NUM_SLOTS = 2
WINDOW = 4096


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load-seconds", type=float, default=0.0, help="how long the model takes to load")
    parser.add_argument("--decode-delay", type=float, default=0.005, help="seconds per decode step")
    parser.add_argument("--fail-decodes-after", type=int, default=None,
                        help="the backend fails every decode after this many (the engine stops)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    config = RunnerConfig(parallel=NUM_SLOTS, slot_ctx=WINDOW, n_batch=64, threads=1, seed=0)

    def open_runner(config: RunnerConfig) -> Runner:
        time.sleep(args.load_seconds)  # a slow model load, which a signal must not wait for
        backend = FakeBackend(num_slots=NUM_SLOTS, window=WINDOW, decode_delay=args.decode_delay)
        backend.fail_decodes_after = args.fail_decodes_after
        return Runner(config, backend=backend)

    def listening(server) -> None:
        print(f"listening on {server.port}", file=sys.stderr, flush=True)

    def ready(runner: Runner) -> None:
        print("ready", file=sys.stderr, flush=True)

    failure = serve(config, ServerSettings(model_name=MODEL), "127.0.0.1", 0, access_log=False,
                    on_listening=listening, on_ready=ready, open_runner=open_runner)
    print("stopped" if failure is None else f"failed: {failure}", file=sys.stderr, flush=True)
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
