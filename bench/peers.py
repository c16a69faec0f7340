"""Peer systems that the multiseq runner is benchmarked against.

Three peers are measured on the same workload as our runner:

* ``llama-server`` (llama.cpp's own HTTP server) with ``-np N`` parallel slots
  and its built-in continuous batching, driven by exactly N concurrent client
  threads that stream ``POST /completion`` requests (``run_llama_server``).
* ``llama-batched-bench``, llama.cpp's synthetic batched-decoding benchmark:
  B sequences decoded in lock-step with no HTTP, no sampling and no
  scheduling overhead - the raw ceiling of the ggml kernels
  (``run_batched_bench``).
* Plain sequential ``llama_cpp.Llama.create_completion`` calls, i.e. what
  llama-cpp-python users do today (``run_sequential_llama``).

Both llama.cpp tools are built from the llama.cpp tree vendored in the
llama-cpp-python 0.3.36 sdist (``ensure_llama_tools``), so all peers run the
exact same ggml/llama code as the Python bindings, with cmake's default CPU
flags (GGML_NATIVE default, as a plain ``pip install llama-cpp-python`` gets).

What is held equal across systems: the prompts, exactly ``max_tokens``
generated tokens per request (EOS ignored and checked afterwards), the
sampling fields in ``SAMPLING_KEYS``, the thread count, no prompt-prefix
reuse between requests, one KV stream per sequence (kv_unified off, as in our
runner), full-size SWA cache and flash attention "auto" (the values of
llama_context_default_params(), which our runner uses). Each function returns
a flat dict of figures (tokens/s over wall time, TTFT p50/p95, ...).

Only stdlib, numpy and multiseq's cache folder are used, except for ``open_reference_llama``, which
creates llama-cpp-python's own ``Llama``: that class is the peer being
measured, so it is imported here, where only the benchmark uses it (the
library itself reaches llama.cpp through runner/llama/backend.py alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
_SDIST_DIRNAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
_TARGETS = ("llama-server", "llama-batched-bench")

# cmake options for the peer tools. Everything that affects the kernels
# (GGML_NATIVE, GGML_OPENMP, GGML_LLAMAFILE, ...) is left at cmake's default,
# which is also what a default ``pip install llama-cpp-python`` build uses.
_CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # Static link: the cached binaries then run from the cache folder without
    # needing an rpath to a build tree that we delete afterwards.
    "-DBUILD_SHARED_LIBS=OFF",
    # The server's web UI would otherwise be fetched from a Hugging Face
    # bucket (LLAMA_USE_PREBUILT_UI, default ON) or built with npm
    # (LLAMA_BUILD_UI); both need network. With both OFF the server is built
    # with an empty asset table (see scripts/ui-assets.cmake).
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    # No HTTPS / model downloading in the server: nothing at build or run
    # time should touch the network. (LLAMA_CURL is gone in this llama.cpp;
    # passing it only prints a deprecation warning.)
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DGGML_BACKEND_DL=OFF",
)


@dataclasses.dataclass(frozen=True)
class LlamaTools:
    """Paths of the llama.cpp peer binaries and the sources they came from."""

    server: Path
    batched_bench: Path
    source_dir: Path


# --------------------------------------------------------------------------
# 1. Building llama.cpp's tools from the pinned sources
# --------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``llama.cpp-0.3.36`` in multiseq's cache folder (``$MULTISEQ_CACHE_DIR``, else
    ``~/.cache/multiseq`` on Linux)."""
    from multiseq.models import cache_dir

    return cache_dir() / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


def _tools_in(cache_dir: Path) -> LlamaTools:
    bin_dir = cache_dir / "bin"
    return LlamaTools(
        server=bin_dir / "llama-server",
        batched_bench=bin_dir / "llama-batched-bench",
        source_dir=cache_dir / "src" / _SDIST_DIRNAME / "vendor" / "llama.cpp",
    )


def _prebuilt_tools(bin_dir: Path) -> LlamaTools:
    tools = LlamaTools(server=bin_dir / "llama-server", batched_bench=bin_dir / "llama-batched-bench",
                       source_dir=bin_dir)
    if not _complete(tools):
        raise RuntimeError(f"MULTISEQ_LLAMA_BIN={bin_dir} holds no executable llama-server and llama-batched-bench")
    return tools


def _complete(tools: LlamaTools) -> bool:
    return all(os.access(p, os.X_OK) for p in (tools.server, tools.batched_bench))


@contextlib.contextmanager
def _file_lock(path: Path):
    """Exclusive lock so two benchmark processes never build concurrently."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_logged(cmd: list[str], log_file: Path, log: Callable, cwd=None) -> None:
    """Run ``cmd`` appending its output to ``log_file``; raise with the tail."""
    log("$ " + " ".join(cmd))
    with open(log_file, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
    if rc != 0:
        tail = log_file.read_text(errors="replace").splitlines()[-40:]
        raise RuntimeError(
            f"command failed (exit {rc}): {' '.join(cmd)}\n"
            f"--- last lines of {log_file} ---\n" + "\n".join(tail)
        )


def _fetch_sources(cache_dir: Path, log_file: Path, log: Callable) -> Path:
    """Download + unpack the llama-cpp-python sdist into ``cache_dir/src``."""
    src_root = cache_dir / "src"
    target = src_root / _SDIST_DIRNAME
    if (target / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        return target
    src_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=src_root, prefix=".fetch-") as tmp:
        tmp_path = Path(tmp)
        _run_logged(
            [sys.executable, "-m", "pip", "download", "--no-deps",
             "--no-binary", ":all:",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(tmp_path)],
            log_file, log,
        )
        archives = sorted(tmp_path.glob("llama_cpp_python-*.tar.gz"))
        if not archives:
            raise RuntimeError(f"pip download produced no sdist in {tmp_path}")
        unpack = tmp_path / "unpacked"
        with tarfile.open(archives[0]) as tar:
            # 'data' filter rejects absolute paths/links outside the tree.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(unpack, filter="data")
            else:  # pragma: no cover - Python < 3.10.12
                tar.extractall(unpack)
        if target.exists():  # stale partial tree from an older layout
            shutil.rmtree(target)
        # Rename is atomic: sources either exist completely or not at all.
        os.replace(unpack / _SDIST_DIRNAME, target)
    return target


def _build(source_dir: Path, cache_dir: Path, log_file: Path, log: Callable) -> None:
    """cmake-build the two targets in a temp dir, then publish ``bin/``."""
    jobs = "2"
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as tmp:
        build_dir = Path(tmp) / "build"
        _run_logged(
            ["cmake", "-S", str(source_dir), "-B", str(build_dir), *_CMAKE_OPTIONS],
            log_file, log,
        )
        _run_logged(
            ["cmake", "--build", str(build_dir), "--config", "Release",
             "-j", jobs, "--target", *_TARGETS],
            log_file, log,
        )
        staged = Path(tmp) / "bin"
        staged.mkdir()
        for name in _TARGETS:
            built = build_dir / "bin" / name
            if not built.is_file():
                raise RuntimeError(f"build finished but {built} is missing")
            shutil.copy2(built, staged / name)
        final = cache_dir / "bin"
        if final.exists():  # incomplete leftovers (we only get here if so)
            shutil.rmtree(final)
        # A single directory rename publishes both binaries at once, so an
        # interrupted build never leaves a bin/ that looks complete.
        os.replace(staged, final)


def ensure_llama_tools(cache_dir: Path | None = None, log=print) -> LlamaTools:
    """Return llama-server / llama-batched-bench built from the pinned sources.

    Sources: the llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist
    (fetched with ``pip download``). Build: cmake Release, CPU only, static,
    no web UI / network, ``-j2``, only the two targets. Cached in
    ``cache_dir`` (default ``default_cache_dir()``); returns immediately when
    both binaries are already there. ``$MULTISEQ_LLAMA_BIN``, when set, names a folder of
    binaries built elsewhere from the same sources (bench/gpu/prepare's CUDA build), used as
    they are.
    """
    prebuilt = os.environ.get("MULTISEQ_LLAMA_BIN")
    if prebuilt:
        return _prebuilt_tools(Path(prebuilt))
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    tools = _tools_in(cache_dir)
    if _complete(tools):
        return tools
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_dir / ".build.lock"):
        if _complete(tools):  # another process finished while we waited
            return tools
        # Temp dirs of a build that was killed hard (SIGKILL, power loss);
        # safe to delete since we hold the lock.
        for stale in [*cache_dir.glob(".build-*"), *cache_dir.glob("src/.fetch-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        log_file = cache_dir / "build.log"
        log(f"building llama.cpp tools into {cache_dir} (log: {log_file})")
        t0 = time.monotonic()
        _fetch_sources(cache_dir, log_file, log)
        _build(tools.source_dir, cache_dir, log_file, log)
        log(f"llama.cpp tools built in {time.monotonic() - t0:.0f} s")
    return tools


# --------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------

# Sampling settings every peer understands, under the names llama-server's
# /completion and Llama.create_completion both use. Anything else is refused
# so a typo can never silently turn into a different workload.
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "seed",
                 "repeat_penalty", "repeat_last_n")


def _check_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"unsupported sampling fields {unknown}; "
                         f"allowed: {list(SAMPLING_KEYS)}")
    # seed=None means "random" for both peers, which is their default anyway.
    return {k: v for k, v in sampling.items() if v is not None}


def _per_request(sampling: dict[str, Any], n: int,
                 seeds: Sequence[int | None] | None) -> list[dict[str, Any]]:
    """One sampling dict per request; ``seeds[i]`` (if given) overrides the seed.

    Lets a caller give request i its own seed (e.g. base + i), as our runner
    does, so sampled workloads draw the same streams on every system.
    """
    if seeds is None:
        return [sampling] * n
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} prompts")
    out = []
    for seed in seeds:
        d = {k: v for k, v in sampling.items() if k != "seed"}
        if seed is not None:
            d["seed"] = seed
        out.append(d)
    return out


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 95))


def _summary(system: str, ttfts: Sequence[float], generated: int,
             prompt_tokens: int, wall_s: float, **extra) -> dict:
    p50, p95 = _percentiles(ttfts)
    return {
        "system": system,
        **extra,
        "num_requests": len(ttfts),
        "generated_tokens": generated,
        "wall_s": wall_s,
        "tokens_per_s": generated / wall_s if wall_s > 0 else float("nan"),
        "ttft_p50_s": p50,
        "ttft_p95_s": p95,
        "prompt_tokens": prompt_tokens,
    }


# --------------------------------------------------------------------------
# 2. llama-server with parallel slots
# --------------------------------------------------------------------------


def _swa_args(swa_full: bool) -> list[str]:
    # llama_context_default_params() - used by our runner and by
    # llama_cpp.Llama() - has swa_full=true (full-size KV for sliding-window
    # layers, e.g. Gemma 3), while the llama.cpp tools default to false.
    # Default to the bindings' setting so every system holds the same KV.
    return ["--swa-full"] if swa_full else []

# Loopback traffic must not go through an http_proxy from the environment.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _wait_healthy(proc: subprocess.Popen, base: str, timeout_s: float = 120.0) -> None:
    """Poll ``GET /health`` until 200 (it answers 503 while loading).

    The caller appends the server's log tail to any error raised here.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with code {proc.returncode} "
                               "before becoming healthy")
        try:
            with _HTTP.open(base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass  # not listening yet, or 503 while the model loads
        time.sleep(0.25)
    raise RuntimeError(f"llama-server not healthy after {timeout_s:.0f} s")


def start_server(command: list[str], log: Path, port: int, timeout_s: float = 300) -> tuple[subprocess.Popen, str]:
    """A server command started on 127.0.0.1:port, its output to `log`; the process and its base
    URL once /health answers (SystemExit with the log's tail when it does not)."""
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(process, base, timeout_s=timeout_s)
    except RuntimeError as error:
        _stop(process)
        raise SystemExit(f"{command[0]} did not start: {error}\n{_tail(log)}") from None
    return process, base


def _stream_completion(base: str, body: dict, timeout_s: float) -> dict:
    """POST one streamed /completion; return client timings + final stats."""
    req = urllib.request.Request(
        base + "/completion", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    t_sent = time.perf_counter()
    t_first = None
    final = None
    pieces = []
    with _HTTP.open(req, timeout=timeout_s) as resp:
        for raw in resp:  # SSE: "data: {...}" lines separated by blank lines
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators and ": ping" comments
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                raise RuntimeError(f"llama-server error: {event['error']}")
            if t_first is None and event.get("content"):
                t_first = time.perf_counter()
            pieces.append(event.get("content") or "")
            if event.get("stop"):
                final = event
                t_done = time.perf_counter()
    if final is None:
        raise RuntimeError("llama-server stream ended without a final (stop) event")
    timings = final.get("timings", {})
    return {
        "t_sent": t_sent,
        "t_done": t_done,
        # A request whose tokens all decode to "" never shows content; count
        # its first token as arriving with the final event then.
        "ttft_s": (t_first if t_first is not None else t_done) - t_sent,
        "tokens_predicted": int(final.get("tokens_predicted", -1)),
        "predicted_n": int(timings.get("predicted_n", -1)),
        "prompt_n": int(timings.get("prompt_n", -1)),
        "tokens_evaluated": int(final.get("tokens_evaluated", -1)),
        "predicted_per_second": timings.get("predicted_per_second"),
        # with --spec-type: draft tokens verified, and how many were kept
        "draft_n": int(timings.get("draft_n", 0)),
        "draft_n_accepted": int(timings.get("draft_n_accepted", 0)),
        "stop_type": final.get("stop_type"),
        "text": "".join(pieces),
    }


def _server_body(prompt: str, max_tokens: int, sampling: Mapping[str, Any],
                 prompt_cache: bool = False, extra_body: Mapping[str, Any] | None = None,
                 ignore_eos: bool = True) -> dict:
    # temperature <= 0 is greedy in llama-server without touching top_k: its
    # temperature sampler (llama_sampler_temp_impl) keeps only the arg-max
    # logit and sets all others to -inf, so the final "dist" draw is forced.
    # extra_body adds request fields beyond sampling (e.g. "json_schema").
    return {"prompt": prompt, "n_predict": max_tokens, "ignore_eos": ignore_eos,
            "cache_prompt": prompt_cache, "stream": True, **sampling, **(extra_body or {})}


def server_command(tools: LlamaTools, model_path, parallel: int, threads: int,
                   slot_ctx: int, port: int, flash_attn: str = "auto",
                   swa_full: bool = True, extra_args: Sequence[str] = (),
                   prompt_cache: bool = False) -> list[str]:
    """The llama-server command line used by ``run_llama_server``.

    ``prompt_cache`` keeps llama-server's own defaults for prompt caching (each
    slot reuses the common prefix of its last prompt; idle slots' prompts are
    saved to a host-RAM cache); otherwise every kind of prompt caching is off."""
    no_cache = [] if prompt_cache else [
        # No prompt caching of any kind (requests also send cache_prompt:
        # false): no host-RAM prompt cache, so no saving of idle slots on
        # every new task, and no SWA context checkpoints (Gemma 3 has SWA).
        "--no-cache-prompt", "--cache-ram", "0", "--ctx-checkpoints", "0"]
    return [
        str(tools.server), "-m", str(model_path),
        "-np", str(parallel), "-c", str(parallel * slot_ctx),
        "-t", str(threads), "-tb", str(threads),
        "--host", "127.0.0.1", "--port", str(port),
        "-cb",  # continuous batching (already the default; explicit)
        # An explicit -np keeps kv_unified off (only -np auto turns it on):
        # each slot owns its own slot_ctx-sized KV range, as in our runner.
        # Flash attention "auto" (resolved per device at context creation) is
        # both llama.cpp's default and what our runner gets from
        # llama_context_default_params(). Note llama_cpp.Llama() instead
        # defaults to flash_attn=False, so the sequential peer differs unless
        # its caller builds it with flash_attn=True.
        "-fa", flash_attn,
        *_swa_args(swa_full),
        "--no-webui",
        *no_cache,
        "--log-verbosity", "2",  # warnings and errors only
        *extra_args,
    ]


def run_llama_server(tools: LlamaTools, model_path, prompts: list[str], max_tokens: int,
                     parallel: int, threads: int, slot_ctx: int, sampling: dict,
                     log=print, *, seeds: Sequence[int | None] | None = None,
                     flash_attn: str = "auto", swa_full: bool = True,
                     extra_args: Sequence[str] = (), prompt_cache: bool = False,
                     request_timeout_s: float = 600.0,
                     extra_body: Mapping[str, Any] | None = None,
                     ignore_eos: bool = True) -> dict:
    """Serve ``prompts`` through llama-server with ``parallel`` slots.

    Exactly ``parallel`` client threads pull prompts from a shared queue and
    stream ``POST /completion`` (ignore_eos, no prompt cache). TTFT is taken
    client-side at the first event with non-empty content; wall time runs
    from the first request sent to the last final event (warm-up excluded).
    Raises if any request generated other than ``max_tokens`` tokens.
    ``seeds`` optionally gives each request its own seed; ``flash_attn`` /
    ``swa_full`` / ``extra_args`` / ``prompt_cache`` tune the server (see
    ``server_command``). ``extra_body`` adds fields to every request body (e.g.
    a ``json_schema``); with ``ignore_eos=False`` requests may end before
    ``max_tokens`` (no exact-count check). The figure's "texts" are the
    outputs in prompt order.
    """
    if not prompts:
        raise ValueError("no prompts")
    samplings = _per_request(_check_sampling(sampling), len(prompts), seeds)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = server_command(tools, model_path, parallel, threads, slot_ctx, port,
                         flash_attn, swa_full, extra_args, prompt_cache)
    with tempfile.TemporaryDirectory(prefix="multiseq-server-") as tmp:
        log_path = Path(tmp) / "server.log"
        log("$ " + " ".join(cmd))
        with open(log_path, "wb") as log_fh:
            # A file, not a pipe: a full pipe buffer would stall the server.
            proc = subprocess.Popen(cmd, stdout=log_fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        try:
            _wait_healthy(proc, base)
            warm_up = "Warm up." if prompt_cache else prompts[0]  # nothing of the workload cached
            _stream_completion(base, _server_body(warm_up, 4, samplings[0], prompt_cache, extra_body, ignore_eos),
                               request_timeout_s)  # warm-up, not measured
            results = _drive_clients(base, prompts, parallel, request_timeout_s,
                                     lambda prompt, index: _server_body(prompt, max_tokens, samplings[index],
                                                                        prompt_cache, extra_body, ignore_eos))
        except Exception as exc:
            raise RuntimeError(f"llama-server run failed: {exc}\n"
                               f"--- server log tail ---\n{_tail(log_path)}") from exc
        finally:
            _stop(proc)
    bad = [(i, r["tokens_predicted"], r["predicted_n"], r["stop_type"])
           for i, r in enumerate(results)
           if r["tokens_predicted"] != max_tokens or r["predicted_n"] != max_tokens]
    if bad and ignore_eos:
        raise RuntimeError(f"llama-server: requests did not generate exactly "
                           f"{max_tokens} tokens (index, tokens_predicted, "
                           f"predicted_n, stop_type): {bad[:10]}")
    wall = max(r["t_done"] for r in results) - min(r["t_sent"] for r in results)
    return _summary("llama-server" + (" prompt-cache" if prompt_cache else ""), [r["ttft_s"] for r in results],
                    sum(r["tokens_predicted"] for r in results),
                    sum(r["prompt_n"] for r in results), wall,
                    parallel=parallel, command=" ".join(cmd), texts=[r["text"] for r in results],
                    decode_rates=[r["predicted_per_second"] for r in results],
                    draft_tokens=sum(r["draft_n"] for r in results),
                    draft_tokens_accepted=sum(r["draft_n_accepted"] for r in results))


def _drive_clients(base: str, prompts: list[str], parallel: int, timeout_s: float,
                   make_body: Callable[[str, int], dict]) -> list[dict]:
    """Send every prompt with exactly ``parallel`` concurrent client threads;
    ``make_body(prompt, index)`` gives each request's body."""
    return each_by_clients(parallel, list(enumerate(prompts)),
                           lambda item: _stream_completion(base, make_body(item[1], item[0]), timeout_s))


def each_by_clients(clients: int, items: Sequence, work: Callable[[Any], Any]) -> list:
    """``work(item)`` for every item, by exactly ``clients`` threads, each taking the next item
    as its last is done (the way a pool of users sends requests); the results in item order.
    The first error stops the rest and is raised here, in the caller's thread."""
    pending: queue.Queue = queue.Queue()
    for index in range(len(items)):
        pending.put(index)
    results: list = [None] * len(items)
    errors: list[BaseException] = []

    def client() -> None:
        while not errors:
            try:
                index = pending.get_nowait()
            except queue.Empty:
                return
            try:
                results[index] = work(items[index])
            except BaseException as exc:  # surfaced in the caller's thread
                errors.append(exc)
                return

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the server (SIGTERM, then SIGKILL after 10 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------
# 3. The raw ceiling: llama-batched-bench
# --------------------------------------------------------------------------


def batched_bench_command(tools: LlamaTools, model_path, batch_sizes: Sequence[int],
                          prompt_tokens: int, gen_tokens: int, threads: int,
                          flash_attn: str = "auto", swa_full: bool = True) -> list[str]:
    """The llama-batched-bench command line used by ``run_batched_bench``."""
    # KV mode: without -kvu, batched-bench runs with kv_unified=false (the
    # common_params default), i.e. one KV stream of n_ctx/max(B) cells per
    # sequence. It silently skips a B with B*(pp+tg) > n_ctx, so the context
    # must hold the largest batch; llama.cpp rounds it up to multiples of 256.
    ctx = max(batch_sizes) * (prompt_tokens + gen_tokens)
    return [
        str(tools.batched_bench), "-m", str(model_path),
        "-c", str(ctx), "-b", "2048", "-ub", "512",
        "-npp", str(prompt_tokens), "-ntg", str(gen_tokens),
        "-npl", ",".join(str(b) for b in batch_sizes),
        "-t", str(threads), "-tb", str(threads),
        "-fa", flash_attn,  # pinned like the server's, see server_command
        *_swa_args(swa_full),
        "--output-format", "jsonl",
    ]


def run_batched_bench(tools: LlamaTools, model_path, batch_sizes: list[int],
                      prompt_tokens: int, gen_tokens: int, threads: int,
                      log=print, *, flash_attn: str = "auto",
                      swa_full: bool = True) -> dict:
    """Run llama-batched-bench: B sequences prefilled then decoded in lock-step.

    Random prompt tokens, no sampling, no HTTP: the decode speed (S_TG) is the
    ceiling any batching runner on this llama.cpp build can reach.
    """
    if not batch_sizes:
        raise ValueError("no batch sizes")
    cmd = batched_bench_command(tools, model_path, batch_sizes, prompt_tokens,
                                gen_tokens, threads, flash_attn, swa_full)
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed (exit {proc.returncode}):\n"
                           + "\n".join(proc.stderr.splitlines()[-30:]))
    rows = []
    for line in proc.stdout.splitlines():  # jsonl rows go to stdout, logs to stderr
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        rows.append({
            "batch": r["pl"], "prompt_tokens": r["pp"], "gen_tokens": r["tg"],
            "tg_tokens_per_s": r["speed_tg"], "pp_tokens_per_s": r["speed_pp"],
            "total_tokens_per_s": r["speed"], "t_pp_s": r["t_pp"],
            "t_tg_s": r["t_tg"], "n_kv_max": r["n_kv_max"],
            "flash_attn": r["flash_attn"],
        })
    missing = sorted(set(batch_sizes) - {r["batch"] for r in rows})
    if missing:
        raise RuntimeError(f"llama-batched-bench produced no row for batch sizes "
                           f"{missing}:\n" + "\n".join(proc.stderr.splitlines()[-30:]))
    return {"system": "llama-batched-bench", "command": " ".join(cmd), "rows": rows}


# --------------------------------------------------------------------------
# 4. Sequential llama-cpp-python (what users do today)
# --------------------------------------------------------------------------


class _BanAndCount:
    """Logits processor: forbids the given tokens and counts sampled tokens.

    llama-cpp-python has no ignore_eos; its documented hooks are ``logit_bias``
    and ``logits_processor`` (logit_bias is itself implemented as a logits
    processor, but copies the whole vocab row per token). Setting the EOG
    logits to -inf in place is the cheapest way to make every request run to
    max_tokens. The processor runs once per sampled token, which also gives
    an exact token count: streamed chunks can merge several tokens (UTF-8
    fix-up) and the stream carries no usage.
    """

    def __init__(self, banned: Sequence[int]):
        self.banned = np.asarray(banned, dtype=np.intp)
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        scores[self.banned] = -np.inf
        return scores


def open_reference_llama(model_path: str, n_ctx: int, threads: int):
    """llama-cpp-python's own one-request-at-a-time ``Llama``, as its users
    create it (its defaults, so flash attention off), with the same threads."""
    from llama_cpp import Llama

    return Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)


def run_sequential_llama(llama, prompts: list[str], max_tokens: int, sampling: dict,
                         *, banned_tokens: Sequence[int], seeds: Sequence[int | None] | None = None,
                         reuse_prefix: bool = False) -> dict:
    """One ``create_completion(stream=True)`` after another on one Llama.

    One untimed warm-up request runs first. TTFT is measured at the first
    streamed chunk; generated tokens are counted exactly (see ``_BanAndCount``). By default the Llama's state is reset
    before each request so no prompt prefix is reused, matching the server
    peer's ``cache_prompt: false``; pass ``reuse_prefix=True`` for
    llama-cpp-python's out-of-the-box prefix matching. ``seeds`` optionally
    gives each request its own seed. ``banned_tokens`` are the model's
    end-of-generation tokens: create_completion stops on any of them (EOS, EOT,
    <|im_end|>, <end_of_turn>, ...), not just ``token_eos()``, so all are banned.
    """
    if not prompts:
        raise ValueError("no prompts")
    sampling = _check_sampling(sampling)
    # repeat_last_n is fixed at Llama construction (last_n_tokens_size).
    last_n = sampling.pop("repeat_last_n", None)
    if last_n is not None and last_n != llama.last_n_tokens_size:
        raise ValueError(f"repeat_last_n={last_n} but this Llama was built with "
                         f"last_n_tokens_size={llama.last_n_tokens_size}")
    samplings = _per_request(sampling, len(prompts), seeds)
    eog = list(banned_tokens)
    prompt_tokens = sum(len(llama.tokenize(p.encode("utf-8"), add_bos=True, special=True))
                        for p in prompts)
    # Untimed warm-up, like the server peer's: the first decodes of a fresh
    # Llama pay one-time costs (page-faulting the mmap'd weights, buffers).
    llama.reset()
    for _chunk in llama.create_completion(prompts[0], max_tokens=4, stream=True,
                                          logits_processor=[_BanAndCount(eog)],
                                          **samplings[0]):
        pass
    ttfts, counts = [], []
    t_start = time.perf_counter()
    for prompt, request_sampling in zip(prompts, samplings):
        if not reuse_prefix:
            llama.reset()
        proc = _BanAndCount(eog)
        t_sent = time.perf_counter()
        t_first = None
        for _chunk in llama.create_completion(prompt, max_tokens=max_tokens, stream=True,
                                              logits_processor=[proc],
                                              **request_sampling):
            if t_first is None:
                t_first = time.perf_counter()
        ttfts.append((t_first if t_first is not None else time.perf_counter()) - t_sent)
        counts.append(proc.calls)
    wall = time.perf_counter() - t_start
    bad = [(i, n) for i, n in enumerate(counts) if n != max_tokens]
    if bad:
        raise RuntimeError(f"llama-cpp-python: requests did not generate exactly "
                           f"{max_tokens} tokens (index, count): {bad[:10]}")
    return _summary("llama-cpp-python sequential", ttfts, sum(counts),
                    prompt_tokens, wall, parallel=1)
