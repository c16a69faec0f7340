"""Three models behind one server within a memory budget that holds two of them: requests
alternating over all three, the server's resident set against the budget, every request answered.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/models_memory.py [--rounds 6] [--clients 2] [--threads 2]

One `multiseq serve --models-preset FILE --models-memory SIZE`: SmolLM2, Gemma 3 270M and a copy
of SmolLM2's file under another name (a third model as large as the first), each `c = 4096`,
`np = 4`, `cache-ram = 256` (or `--cache-ram`). A first start, with a budget of 64G, says what
the server holds before its models (its log); what each model takes is computed here with the
function the server uses. The budget is then that baseline, what the three keep for the process
once loaded (their constraints' tokenizers), SmolLM2's share and Gemma's, plus 16 MiB: two
models fit, never three. The second start serves `--rounds` rounds of greedy completions naming
the three models in turn (`--clients` at a time), while the process's resident set is read
every 10 ms; the kernel's own peak (VmHWM) is read at the end. Reported: the peak against the
budget (target: at most the budget plus 10%), requests answered, loads and unloads (the
server's log). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path
from multiseq import models
from multiseq.config import RunnerConfig
from multiseq.loading import memory_of
from rag import post

NAMES = ("smollm2-135m", "gemma3-270m", "smollm2-copy")
SETTINGS = {"kv_pool": 4096, "parallel": 4, "step_tokens": 96}  # as serve makes them from the file


def preset_file(folder: Path, files: dict[str, Path], threads: int, cache_ram_mib: int) -> Path:
    sections = "".join(f"[{name}]\nmodel = {path}\n\n" for name, path in files.items())
    path = folder / "models.ini"
    path.write_text(f"[*]\nc = 4096\nnp = 4\ncache-ram = {cache_ram_mib}\nt = {threads}\n\n{sections}")
    return path


def resident(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def start(preset: Path, budget: str, folder: Path, name: str):
    port = peers._free_port()
    command = [sys.executable, "-m", "multiseq.cli.main", "serve", "--models-preset", str(preset),
               "--models-memory", budget, "--port", str(port), "--no-dashboard"]
    return peers.start_server(command, folder / f"{name}.log", port)


def baseline_bytes(preset: Path, folder: Path) -> int:
    """What the server holds before its models, as its log says."""
    process, _ = start(preset, "64G", folder, "first")
    peers._stop(process)
    found = re.search(r"the server itself holds ([\d.]+) (GiB|MiB)", (folder / "first.log").read_text())
    if found is None:
        raise SystemExit("the server did not say what it holds before its models")
    return int(float(found[1]) * (2**30 if found[2] == "GiB" else 2**20))


def alternate(base: str, rounds: int, clients: int) -> tuple[int, list[str]]:
    """Completions naming the models in turn, `clients` at a time; (answered, failures)."""
    order = list(itertools.islice(itertools.cycle(NAMES), rounds * len(NAMES)))
    answered, failures, lock = [0], [], threading.Lock()

    def one(model: str) -> None:
        try:
            post(base, "/v1/completions", {"model": model, "prompt": "The capital of France is", "max_tokens": 8,
                                           "temperature": 0})
            with lock:
                answered[0] += 1
        except Exception as error:  # noqa: BLE001 - counted and shown: nothing may be lost
            with lock:
                failures.append(f"{model}: {error}")

    peers.each_by_clients(clients, order, one)
    return answered[0], failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-ram", type=int, default=256, help="each model's RAM tier bound, MiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="multiseq-memory-") as folder_name:
        folder = Path(folder_name)
        smol = models.resolve(NAMES[0]).path
        files = {NAMES[0]: smol, NAMES[1]: models.resolve(NAMES[1]).path, NAMES[2]: folder / "smollm2-copy.gguf"}
        shutil.copyfile(smol, files[NAMES[2]])
        preset = preset_file(folder, files, args.threads, args.cache_ram)
        measured = {name: memory_of(RunnerConfig(model=str(path), threads=args.threads,
                                                     cache_ram_mib=args.cache_ram, **SETTINGS))
                    for name, path in files.items()}
        shares = {name: loaded for name, (loaded, _, _) in measured.items()}
        baseline = baseline_bytes(preset, folder)
        budget = baseline + sum(kept for _, kept, _ in measured.values()) + shares[NAMES[0]] + shares[NAMES[1]] + \
            16 * 2**20
        process, base = start(preset, str(budget), folder, "budget")
        peak, sampling = [resident(process.pid)], threading.Event()

        def sample() -> None:
            while not sampling.wait(0.01):
                peak[0] = max(peak[0], resident(process.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        try:
            answered, failures = alternate(base, args.rounds, args.clients)
            seconds = time.perf_counter() - started
            sampling.set()
            sampler.join()
            kernel_peak = resident(process.pid, "VmHWM")
        finally:
            peers._stop(process)
        log = (folder / "budget.log").read_text()
    result = {"cache_ram_mib": args.cache_ram, "budget_bytes": budget, "baseline_bytes": baseline,
              "shares_bytes": shares,
              "peak_rss_bytes": peak[0], "kernel_peak_rss_bytes": kernel_peak,
              "peak_over_budget": max(peak[0], kernel_peak) / budget, "requests": args.rounds * len(NAMES),
              "answered": answered, "failures": failures, "loads": log.count("INFO multiseq.server: loaded "),
              "unloads": log.count("INFO multiseq.server: unloaded "), "seconds": seconds}
    mib = {key: value / 2**20 for key, value in result.items() if key.endswith("_bytes") and key != "shares_bytes"}
    print(f"budget {mib['budget_bytes']:.0f} MiB (the server itself {mib['baseline_bytes']:.0f} MiB, shares "
          + ", ".join(f"{name} {share / 2**20:.0f} MiB" for name, share in shares.items())
          + f"); peak resident set {mib['peak_rss_bytes']:.0f} MiB sampled, {mib['kernel_peak_rss_bytes']:.0f} MiB "
          f"by the kernel ({result['peak_over_budget']:.2f}x the budget); {answered} of {result['requests']} "
          f"answered in {seconds:.1f} s; {result['loads']} loads, {result['unloads']} unloads")
    for failure in failures:
        print("failed:", failure)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
