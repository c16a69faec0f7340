"""Batch jobs on a Ray cluster: one multiseq Runner per Ray actor, Ray moves the rows.

    pip install 'multiseq[ray]'

Two ways in:

- `generate(dataset, workers=N, threads=T, model=..., ...)`, or `MultiseqPredictor` given to
  `ray.data.Dataset.map_batches` yourself: rows with the fields of a JSONL prompt line in, the
  records `multiseq batch-run` writes out (a row that cannot run is an error record, never an
  exception that fails its block).
- `RayRunnerPool`, what `multiseq batch-run --ray` runs on: requests spread over N actors, each
  owning a started Runner, behind the part of Runner's interface a batch run uses (submit,
  cancel_all, stats), so the command's reading, writing, resume and summary are the local ones.

Each actor asks Ray for as many CPUs as its llama.cpp threads: llama.cpp's threads spin, and two
runners on the same cores slow each other down tenfold. An actor that dies is restarted by Ray
and the requests it held are sent again (max_restarts, max_task_retries); a request that still
cannot finish comes back as a failed result that names the reason, so `--resume` reruns it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

try:
    import ray
except ImportError as error:  # the optional extra is missing
    raise ImportError("multiseq.ray needs Ray: pip install 'multiseq[ray]'") from error

from multiseq import models
from multiseq.formats.batchrun import default_window, with_free_id
from multiseq.formats.reader import PromptFormat, PromptItem, parse_jsonl_line
from multiseq.formats.records import record_for
from multiseq.config import RunnerConfig, SamplingParams, default_of
from multiseq.errors import BackendError, first_line
from multiseq.request import NO_TIMINGS, FinishReason, Request, Result
from multiseq.loop.runner import Runner
from multiseq.loop.stats import RunStats

# An actor that dies is started again and its requests are retried this many times.
MAX_RESTARTS = 3
_COLLECT_WAIT_S = 0.1
# The RunnerConfig fields MultiseqPredictor takes besides its named arguments: where the model runs.
_PLACEMENT_FIELDS = ("n_gpu_layers", "main_gpu", "split_mode", "tensor_split", "flash_attn")
_CONNECT_TIMEOUT_S = 5.0


class RayError(Exception):
    """Ray could not be started or reached, or a worker could not start: one line for the user."""


# --- one actor ---------------------------------------------------------------------------------

class _RunnerActor:
    """A started Runner inside a Ray actor. Its calls run on threads of their own
    (max_concurrency), so every request an actor holds is in its runner's queue at once."""

    def __init__(self, config: RunnerConfig) -> None:
        self._runner: Runner | None = None
        self._failure: str | None = None
        try:
            self._runner = Runner(config)
            self._model_name = models.resolve(config.model).name
        except (BackendError, models.ModelError, ValueError, OSError) as error:
            self._failure = str(error)  # reported by ready(), so the user sees one line, not a traceback

    def ready(self) -> dict[str, Any]:
        """Whether the runner started (else why not), and what the header of a run shows."""
        if self._runner is None:
            return {"error": self._failure}
        return {"error": None, "model_name": self._model_name, "window": self._runner.window,
                "allocated_window": self._runner.allocated_window, "device": self._runner.device,
                "node": os.uname().nodename}

    def run(self, request: Request) -> Result:
        return self._runner.submit(request).result()

    def run_items(self, items: list[PromptItem]) -> list[list[Result]]:
        """Every choice of every item at once (they share the slots), results per item."""
        taken: set[str] = set()
        handles = []
        for item in items:
            requests = []
            for request in item.requests:
                requests.append(with_free_id(request, taken))
                taken.add(requests[-1].id)
            handles.append([self._runner.submit(request) for request in requests])
        return [[handle.result() for handle in item_handles] for item_handles in handles]

    def cancel_all(self) -> int:
        return self._runner.cancel_all()

    def stats(self) -> RunStats:
        return self._runner.stats()

    def close(self) -> None:
        self._runner.close()


def _actor_class(threads: int, max_concurrency: int, gpus: float = 0):
    # Ray hides every GPU from an actor that asks for none (CUDA_VISIBLE_DEVICES is emptied).
    return ray.remote(_RunnerActor).options(num_cpus=threads, num_gpus=gpus, max_concurrency=max_concurrency,
                                            max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS)


# --- connecting ----------------------------------------------------------------------------

def connect(address: str | None) -> None:
    """Join the Ray cluster at `address`, or start a local one on this machine (None). Ray's own
    log lines stay out of the caller's output."""
    if address is not None:
        _check_reachable(address)
    if ray.is_initialized():
        return
    try:
        if address is None:
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, logging_level=logging.ERROR,
                     log_to_driver=False, configure_logging=True)
        else:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=True)
    except Exception as error:  # Ray raises ConnectionError, RuntimeError or ValueError here
        where = "start a local Ray cluster" if address is None else f"connect to the Ray cluster at {address}"
        raise RayError(f"could not {where}: {first_line(error)}") from None


def _check_reachable(address: str) -> None:
    """Ray waits minutes for a cluster that is not there; a plain TCP connect says so at once."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and the like: Ray finds the cluster itself
    try:
        socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise RayError(f"could not connect to the Ray cluster at {address}: {error.strerror or error}") from None


def check_cpus(workers: int, threads: int, gpus: float = 0, option: str = "--workers") -> None:
    """Every worker must get its own cores (and the GPUs it asks for): refuse a run the cluster
    cannot place at once. `option` is the one that sets the number of workers (serve's
    --replicas)."""
    noun = option.removeprefix("--")
    resources = ray.cluster_resources()
    available = int(resources.get("CPU", 0))
    if workers * threads > available:
        raise RayError(f"{workers} {noun} x {threads} threads need {workers * threads} CPUs, and the Ray cluster "
                       f"has {available}: use fewer {option} or --threads")
    available_gpus = resources.get("GPU", 0)
    if workers * gpus > available_gpus:
        raise RayError(f"{workers} {noun} x {gpus:g} GPUs need {workers * gpus:g} GPUs, and the Ray cluster has "
                       f"{available_gpus:g}: use fewer {option} or --worker-gpus")


# --- batch-run --ray -----------------------------------------------------------------------------

class RayRunnerPool:
    """N actors, each a started Runner with `config`, behind submit/cancel_all/stats. A request
    goes to the actor holding the fewest; its result is passed to on_finish from a collecting
    thread, as Runner does from its worker thread."""

    def __init__(self, config: RunnerConfig, workers: int, window: int | None = None, gpus: float = 0) -> None:
        self.config = config
        self.workers = workers
        per_actor = window or default_window(config.parallel)
        actor_class = _actor_class(config.threads, per_actor + 2, gpus)  # +2: cancel_all and stats get through
        self._actors = [actor_class.remote(config) for _ in range(workers)]
        self._load = [0] * workers
        self._pending: dict[Any, tuple[Request, int, Callable[[Result], None] | None]] = {}
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.info = self._wait_ready()
        except BaseException:
            self._kill_actors()
            raise
        self._collector = threading.Thread(target=self._collect, name="multiseq-ray-collector", daemon=True)
        self._collector.start()

    @property
    def failure(self) -> str | None:
        """Why the pool stopped (as Runner.failure); a worker's failure reaches its requests as
        their errors, and the pool goes on with the other workers."""
        return None

    @property
    def model_name(self) -> str:
        return self.info["model_name"]

    @property
    def window(self) -> int:
        return self.info["window"]

    @property
    def allocated_window(self) -> int:
        return self.info["allocated_window"]

    @property
    def device(self) -> str:
        """Where the first worker's model runs (the others are alike, on alike nodes)."""
        return self.info["device"]

    def _wait_ready(self) -> dict[str, Any]:
        answers = ray.get([actor.ready.remote() for actor in self._actors])
        for index, answer in enumerate(answers):
            if answer["error"]:
                raise RayError(f"worker {index} could not start: {answer['error']}")
        return answers[0]

    def submit(self, request: Request, on_finish: Callable[[Result], None] | None = None) -> None:
        with self._lock:
            index = min(range(self.workers), key=self._load.__getitem__)
            self._load[index] += 1
            self._pending[self._actors[index].run.remote(request)] = (request, index, on_finish)

    def _collect(self) -> None:
        while not self._closed:
            with self._lock:
                refs = list(self._pending)
            if not refs:
                time.sleep(_COLLECT_WAIT_S)
                continue
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_COLLECT_WAIT_S, fetch_local=True)
            for ref in ready:
                self._deliver(ref)

    def _deliver(self, ref) -> None:
        with self._lock:
            request, index, on_finish = self._pending.pop(ref)
            self._load[index] -= 1
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as error:  # the actor died more often than Ray restarts it
            result = lost_result(request.id, f"its Ray worker was lost ({first_line(error)}); --resume runs it again")
        if on_finish is not None:
            on_finish(result)

    @property
    def num_pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def cancel_all(self) -> int:
        return sum(ray.get([actor.cancel_all.remote() for actor in self._actors]))

    def stats(self) -> RunStats:
        return merge_stats(ray.get([actor.stats.remote() for actor in self._actors]))

    def close(self) -> None:
        if self._closed:
            return
        try:
            ray.get([actor.cancel_all.remote() for actor in self._actors])
        except ray.exceptions.RayError:
            pass  # a dead actor has nothing left to cancel
        self._closed = True
        self._collector.join(timeout=5)
        self._kill_actors()

    def _kill_actors(self) -> None:
        for actor in self._actors:
            ray.kill(actor, no_restart=True)

    def __enter__(self) -> RayRunnerPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def lost_result(request_id: str, error: str) -> Result:
    """A request whose worker could not give it back: failed, with the reason (a server error)."""
    return Result(id=request_id, text="", finish_reason=FinishReason.ERROR, prompt_tokens=0, completion_tokens=0,
                  timings=NO_TIMINGS, error=error)


def merge_stats(parts: list[RunStats]) -> RunStats:
    """The totals of runners that ran side by side: counts add up, and so do rates (each
    runner's rate is over its own time, and the times overlap)."""
    def total_rate(name: str) -> float | None:
        rates = [getattr(part, name) for part in parts if getattr(part, name) is not None]
        return sum(rates) if rates else None

    decode_steps = sum(part.num_decode_steps for part in parts)
    seqs = sum(part.avg_seqs_per_decode_step * part.num_decode_steps for part in parts
               if part.avg_seqs_per_decode_step is not None)
    phases: dict[str, float] = {}
    for part in parts:
        for phase, seconds in part.phase_seconds.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    return RunStats(num_steps=sum(part.num_steps for part in parts), num_decode_steps=decode_steps,
                    generated_tokens=sum(part.generated_tokens for part in parts),
                    prompt_tokens=sum(part.prompt_tokens for part in parts),
                    wall_s=max((part.wall_s for part in parts), default=0.0),
                    decode_tokens_per_s=total_rate("decode_tokens_per_s"),
                    prefill_tokens_per_s=total_rate("prefill_tokens_per_s"),
                    aggregate_tokens_per_s=total_rate("aggregate_tokens_per_s"),
                    avg_seqs_per_decode_step=seqs / decode_steps if decode_steps else None,
                    phase_seconds=phases, num_admitted=sum(part.num_admitted for part in parts),
                    num_prefix_hits=sum(part.num_prefix_hits for part in parts),
                    prompt_tokens_reused=sum(part.prompt_tokens_reused for part in parts))


# --- Ray Data ----------------------------------------------------------------------------------

class MultiseqPredictor:
    """For `ray.data.Dataset.map_batches` (with concurrency=N: N actors, each loads the model
    once and keeps its Runner). Each row has the fields of a JSONL prompt line (`id`, `prompt`
    or `messages`, per-row sampling fields; an image_url part's url may be the image's bytes);
    each output row is the record batch-run writes for it, with an error record for a row that
    cannot run. Where the model runs (n_gpu_layers, main_gpu, split_mode, tensor_split,
    flash_attn) and its projector (mmproj) are RunnerConfig's; sampling defaults (max_tokens,
    temperature, ...) are keyword arguments, like batch-run's options."""

    def __init__(self, model: str = models.DEFAULT_MODEL, parallel: int = default_of(RunnerConfig, "parallel"),
                 threads: int = 1,
                 slot_ctx: int | None = None, batch_invariant: bool = False, seed: int | None = None,
                 **options: Any) -> None:
        config = {"slot_ctx": slot_ctx} if slot_ctx is not None else {}
        placement = {name: options.pop(name) for name in (*_PLACEMENT_FIELDS, "mmproj") if name in options}
        self._config = RunnerConfig(model=model, parallel=parallel, threads=threads, batch_invariant=batch_invariant,
                                    seed=seed, **config, **placement)
        self._defaults = SamplingParams(**options)
        self._actor = _RunnerActor(self._config)
        answer = self._actor.ready()
        if answer["error"]:
            raise RayError(f"multiseq could not start: {answer['error']}")
        self._model_name = answer["model_name"]

    def __call__(self, batch) -> "pyarrow.Table":  # noqa: F821 (pyarrow comes with ray[data])
        import pyarrow

        items = [self._item(row, position) for position, row in enumerate(_rows_of(batch), start=1)]
        valid = [item for item in items if item.is_valid]
        results = dict(zip((id(item) for item in valid), self._actor.run_items(valid)))
        records = [record_for(PromptFormat.JSONL, item, results.get(id(item)), self._model_name) for item in items]
        return pyarrow.Table.from_pylist(_same_keys(records))

    def _item(self, row: dict[str, Any], position: int) -> PromptItem:
        fields = {name: value for name, value in row.items() if value is not None}  # a column this row lacks
        if "id" not in fields:
            return PromptItem(position, f"row {position}", None,
                              f"row {position} of its batch: needs an 'id' (rows of a dataset have no line numbers "
                              f"to name them by)", error_param="id")
        item = parse_jsonl_line(json.dumps(fields, default=_plain), position, self._defaults)
        if item.is_valid:
            return item
        return dataclasses.replace(item, error=item.error.replace(f"line {position}:", f"row {item.id}:", 1))

    def __del__(self) -> None:
        runner = getattr(getattr(self, "_actor", None), "_runner", None)
        if runner is not None:
            runner.close()


def generate(dataset, workers: int = 1, threads: int = 1, batch_size: int | None = None, gpus: float = 0,
             **predictor_args: Any):
    """`dataset` (rows of JSONL prompt fields) mapped to result records by `workers` actors of
    `threads` llama.cpp threads each, every actor asking Ray for `threads` CPUs and `gpus` GPUs
    (Ray hides the GPUs from an actor that asks for none: give gpus=1 with n_gpu_layers). When
    the actors take every CPU, read the dataset with num_cpus=0: its read tasks need a CPU too,
    and would otherwise wait for ever."""
    parallel = predictor_args.get("parallel", default_of(RunnerConfig, "parallel"))
    return dataset.map_batches(MultiseqPredictor, fn_constructor_kwargs={"threads": threads, **predictor_args},
                               compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=threads, num_gpus=gpus,
                               batch_format="pyarrow",
                               batch_size=batch_size or default_window(parallel))


def _rows_of(batch) -> list[dict[str, Any]]:
    """A batch in any of Ray Data's formats as plain rows."""
    if hasattr(batch, "to_pylist"):  # pyarrow.Table
        return batch.to_pylist()
    if hasattr(batch, "to_dict"):  # pandas.DataFrame
        return batch.to_dict("records")
    columns = {name: list(values) for name, values in batch.items()}  # dict of numpy arrays
    count = len(next(iter(columns.values()), []))
    return [{name: values[index] for name, values in columns.items()} for index in range(count)]


def _plain(value: Any) -> Any:
    """numpy values (from a numpy or pandas batch) as the JSON values they hold; bytes (an
    image's or a clip's, where a row gives a part's url or data as bytes) as a data URL."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return "data:application/octet-stream;base64," + base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _same_keys(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with every key any of them has (Arrow takes a table's columns from its first row)."""
    keys: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record))
    return [{key: record.get(key) for key in keys} for record in records]
