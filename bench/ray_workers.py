"""One runner at 2 threads against two Ray workers at 1 thread each, on the same prompts.

Usage (from the repository root, in the project's virtual environment, with multiseq[ray]):

    python bench/ray_workers.py                      # 64 prompts x 64 tokens, SmolLM2
    python bench/ray_workers.py --prompts 8 --max-tokens 8     # a quick end-to-end check

Both runs are `multiseq batch-run` subprocesses on one prompts file, greedy, EOS ignored:

- local: `-np 16 -t 2` (one runner, both cores);
- ray: `--ray --workers 2 -np 8 -t 1` (a local Ray cluster, two actors of one CPU each).

Each figure is generated tokens over the run's wall time, from the run's --stats-json (model
load and Ray start-up excluded: they are reported apart as the process's total time). The
machine should be quiet. The last line printed is one JSON object with both figures and the
ratio ray / local.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workloads import short_prompts  # bench/ is the script's own folder, first on sys.path


def run(prompts: Path, out_dir: Path, name: str, options: list[str]) -> dict:
    stats = out_dir / f"{name}.stats.json"
    command = [sys.executable, "-m", "multiseq.cli.main", "batch-run", str(prompts), "-o",
               str(out_dir / f"{name}.jsonl"), "--stats-json", str(stats), "--no-dashboard", *options]
    print("$ " + " ".join(command[2:]), file=sys.stderr, flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
    summary = json.loads(stats.read_text())
    return {"system": name, "tokens_per_s": summary["tokens_per_s"], "wall_s": summary["wall_s"],
            "generated_tokens": summary["generated_tokens"], "process_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    common = ["-m", args.model, "-n", str(args.max_tokens), "--temperature", "0", "--ignore-eos"]
    with tempfile.TemporaryDirectory() as folder:
        out_dir = Path(folder)
        prompts = out_dir / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"id": str(index), "prompt": text}) + "\n"
                                   for index, text in enumerate(short_prompts(args.prompts))))
        local = run(prompts, out_dir, "local", [*common, "-np", "16", "-t", "2"])
        on_ray = run(prompts, out_dir, "ray", [*common, "--ray", "--workers", "2", "-np", "8", "-t", "1"])
    for figure in (local, on_ray):
        print(f"{figure['system']:6s} {figure['tokens_per_s']:7.1f} tok/s  wall {figure['wall_s']:6.1f} s  "
              f"process {figure['process_s']:6.1f} s")
    ratio = on_ray["tokens_per_s"] / local["tokens_per_s"]
    print(f"ray / local: {ratio:.2f}")
    print(json.dumps({"local": local, "ray": on_ray, "ray_vs_local_tokens_per_s": ratio}))


if __name__ == "__main__":
    main()
