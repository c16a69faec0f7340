"""Crash safety of the disk tier (--cache-disk): a writer killed at random points, and writes
that find the disk full, never leave a state file that loads wrong, and the folder never grows
past its bound.

Usage (from the repository root, in the project's virtual environment):

    python bench/disk_crash.py [--kills 200] [--bound-mb 40] [--threads 2]

SmolLM2 computes six agent prompts (--batch-invariant) and closes, writing their states to a
disk tier: the originals. Then, --kills times, a child process opens the same folder and
writes those states over and over (each write evicting the least recently used file where
the bound needs it); one child in four runs under a file-size limit (RLIMIT_FSIZE), so its
writes fail part way as on a full disk. The parent samples the folder's bytes (partial files
included) every few milliseconds and kills the child (SIGKILL) after 20-400 ms. After each
kill the folder is opened as a server would open it: every file that loads must hold exactly
its original state (the same bytes: the same continuation), and a file that does not load must
be counted as damaged and removed. At the end a runner over the folder continues each prompt
whose state survived, and its greedy text is compared with a runner's that computes it. The
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from workloads import agent_system_prompt, agent_user_messages

MODEL = "smollm2-135m"


def prompts() -> list[list[dict]]:
    system = {"role": "system", "content": agent_system_prompt(400)}
    return [[system, {"role": "user", "content": agent_user_messages(session, 1)[0]}] for session in range(6)]


def runner_texts(folder: Path | None, threads: int, suffix: str = "") -> list:
    """Each prompt's greedy result, on a runner with a disk tier in `folder` (None: without)."""
    from multiseq import Request, Runner, RunnerConfig, SamplingParams

    config = RunnerConfig(model=MODEL, parallel=6, slot_ctx=2048, threads=threads, batch_invariant=True,
                          cache_disk=None if folder is None else str(folder), seed=1)
    requests = [Request(messages=[*chat, *([{"role": "assistant", "content": suffix},
                                            {"role": "user", "content": "Go on."}] if suffix else [])],
                        sampling=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)) for chat in prompts()]
    with Runner(config) as runner:
        return runner.run_batch(requests)


def originals(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from multiseq.kv.disk import DiskTier

    (key,) = [path.name for path in folder.iterdir()]
    tier = DiskTier(folder, 1 << 40, key)
    return {entry.path.name: (entry.tokens, tier.read(entry)) for entry in tier._entries()}


def child(folder: Path, key: str, bound: int, states: Path, seed: int, size_limit: int) -> None:
    """Write the states over and over, until killed."""
    from multiseq.kv.disk import DiskTier

    if size_limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (size_limit, size_limit))
    loaded = np.load(states)
    pairs = [(loaded[f"tokens{index}"], loaded[f"state{index}"]) for index in range(len(loaded.files) // 2)]
    tier = DiskTier(folder, bound, key)
    rng = random.Random(seed)
    while True:
        tokens, state = rng.choice(pairs)
        tier.put(tokens, state, wait=True)
        tier.flush()


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.iterdir():
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


def check_folder(folder: Path, key: str, bound: int, known: dict) -> tuple[int, int]:
    """Open the folder as a server does: every state that loads must be its original; the
    states that loaded and the files counted damaged."""
    from multiseq.kv.disk import DiskTier

    tier = DiskTier(folder.parent, bound, key)
    loaded = 0
    for entry in tier._entries():
        state = tier.read(entry)
        if state is None:
            continue
        tokens, original = known[entry.path.name]
        if not (np.array_equal(entry.tokens, tokens) and np.array_equal(state, original)):
            raise SystemExit(f"a damaged state loaded: {entry.path.name}")
        loaded += 1
    return loaded, tier.stats.num_damaged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--bound-mb", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        folder, key, bound, states, seed, size_limit = args.child
        child(Path(folder), key, int(bound), Path(states), int(seed), int(size_limit))
        return
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "cache"
        computed = runner_texts(cache, args.threads)
        known = originals(cache)
        (key,) = [path.name for path in cache.iterdir()]
        folder = cache / key
        states = Path(scratch) / "states.npz"
        np.savez(states, **{f"{kind}{index}": value for index, pair in enumerate(known.values())
                            for kind, value in zip(("tokens", "state"), pair)})
        bound = args.bound_mb * 2**20
        check_folder(folder, key, bound, known)  # opened under the bench's bound: trimmed to it
        rng = random.Random(7)
        largest, loads, damaged, full_disk_runs, cut_writes = 0, 0, 0, 0, 0
        started = time.perf_counter()
        for kill in range(args.kills):
            size_limit = rng.randint(1, 12) * 2**20 if kill % 4 == 3 else 0
            full_disk_runs += bool(size_limit)
            process = subprocess.Popen([sys.executable, __file__, "--child", str(cache), key, str(bound), str(states),
                                        str(kill), str(size_limit)])
            deadline = time.perf_counter() + 0.3 + rng.uniform(0.02, 0.4)  # about 0.3 s to start Python and numpy
            while time.perf_counter() < deadline:
                largest = max(largest, folder_bytes(folder))
                time.sleep(0.003)
            process.send_signal(signal.SIGKILL)
            process.wait()
            largest = max(largest, folder_bytes(folder))
            cut_writes += bool(list(folder.glob("*.partial")))  # killed while a file was being written
            loaded, found_damaged = check_folder(folder, key, bound, known)
            loads += loaded
            damaged += found_damaged
        survivors = len(list(folder.glob("*.kv")))
        resumed = runner_texts(cache, args.threads, suffix="")
        plain = runner_texts(None, args.threads, suffix="")
        summary = {"kills": args.kills, "full_disk_runs": full_disk_runs, "kills_during_a_write": cut_writes, "states_loaded_after_kills": loads,
                   "damaged_files_removed": damaged, "bound_mb": args.bound_mb,
                   "largest_folder_mb": round(largest / 2**20, 2), "within_bound": largest <= bound,
                   "files_at_end": survivors, "restored_at_end": sum(result.prompt_tokens_from_ram > 0 for result in resumed),
                   "texts_equal": [result.text for result in resumed] == [result.text for result in plain],
                   "first_texts_equal": [result.text for result in computed] == [result.text for result in plain],
                   "seconds": round(time.perf_counter() - started, 1)}
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
