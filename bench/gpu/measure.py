"""The GPU check's measurements, one phase after another, each written out as soon as it ends.

    bench/gpu/run                      # on the GPU machine: sets up the carried kit, then this
    python bench/gpu/measure.py --dry-run --out bench/out/gpu-dry   # here: the same phases, tiny

Phases (issue 57), on random-weight models in real shapes made here first (make_model.py):

- batch: `multiseq batch-run` against llama-server (the same llama.cpp build, -np N, N streaming
  clients) at np 1, 16 and 64 on the Llama-3.2-1B shape, greedy, end of generation ignored.
  Both the engine's rate (batch-run's --stats-json: first submission to last result) and the
  whole command's (model load included) are kept.
- hostpath: a Runner's worker turns timed at np 64 (bench/hostpath.py's phase clock) with the host's
  and llama.cpp's (backend) sampling, greedy and sampled: host milliseconds per step by phase,
  and the device's share (llama_decode with a llama_synchronize after it).
- serve: `multiseq serve` and llama-server -np 64, 64 streaming chat clients (bench/load.py's
  distinct chats).
- spec: the cost of verifying k draft tokens against a one-token step (bench/spec_cost.py) at
  np 1 and 16.
- reader: a reasoning family's reader on every sequence against none (bench/reader_cost.py) on
  the DeepSeek-R1-Distill-Qwen-1.5B shape with its real tokenizer and template, np 64.
- batch-8b: the batch phase at np 16 and 64 on the Llama-3.1-8B shape, last, when time is left.

A phase that fails is recorded with its error and the next one runs; one that would not end
inside --budget-s (GPU_PHASE_S says how long each takes) is recorded as skipped. results.json and results.md go to --out after every phase.
Without a llama-server (the dry run on a machine that never built one) the peer's half of a
phase is skipped and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "gpu"))

import load  # noqa: E402
import peers  # noqa: E402
import reader_cost  # noqa: E402
import spec_cost  # noqa: E402
from hostpath import PHASES as HOST_PHASES  # noqa: E402
from hostpath import decode_steps, instrumented  # noqa: E402
from make_model import make_model  # noqa: E402
from workloads import short_prompts  # noqa: E402

from multiseq import Request, Runner, RunnerConfig, SamplingParams  # noqa: E402
from multiseq.loading import open_model  # noqa: E402

PHASE_NAMES = ("batch", "hostpath", "serve", "spec", "reader", "batch-8b")
TEMPLATE = "meta-llama-Llama-3.2-3B-Instruct.jinja"
LLAMA_VOCAB = "ggml-vocab-llama-bpe.gguf"
DEEPSEEK_HEADER = "deepseek-r1-distill-qwen-7b.header.gguf"


@dataclass(frozen=True)
class Sizes:
    """How big each phase is: the GPU's sizes, or the dry run's."""

    shape: str
    reader_shape: str
    big_shape: str
    batch_parallels: tuple[int, ...]
    big_parallels: tuple[int, ...]
    prompts_per_slot: int
    batch_tokens: int
    host_slots: int
    host_tokens: int
    serve_clients: int
    serve_requests: int
    spec_slots: tuple[int, ...]
    spec_max_draft: int
    spec_repeats: int
    reader_parallel: int
    reader_tokens: int


GPU = Sizes("llama-1b", "deepseek-1.5b", "llama-8b", (1, 16, 64), (16, 64), 4, 256, 64, 64, 64, 256, (1, 16), 16, 9,
            64, 256)
DRY = Sizes("tiny", "tiny-qwen2", "tiny", (1, 4), (4,), 2, 16, 4, 8, 4, 8, (1, 2), 4, 3, 4, 16)
# About how long each phase takes on the GPU (a guess until the first run says): a phase starts
# only when it can end inside --budget-s.
GPU_PHASE_S = {"batch": 120, "hostpath": 40, "serve": 60, "spec": 20, "reader": 40, "batch-8b": 150}


# --- where the inputs are -------------------------------------------------------------------------

def vendored_llama_cpp() -> Path:
    """The llama.cpp tree llama-cpp-python vendors (its sdist fetched from PyPI once)."""
    cache = peers.default_cache_dir()
    return peers._fetch_sources(cache, cache / "fetch.log", log) / "vendor" / "llama.cpp"


def data_file(kit: Path | None, name: str) -> Path:
    """A file the models are made from: in the carried kit's data/ (the GPU machine has no
    network), else the vendored llama.cpp's models/ (or its templates/), else the test data cache
    (the DeepSeek header)."""
    candidates = [kit / "data" / name] if kit else []
    if not any(candidate.is_file() for candidate in candidates) and name != DEEPSEEK_HEADER:
        source = vendored_llama_cpp()
        candidates += [source / "models" / name, source / "models" / "templates" / name]
    if name == DEEPSEEK_HEADER and not any(candidate.is_file() for candidate in candidates):
        sys.path.insert(0, str(BENCH.parent / "tests"))
        from tiny_models import deepseek_qwen_header
        candidates.append(deepseek_qwen_header())
    for candidate in candidates:
        if Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError(f"{name} is in none of {', '.join(map(str, candidates))}")


class Models:
    """The phases' models, each made the first time a phase asks for it (the 8B one takes 16 GB
    of disk and half a minute: only when its phase runs)."""

    def __init__(self, sizes: Sizes, kit: Path | None, folder: Path) -> None:
        self.sizes, self.kit, self.folder = sizes, kit, folder
        self.made_s: dict[str, float] = {}

    def _made(self, shape: str, vocab: str, template: str | None) -> Path:
        started = time.monotonic()
        text = data_file(self.kit, template).read_text() if template else None
        path = make_model(shape, self.folder / f"{shape}.gguf", data_file(self.kit, vocab), text)
        self.made_s.setdefault(shape, time.monotonic() - started)
        return path

    @property
    def main(self) -> Path:
        return self._made(self.sizes.shape, LLAMA_VOCAB, TEMPLATE)

    @property
    def big(self) -> Path:
        return self._made(self.sizes.big_shape, LLAMA_VOCAB, TEMPLATE)

    @property
    def reader(self) -> Path:
        return self._made(self.sizes.reader_shape, DEEPSEEK_HEADER, None)


def llama_tools():
    """llama-server and llama-batched-bench when there are some ($MULTISEQ_LLAMA_BIN, or built
    here before), else None: the dry run does not build them."""
    if os.environ.get("MULTISEQ_LLAMA_BIN"):
        return peers.ensure_llama_tools()
    tools = peers._tools_in(peers.default_cache_dir())
    return tools if peers._complete(tools) else None


# --- the phases -------------------------------------------------------------------------------------

def batch_run(model: Path, prompts: list[str], parallel: int, tokens: int, workdir: Path) -> dict:
    """The whole `multiseq batch-run` command: its engine's rate and the command's."""
    prompts_file, stats = workdir / "prompts.jsonl", workdir / "stats.json"
    prompts_file.write_text("".join(json.dumps({"id": str(index), "prompt": prompt}) + "\n"
                                    for index, prompt in enumerate(prompts)))
    command = [sys.executable, "-m", "multiseq.cli.main", "batch-run", str(prompts_file), "-o",
               str(workdir / "out.jsonl"), "-m", str(model), "-np", str(parallel), "-n", str(tokens),
               "--ignore-eos", "--temperature", "0", "--slot-ctx", str(256 + tokens), "--no-dashboard",
               "--stats-json", str(stats)]
    started = time.perf_counter()
    finished = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    if finished.returncode != 0:  # what it said goes into the report: the device's run is the one chance
        raise RuntimeError(f"batch-run exited {finished.returncode}:\n" + "\n".join(finished.stderr.splitlines()[-30:]))
    summary = json.loads(stats.read_text())
    if summary["generated_tokens"] != len(prompts) * tokens:
        raise RuntimeError(f"batch-run generated {summary['generated_tokens']} tokens, not {len(prompts) * tokens}")
    return {"tokens_per_s": summary["tokens_per_s"], "command_tokens_per_s": summary["generated_tokens"] / wall,
            "command_s": wall, "ttft_p95_s": summary["ttft_p95_s"]}


def phase_batch(sizes: Sizes, models: Models, tools, workdir: Path) -> dict:
    return batch_rows(models.main, sizes.batch_parallels, sizes, tools, workdir)


def phase_batch_big(sizes: Sizes, models: Models, tools, workdir: Path) -> dict:
    return batch_rows(models.big, sizes.big_parallels, sizes, tools, workdir)


def batch_rows(model: Path, parallels: tuple[int, ...], sizes: Sizes, tools, workdir: Path) -> dict:
    rows = []
    for parallel in parallels:
        prompts = short_prompts(parallel * sizes.prompts_per_slot)
        row = {"parallel": parallel, "prompts": len(prompts), "tokens": sizes.batch_tokens,
               "multiseq": batch_run(model, prompts, parallel, sizes.batch_tokens, workdir)}
        if tools:
            row["llama_server"] = peers.run_llama_server(
                tools, model, prompts, sizes.batch_tokens, parallel, os.cpu_count() or 1,
                256 + sizes.batch_tokens, {"temperature": 0.0}, log=log, seeds=list(range(len(prompts))))
            row["ratio"] = row["multiseq"]["tokens_per_s"] / row["llama_server"]["tokens_per_s"]
        rows.append(row)
        log(f"batch {model.stem} np {parallel}: {summary_line(row)}")
    return {"model": model.stem, "rows": rows}


@contextlib.contextmanager
def device_timed(clock):
    """Time llama_decode followed by llama_synchronize into the clock's "device" sum, so that
    the device's work of a step is counted where it happens, whether llama.cpp waits for it
    there or at the first read."""
    from multiseq.llama import backend as backend_module

    llama = backend_module.llama
    decode = llama.llama_decode

    def decode_and_wait(ctx, batch):
        code = decode(ctx, batch)
        llama.llama_synchronize(ctx)
        return code

    llama.llama_decode = clock.timed("device", decode_and_wait)
    try:
        yield
    finally:
        llama.llama_decode = decode


def host_share(model: Path, slots: int, tokens: int, sampling: str, sampled: bool) -> dict:
    config = RunnerConfig(model=str(model), parallel=slots, slot_ctx=256 + tokens, seed=1, sampling=sampling)
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True, **(
        dict(temperature=0.8, top_p=0.95, seed=index) if sampled else dict(temperature=0.0)))
        for index in range(slots)]
    runner = Runner(config, autostart=False)
    try:
        handles = [runner.submit(Request(prompt=f"Request {index:05d}: tell me something.", sampling=params[index]),
                                 stream=True, on_piece=lambda piece: None) for index in range(slots)]
        with instrumented(runner) as clock, device_timed(clock):
            steps = decode_steps(runner, handles, clock)
    finally:
        runner.close()
    step_ms = 1000 * sum(step.total for step in steps) / len(steps)
    device_ms = 1000 * sum(step.raw.get("device", 0.0) for step in steps) / len(steps)
    return {"sampling": sampling, "sampled": sampled, "steps": len(steps), "step_ms": step_ms,
            "device_ms": device_ms, "host_share": 1 - device_ms / step_ms,
            "tokens_per_s": slots * 1000 / step_ms,
            "phase_ms": {name: 1000 * sum(step.phases[name] for step in steps) / len(steps) for name in HOST_PHASES}}


def phase_hostpath(sizes: Sizes, models: Models, tools, workdir: Path) -> dict:
    rows = []
    for sampling in ("host", "backend"):
        for sampled in (False, True):
            row = host_share(models.main, sizes.host_slots, sizes.host_tokens, sampling, sampled)
            rows.append(row)
            log(f"hostpath np {sizes.host_slots} {sampling} {'sampled' if sampled else 'greedy'}: step "
                f"{row['step_ms']:.2f} ms, device {row['device_ms']:.2f} ms, host share {row['host_share']:.1%}")
    return {"slots": sizes.host_slots, "rows": rows}


def phase_serve(sizes: Sizes, models: Models, tools, workdir: Path) -> dict:
    systems = "multiseq,llama-server" if tools else "multiseq"
    return load.main(["--systems", systems, "--workloads", "distinct", "--model", str(models.main),
                      "--clients", str(sizes.serve_clients), "--parallel", str(sizes.serve_clients),
                      "--requests", str(sizes.serve_requests), "--slot-ctx", "512"])


def phase_spec(sizes: Sizes, models: Models, tools, workdir: Path) -> dict:
    figures = spec_cost.measure(str(models.main), list(sizes.spec_slots), sizes.spec_max_draft,
                                sizes.spec_repeats, os.cpu_count() or 1)
    return {"slots": {str(slots): rows for slots, rows in figures.items()}}


def phase_reader(sizes: Sizes, models: Models, tools, workdir: Path) -> dict:
    model = open_model(str(models.reader))
    try:
        rates = {reader: reader_cost.one_run(model, sizes.reader_parallel, sizes.reader_tokens, os.cpu_count() or 1,
                                             reader, None) for reader in (True, False)}
    finally:
        model.close()
    return {"parallel": sizes.reader_parallel, "tokens": sizes.reader_tokens, "with_reader_tokens_per_s": rates[True],
            "without_tokens_per_s": rates[False], "ratio": rates[True] / rates[False]}


PHASES = {"batch": phase_batch, "hostpath": phase_hostpath, "serve": phase_serve, "spec": phase_spec,
          "reader": phase_reader, "batch-8b": phase_batch_big}


# --- the report -------------------------------------------------------------------------------------

def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def summary_line(row: dict) -> str:
    ours = row["multiseq"]
    text = f"batch-run {ours['tokens_per_s']:.0f} tok/s (whole command {ours['command_tokens_per_s']:.0f})"
    if "llama_server" in row:
        text += f", llama-server {row['llama_server']['tokens_per_s']:.0f} tok/s, {row['ratio']:.2f}x"
    return text


def device_description() -> str:
    if shutil.which("nvidia-smi"):
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True)
        if query.returncode == 0:
            return query.stdout.strip()
    return f"CPU only ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def markdown(report: dict) -> str:
    made = ", ".join(f"{shape} {seconds:.0f} s" for shape, seconds in report.get("models_made_s", {}).items())
    lines = [f"# GPU check: {report['device']}", "", f"mode {report['mode']}, started {report['started']}, "
             f"models made: {made or 'none'}", ""]
    for name, result in report["phases"].items():
        lines.append(f"## {name} ({result.get('seconds', 0):.0f} s)")
        if "error" in result or "skipped" in result:
            lines += [f"{'error' if 'error' in result else 'skipped'}: {result.get('error') or result.get('skipped')}", ""]
            continue
        lines += PHASE_TABLES.get(name, lambda result: [f"```\n{json.dumps(result, indent=1)}\n```"])(result) + [""]
    return "\n".join(lines) + "\n"


def batch_table(result: dict) -> list[str]:
    lines = ["| np | prompts x tokens | batch-run tok/s | whole command tok/s | llama-server tok/s | ratio |",
             "|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        ours = row["multiseq"]
        peer = f"{row['llama_server']['tokens_per_s']:.0f}" if "llama_server" in row else "n/a"
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else "n/a"
        lines.append(f"| {row['parallel']} | {row['prompts']} x {row['tokens']} | {ours['tokens_per_s']:.0f} | "
                     f"{ours['command_tokens_per_s']:.0f} | {peer} | {ratio} |")
    return lines


def hostpath_table(result: dict) -> list[str]:
    lines = ["| sampling | rows | step ms | device ms | host share | tok/s | " + " | ".join(HOST_PHASES) + " |",
             "|---|---|---:|---:|---:|---:|" + "---:|" * len(HOST_PHASES)]
    for row in result["rows"]:
        phases = " | ".join(f"{row['phase_ms'][name]:.2f}" for name in HOST_PHASES)
        lines.append(f"| {row['sampling']} | {'sampled' if row['sampled'] else 'greedy'} | {row['step_ms']:.2f} | "
                     f"{row['device_ms']:.2f} | {row['host_share']:.1%} | {row['tokens_per_s']:.0f} | {phases} |")
    return lines


def serve_table(result: dict) -> list[str]:
    lines = ["| system | tok/s | TTFT p50 s | TTFT p95 s |", "|---|---:|---:|---:|"]
    for figure in result["figures"]:
        lines.append(f"| {figure['system']} | {figure['tokens_per_s']:.0f} | {figure.get('ttft_p50_s') or 0:.3f} | "
                     f"{figure.get('ttft_p95_s') or 0:.3f} |")
    return lines + [f"{name}: {ratio:.2f}x" for name, ratio in result["ratios"].items()]


def spec_table(result: dict) -> list[str]:
    lines = ["| slots | k | ms | x a one-token step |", "|---:|---:|---:|---:|"]
    for slots, rows in result["slots"].items():
        lines += [f"| {slots} | {k} | {row['ms']:.2f} | {row['ratio']:.2f} |" for k, row in rows.items()]
    return lines


def reader_table(result: dict) -> list[str]:
    return [f"np {result['parallel']}, {result['tokens']} tokens: with the reader {result['with_reader_tokens_per_s']:.0f} "
            f"tok/s, without {result['without_tokens_per_s']:.0f} tok/s ({result['ratio']:.3f}x)"]


PHASE_TABLES = {"batch": batch_table, "batch-8b": batch_table, "hostpath": hostpath_table, "serve": serve_table, "spec": spec_table,
                "reader": reader_table}


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "results.md").write_text(markdown(report))


def run(args: argparse.Namespace) -> dict:
    sizes = DRY if args.dry_run or args.sizes == "tiny" else GPU
    started = time.monotonic()
    report = {"device": device_description(), "mode": "dry run" if args.dry_run else "gpu", "sizes": asdict(sizes),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "phases": {}}
    tools = None if args.no_peers else llama_tools()
    if tools is None:
        log("no llama-server: the peer's half of each phase is skipped")
    with tempfile.TemporaryDirectory(prefix="multiseq-gpu-") as tmp:
        workdir = Path(tmp)
        models = Models(sizes, args.kit, args.models or workdir)
        report["models_made_s"] = models.made_s
        for name in args.phases.split(","):
            elapsed = time.monotonic() - started
            needs = 0 if sizes is DRY else GPU_PHASE_S[name]
            if elapsed + needs > args.budget_s:
                report["phases"][name] = {"skipped": f"{elapsed:.0f} s spent, and {name} takes about {needs} s: "
                                                     f"over --budget-s {args.budget_s:.0f}"}
                continue
            phase_started = time.monotonic()
            log(f"phase {name} ...")
            try:
                result = PHASES[name](sizes, models, tools, workdir)
            except Exception as error:  # noqa: BLE001 - one phase's failure must not lose the others'
                result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
                log(f"phase {name} failed: {result['traceback']}")
            result["seconds"] = time.monotonic() - phase_started
            report["phases"][name] = result
            write_report(report, args.out)
    report["seconds"] = time.monotonic() - started
    write_report(report, args.out)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny models and sizes, CPU: the scripts' own check")
    parser.add_argument("--sizes", choices=("gpu", "tiny"), default="gpu",
                        help="tiny: the dry run's models and sizes (to rehearse bench/gpu/run's setup on a CPU)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", BENCH / "out" / "gpu")))
    parser.add_argument("--kit", type=Path, default=None, help="the unpacked kit (data/: vocabulary, header, template)")
    parser.add_argument("--models", type=Path, default=None, help="where the models are made (default: a temp folder)")
    parser.add_argument("--phases", default=",".join(PHASE_NAMES))
    parser.add_argument("--no-peers", action="store_true", help="measure multiseq alone, even where llama-server is")
    parser.add_argument("--budget-s", type=float, default=420.0, help="a phase starts only when it can end within this many seconds of the start")
    args = parser.parse_args(argv)
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(PHASE_NAMES)}")
    report = run(args)
    print(markdown(report))
    failed = [name for name, result in report["phases"].items() if "error" in result]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
