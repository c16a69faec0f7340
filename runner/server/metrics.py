"""/metrics in Prometheus' text format (prometheus_client), a registry of each app's own.

What the engine counts (requests running and waiting, slots in use, prompt tokens computed and
reused, tokens generated) is read from the snapshot the runner's worker published last
(Runner.latest_snapshot, at most 0.1 s old while requests run), so a scrape never waits for
the engine. Latencies are what clients see: time to the first token and the gaps between
tokens, observed as the server hands pieces out.

The event loop's lag is measured by a task on the loop that sleeps LOOP_LAG_INTERVAL_S again
and again and notes how late it wakes: anything that blocks the loop (a lock, a slow callback)
shows there. multiseq_event_loop_lag_seconds is its histogram, and
multiseq_event_loop_lag_max_seconds the largest lag since the previous scrape."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..loop.runner import Runner
from ..loop.stats import DiskSnapshot, HostCacheSnapshot, PoolSnapshot

# Seconds; TTFT spans queueing and prefill, gaps are one decode step or a stall.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
GAP_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# How often the loop-lag task wakes, and the buckets of how late it does.
LOOP_LAG_INTERVAL_S = 0.05
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    def __init__(self, runner_of: Callable[[], Runner | None], models_of: Callable[[], Iterable] = tuple) -> None:
        self.registry = CollectorRegistry()
        self.ttft = Histogram("multiseq_time_to_first_token_seconds", "Request arrival to its first token",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.inter_token = Histogram("multiseq_inter_token_latency_seconds",
                                     "Gap between two consecutive pieces of one response", buckets=GAP_BUCKETS,
                                     registry=self.registry)
        self.requests = Counter("multiseq_api_requests", "Requests accepted, by the API they came through "
                                "(chat, completions, responses, messages, embeddings, rerank)", ["api"],
                                registry=self.registry)
        # Embedding requests, counted apart from generation: inputs embedded (a reranker's
        # documents among them) and their tokens.
        self.embedding_inputs = Counter("multiseq_embedding_inputs", "Inputs embedded or ranked (each one request "
                                        "in the batch)", registry=self.registry)
        self.embedding_tokens = Counter("multiseq_embedding_prompt_tokens", "Tokens of the inputs embedded",
                                        registry=self.registry)
        self.registry.register(_EngineCollector(runner_of))
        self.registry.register(_ModelsCollector(models_of))
        self.loop_lag = LoopLagMonitor(self.registry)

    def requests_by_api(self) -> dict[str, int]:
        """Requests accepted so far, by the API they came through (only those that had one)."""
        return {sample.labels["api"]: int(sample.value) for family in self.requests.collect()
                for sample in family.samples if sample.name.endswith("_total")}


class LoopLagMonitor:
    """How late the event loop wakes from a short sleep: a histogram, and the largest lag since
    the last scrape (a gauge read, and reset, by each scrape)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram("multiseq_event_loop_lag_seconds",
                                   f"How late the server's event loop woke from a {LOOP_LAG_INTERVAL_S * 1000:g} ms "
                                   "sleep", buckets=LOOP_LAG_BUCKETS, registry=registry)
        self._max_s = 0.0
        self._lock = threading.Lock()  # the loop observes, a scrape (maybe in another thread) reads
        self._task: asyncio.Task | None = None
        registry.register(self)

    def start(self) -> None:
        """Watch the running loop (idempotent; call on the loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="multiseq-loop-lag")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asleep_at = loop.time()
            await asyncio.sleep(LOOP_LAG_INTERVAL_S)
            self.observe(max(0.0, loop.time() - asleep_at - LOOP_LAG_INTERVAL_S))

    def observe(self, lag_s: float) -> None:
        self.histogram.observe(lag_s)
        with self._lock:
            self._max_s = max(self._max_s, lag_s)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            largest, self._max_s = self._max_s, 0.0
        yield _gauge("multiseq_event_loop_lag_max_seconds", "The largest event-loop lag since the previous scrape",
                     largest)


class _EngineCollector:
    """The engine's state and totals, read when /metrics is scraped."""

    def __init__(self, runner_of: Callable[[], Runner | None]) -> None:
        self._runner_of = runner_of

    def collect(self) -> Iterator[Metric]:
        runner = self._runner_of()
        if runner is None:  # still loading
            return
        yield _gauge("multiseq_engine_failed", "1 once the engine stopped after a failure that was no one "
                     "request's (/health says why), else 0", runner.failure is not None)
        snapshot = runner.latest_snapshot
        stats = snapshot.stats
        num_slots = len(snapshot.slots)
        yield _gauge("multiseq_requests_running", "Requests holding a slot (prefilling or decoding)",
                     snapshot.num_running)
        yield _gauge("multiseq_requests_waiting", "Requests queued for a slot", runner.num_waiting)
        yield _gauge("multiseq_slots", "Slots of the context", num_slots)
        yield _gauge("multiseq_slot_occupancy", "Share of slots holding a request", snapshot.num_running / num_slots)
        yield _gauge("multiseq_kv_tokens", "Tokens held in the slots' KV cache (running requests, and prefixes kept "
                     "for reuse)", sum(slot.context_used for slot in snapshot.slots))
        pool = snapshot.pool
        yield _gauge("multiseq_kv_capacity_tokens", "Tokens the KV cache holds at most (the shared pool, or slots x "
                     "window)", pool.size if pool else sum(slot.window for slot in snapshot.slots))
        if pool is not None:
            yield from _pool_metrics(pool, runner)
        kv_type = GaugeMetricFamily("multiseq_kv_cache_type", "The KV cache's element types (-ctk, -ctv): always 1",
                                    labels=["type_k", "type_v"])
        kv_type.add_metric([runner.config.cache_type_k, runner.config.cache_type_v], 1)
        yield kv_type
        yield _counter("multiseq_prompt_tokens_computed", "Prompt tokens prefilled", stats.prompt_tokens)
        yield _counter("multiseq_prompt_tokens_cached", "Prompt tokens reused from a prefix already computed",
                       stats.prompt_tokens_reused)
        yield _counter("multiseq_generation_tokens", "Tokens generated", stats.generated_tokens)
        yield _counter("multiseq_decode_steps", "Batches decoded", stats.num_steps)
        yield _counter("multiseq_preemptions", "Times a running request was parked in host memory, for an "
                       "interactive one or for room in the KV pool",
                       stats.num_preempted)
        yield _counter("multiseq_prompt_tokens_from_ram", "Prompt tokens restored from the RAM cache",
                       stats.prompt_tokens_restored)
        yield _counter("multiseq_draft_tokens", "Speculative decoding: draft tokens verified", stats.draft_tokens)
        yield _counter("multiseq_draft_tokens_accepted", "Speculative decoding: draft tokens that came true and "
                       "were output", stats.draft_tokens_accepted)
        if snapshot.host_cache is not None:
            yield from _ram_cache_metrics(snapshot.host_cache)
        media = runner.backend.media
        if media is not None:
            yield _counter("multiseq_media_encoded", "Images or audio encoded by the projector (one found in its "
                           "cache, or reused as a prefix, is not)", media.projector.encoded)
            yield _counter("multiseq_media_encode_seconds", "Time the projector spent encoding", media.projector.encode_seconds)
            yield _counter("multiseq_media_prefilled", "Images or audio decoded into a slot's KV (a reused one is not)",
                           media.decoded)


class _ModelsCollector:
    """Each served model, by name (the engine's metrics above are the first model's): loaded or
    not, its requests running and waiting, and the tokens it generated while loaded."""

    def __init__(self, models_of: Callable[[], Iterable]) -> None:
        self._models_of = models_of

    def collect(self) -> Iterator[Metric]:
        families = {
            "loaded": GaugeMetricFamily("multiseq_model_loaded", "1 while the model is loaded, else 0",
                                        labels=["model"]),
            "running": GaugeMetricFamily("multiseq_model_requests_running", "The model's requests holding a slot",
                                         labels=["model"]),
            "waiting": GaugeMetricFamily("multiseq_model_requests_waiting", "The model's requests queued for a slot",
                                         labels=["model"]),
            "generated": CounterMetricFamily("multiseq_model_generation_tokens", "Tokens the model generated since "
                                             "it last loaded", labels=["model"]),
        }
        for model in self._models_of():
            runner = model.runner
            families["loaded"].add_metric([model.name], int(runner is not None))
            if runner is not None:
                snapshot = runner.latest_snapshot
                families["running"].add_metric([model.name], snapshot.num_running)
                families["waiting"].add_metric([model.name], runner.num_waiting)
                families["generated"].add_metric([model.name], snapshot.stats.generated_tokens)
        yield from families.values()


def _pool_metrics(pool: PoolSnapshot, runner: Runner) -> Iterator[Metric]:
    yield _gauge("multiseq_kv_pool_cells_used", "Cells of the shared KV pool in use (a shared cell once)",
                 pool.cells_used)
    yield _gauge("multiseq_kv_shared_tokens", "Tokens the slots hold on cells another slot holds too (what "
                 "sharing a prefix saves)", pool.tokens_shared)
    per_token = runner.backend.kv_bytes_per_token
    if per_token:
        yield _gauge("multiseq_kv_bytes_used", "Bytes of KV in use in the shared pool", pool.cells_used * per_token)
    yield _counter("multiseq_kv_pool_evictions", "Kept conversations moved out of a full KV pool (to the RAM "
                   "cache, where it has room)", pool.num_evicted)
    if pool.in_windows is not None:
        yield _gauge("multiseq_kv_pool_in_windows", "1 while the pool's cells are held in a window per slot (every "
                     "session fits one), 0 while they are one pool", int(pool.in_windows))
        yield _counter("multiseq_kv_layout_moves", "Moves of the KV between a window per slot and one pool",
                       pool.layout_moves)
        yield _counter("multiseq_kv_layout_move_seconds", "Time spent moving the KV between layouts",
                       pool.layout_move_seconds)


def _ram_cache_metrics(cache: HostCacheSnapshot) -> Iterator[Metric]:
    yield _gauge("multiseq_ram_cache_bytes", "Bytes of slot state held in the RAM cache", cache.num_bytes)
    yield _gauge("multiseq_ram_cache_limit_bytes", "The RAM cache's bound (--cache-ram)", cache.limit_bytes)
    yield _gauge("multiseq_ram_cache_entries", "Slot states held in the RAM cache", cache.num_entries)
    yield _counter("multiseq_ram_cache_saves", "Slot states saved before their slot was reused", cache.num_saved)
    yield _counter("multiseq_ram_cache_restores", "Slot states restored instead of a prefill", cache.num_restored)
    yield _counter("multiseq_ram_cache_evictions", "Slot states dropped to stay within the bound", cache.num_evicted)
    yield _counter("multiseq_ram_cache_imports", "Prefix states brought from another replica instead of a prefill",
                   cache.num_imported)
    if cache.disk is not None:
        yield from _disk_cache_metrics(cache.disk)


def _disk_cache_metrics(disk: DiskSnapshot) -> Iterator[Metric]:
    yield _gauge("multiseq_disk_cache_bytes", "Bytes of slot state files in the disk cache", disk.num_bytes)
    yield _gauge("multiseq_disk_cache_limit_bytes", "The disk cache's bound (--cache-disk-size)", disk.limit_bytes)
    yield _gauge("multiseq_disk_cache_files", "Slot state files in the disk cache", disk.num_files)
    yield _counter("multiseq_disk_cache_writes", "Slot states written to the disk cache", disk.num_written)
    yield _counter("multiseq_disk_cache_reads", "Slot states read back from the disk cache", disk.num_read)
    yield _counter("multiseq_disk_cache_evictions", "State files removed to stay within the bound", disk.num_evicted)
    yield _counter("multiseq_disk_cache_damaged", "State files that failed their check, removed unread",
                   disk.num_damaged)
    yield _counter("multiseq_disk_cache_failed_writes", "States not written (a full disk, say)",
                   disk.num_failed_writes)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)
