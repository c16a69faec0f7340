"""Large prompt files through `multiseq batch-run`: first result, resident memory, Ctrl-C.

Usage (from the repository root, in the project's virtual environment):

    python bench/large_file.py                  # a 200,000-line and a 2,000-line file at -np 16
    python bench/large_file.py --million        # and a 1,000,000-line file
    python bench/large_file.py --lines 3000 --small-lines 300 --measure-at 100   # a quick check

For each file (JSON lines of ~70 bytes, as in the issue's 14 MB for 200,000 lines) it runs

    multiseq batch-run FILE -o OUT -np 16 -n 2 --temperature 0 --ignore-eos --no-dashboard

as a subprocess and measures:

- first_result_s: from starting the process to the first line in the results file (Python
  start-up, the duplicate-id pass over the file and the model load included);
- rss_mb: the process's resident memory (VmRSS in /proc/PID/status) once --measure-at results
  are written (default 2,000). The small file ends right there; if the process exits between
  two polls, the last sample before its end is kept, and rss_at_results says where it was taken;
- ctrl_c_s: for files longer than --measure-at, the time from a SIGINT sent right after the
  memory sample to the process's exit (exit code 130 expected).

The machine should be quiet: other processes on the same cores make every figure worse.
Progress goes to stderr; the last line printed is one JSON object with every figure and the
ratio of each large file's memory to the small file's.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLL_SECONDS = 0.005


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_prompts(path: Path, count: int) -> Path:
    with path.open("w") as out:
        for index in range(count):
            out.write(f'{{"id": "q{index:07d}", "prompt": "Write one word about the number {index}."}}\n')
    return path


def resident_mb(pid: int) -> float | None:
    """VmRSS of a running process, in MB; None once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class LineCounter:
    """Counts the lines of a growing file, reading only what was added since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self._offset = 0

    def update(self) -> int:
        if self.path.exists():
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                added = handle.read()
            self._offset += len(added)
            self.count += added.count(b"\n")
        return self.count


def measure(prompts: Path, out: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "multiseq.cli.main", "batch-run", str(prompts), "-o", str(out),
               "-m", args.model, "-np", str(args.parallel), "-n", str(args.max_tokens), "--temperature", "0",
               "--ignore-eos", "--no-dashboard"]
    if args.threads:
        command += ["-t", str(args.threads)]
    lines = LineCounter(out)
    with tempfile.TemporaryFile("w+") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        figures = {"first_result_s": None, "rss_mb": None, "rss_at_results": None, "ctrl_c_s": None}
        while process.poll() is None and lines.update() < args.measure_at:
            if figures["first_result_s"] is None and lines.count:
                figures["first_result_s"] = time.perf_counter() - started
            rss = resident_mb(process.pid)
            if rss is not None and lines.count:
                figures["rss_mb"], figures["rss_at_results"] = rss, lines.count
            time.sleep(POLL_SECONDS)
        if process.poll() is None:
            figures["rss_mb"], figures["rss_at_results"] = resident_mb(process.pid), lines.update()
            figures["first_result_s"] = figures["first_result_s"] or time.perf_counter() - started
            process.send_signal(signal.SIGINT)
            interrupted = time.perf_counter()
            process.wait()
            figures["ctrl_c_s"] = time.perf_counter() - interrupted
        figures["exit_code"] = process.wait()
        figures["lines_written"] = lines.update()
        stderr.seek(0)
        figures["summary"] = [line for line in stderr.read().splitlines() if "not started" in line or "Error" in line]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000, help="lines of the large file")
    parser.add_argument("--small-lines", type=int, default=2_000, help="lines of the small file")
    parser.add_argument("--million", action="store_true", help="also a 1,000,000-line file")
    parser.add_argument("--measure-at", type=int, default=2_000, help="results written when memory is sampled")
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: multiseq's)")
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    sizes = [args.small_lines, args.lines] + ([1_000_000] if args.million else [])
    report: dict = {"parallel": args.parallel, "max_tokens": args.max_tokens, "measure_at": args.measure_at,
                    "model": args.model, "files": {}}
    with tempfile.TemporaryDirectory(prefix="multiseq-large-") as folder:
        for size in sizes:
            prompts = write_prompts(Path(folder) / f"prompts-{size}.jsonl", size)
            log(f"{size:,} lines ({prompts.stat().st_size / 1e6:.1f} MB): running")
            figures = measure(prompts, Path(folder) / f"out-{size}.jsonl", args)
            figures["file_mb"] = prompts.stat().st_size / 1e6
            log(f"{size:,} lines: {figures}")
            report["files"][str(size)] = figures
            prompts.unlink()
    small_rss = report["files"][str(args.small_lines)]["rss_mb"]
    for size in sizes[1:]:
        rss = report["files"][str(size)]["rss_mb"]
        if small_rss and rss:
            report["files"][str(size)]["rss_vs_small"] = rss / small_rss
    print(json.dumps(report))


if __name__ == "__main__":
    main()
