"""Host-path benchmark: what multiseq does on the host between two llama_decode calls.

Usage (from the repository root, in the project's virtual environment; nothing else running):

    python bench/hostpath.py
    python bench/hostpath.py --slots 16,64,256 --vocab 49152,151936,262144 --sampling greedy,sampled --steps 64
    python bench/hostpath.py --slots 64 --vocab 49152 --server
    python bench/hostpath.py --quick

On a GPU a decode step takes a few milliseconds, so everything done on the host around it
(sampling every row in numpy, building the next batch, detokenizing, matching stop strings,
handing pieces to clients) adds to every step. Here the model costs nothing: a zero-cost
backend (ZeroCostBackend) answers each decode at once with logits rows of the real vocabulary
size (49,152 SmolLM2, 151,936 Qwen, 262,144 Gemma 3), views into a prepared float32 matrix
whose rows cycle through a few pre-generated distributions (a normal body and a few strong
candidates, as a model's rows have), and its vocabulary is a table of token pieces (byte
tokens, then words, some of them not ASCII), so detokenizing does real work. Its EOS is the
least likely token of every row, so no request ends before max_tokens.

Each (slots, vocabulary, sampling) case runs `slots` requests of `--steps` generated tokens
each through a Runner whose worker's turns are timed (its inbox and the delivery to the
request handles included), and reports host milliseconds per decode step (the first step,
which prefills the prompts, is left out), split into phases:

- schedule: Engine.schedule() without Scheduler.plan() (retiring, shifting, admitting)
- batch: Scheduler.plan() and Engine.execute() without its sampling (the batch entries, and
  the backend call: filling a real llama_batch with the llama.cpp backend's own code, then
  no decode at all)
- sample: sampling every output row (Executed.sample_seconds, as the engine measures it)
- detok+stops: Sequence.append_token() (detokenizing, stop strings, max_tokens, the sampler's
  accept)
- update other: the rest of Engine.update() (KV accounting, text pieces, retiring, stats)
- read: reading the output into content, reasoning and calls on the step's thread (the family's
  reader, in OutputPieces.deltas_until and parsed; part of update, not counted in update
  other). A streaming server's pieces are read on its event loop's thread as it writes them
  (see --server); here, as there, the step's thread reads an output once, when it ends
- delivery: Engine.take_output() and Deliveries.deliver() (pieces and results to the handles)
- other: what is left of the worker's turn (its inbox, its hand-over, its snapshot)

With --readers (say `qwen3-xml:off,qwen3-xml`), every case runs once per reader: a family's
name submits chats to an engine whose tool format is that family, whose prompt ends inside the
family's reasoning block (the zero-cost chat format writes the family's opener at the end of
the prompt), so every piece goes through the family's reader, as a reasoning model's chat
does; `FAMILY:off` submits the same chats with reading off (--reasoning-format none), the
baseline to compare with; `none` submits plain prompts. Every piece is handed to a consumer
(on_piece), as a streaming server's are.

The phases are measured by wrapping those methods on the runner's instances (and
Sequence.append_token on its class, for the run only); no engine code is changed. Each
wrapped call costs a few tenths of a microsecond more than it would, so detok+stops, the one
wrapped per sequence, is overstated by about that much per token.

Sampling is compared with two references on the same rows:
- read floor: the time to read the step's [rows, vocab] logits once (a numpy sum), what any
  host sampler must at least spend;
- llama.cpp chain: llama.cpp's sampler chain (top-k 40, top-p, min-p 0.05, temperature and
  dist, or greedy), as llama-server samples, one row after another, with one chain per slot,
  through llama-cpp-python's low-level API. `chain fill` is writing a row into the
  llama_token_data array (ids, logits, p; llama-server's set_logits does the same in C++),
  `chain apply` is llama_sampler_apply and llama_sampler_accept alone.

With --server, each case is also served: the same backend behind multiseq.server.create_app on
uvicorn, `slots` concurrent streaming chat clients (bench/load.py's asyncio client, in a
separate process so that they do not share the server's GIL), each asking for --steps tokens.
Reported: streamed completion tokens/s against the same requests submitted to a Runner with
its own worker thread (engine alone), and their ratio (the target is >= 0.8 at 64 slots).
--stream-interval gives serve's --stream-interval (auto, the default, or seconds; several,
comma-separated, are each served): a stream's chunks then come at most that often, each with
the steps since the last.

Everything runs on the CPU and uses no model, so it runs unchanged on a CUDA build. The
output is markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context

import numpy as np

import load  # bench/ is the script's own folder, first on sys.path
from multiseq import Request, Runner, RunnerConfig, SamplingParams
from multiseq.llama.backend import _BatchBuffers as LlamaBatch  # the real backend's llama_batch filler
from multiseq.llama.batch import BatchEntry, ChunkRules
from multiseq.sampling.grammar import tokenizer_from_pieces
from multiseq.loop.pieces import OutputPieces
from multiseq.loop.sequence import Sequence

VOCABS = {49152: "SmolLM2", 151936: "Qwen", 262144: "Gemma 3"}
SAMPLINGS = ("greedy", "sampled")
SAMPLED_TEMPERATURE = 0.8
SAMPLED_TOP_P = 0.95
TOP_K = 40  # multiseq's and llama-server's default
MIN_P = 0.05  # likewise
BASE_SEED = 1234

NUM_BYTE_TOKENS = 256  # byte fallback tokens, as real vocabularies have
NUM_DISTINCT_ROWS = 16  # pre-generated logits distributions the rows cycle through
NUM_STRONG_CANDIDATES = 8  # tokens of a row well above the rest, as a model's rows have
BODY_SCALE = 2.0  # standard deviation of a row's logits around 0
STRONG_BOOST = (6.0, 12.0)  # how far above the body the strong candidates stand
EOS_MARGIN = 20.0  # the EOS logit stands this far below a row's least likely other token
PROMPT_BUDGET = 64  # tokens of a request's prompt, chat-rendered or not, at most
MODEL_NAME = "zero-cost"

PHASES = ("schedule", "batch", "sample", "detok+stops", "read", "update other", "delivery", "other")


# --- the zero-cost backend -----------------------------------------------------------------------

def token_pieces(vocab: int, seed: int = 0) -> list[bytes]:
    """A vocabulary's token pieces: the 256 bytes, then words of 1 to 9 letters, about half with
    a leading space, about one in eight with a letter outside ASCII (two or three UTF-8 bytes)."""
    if vocab <= NUM_BYTE_TOKENS:
        raise ValueError(f"vocab must be above {NUM_BYTE_TOKENS} (the byte tokens), got {vocab}")
    rng = np.random.default_rng(seed)
    letters = [chr(code) for code in range(ord("a"), ord("z") + 1)]
    wide = ["é", "ü", "ß", "ж", "λ", "中", "語", "ñ"]
    num_words = vocab - NUM_BYTE_TOKENS
    lengths = rng.integers(1, 10, num_words)
    spaced = rng.random(num_words) < 0.5
    widened = rng.random(num_words) < 0.125
    picks = rng.integers(0, len(letters), int(lengths.sum()))
    pieces = [bytes([byte]) for byte in range(NUM_BYTE_TOKENS)]
    offset = 0
    for index in range(num_words):
        word = "".join(letters[pick] for pick in picks[offset:offset + lengths[index]])
        offset += lengths[index]
        if widened[index]:
            word = wide[index % len(wide)] + word[1:]
        pieces.append(((" " if spaced[index] else "") + word).encode("utf-8"))
    return pieces


def logits_rows(vocab: int, eos: int, num_distinct: int = NUM_DISTINCT_ROWS, seed: int = 0) -> np.ndarray:
    """`num_distinct` float32 rows shaped like a model's: a normal body, a few strong
    candidates among the word tokens, and the EOS token least likely of all."""
    rng = np.random.default_rng(seed)
    rows = (rng.standard_normal((num_distinct, vocab), dtype=np.float32) * BODY_SCALE)
    for row in rows:
        strong = rng.choice(np.arange(NUM_BYTE_TOKENS, vocab), NUM_STRONG_CANDIDATES, replace=False)
        row[strong] += rng.uniform(*STRONG_BOOST, NUM_STRONG_CANDIDATES).astype(np.float32)
        row[eos] = row.min() - EOS_MARGIN
    return rows


@dataclass(frozen=True)
class Vocabulary:
    """A zero-cost model's tables: token pieces (EOS's empty) and its distinct logits rows."""

    pieces: tuple[bytes, ...]
    eos: int
    rows: np.ndarray  # read-only, [distinct rows, vocab] float32


@functools.lru_cache(maxsize=len(VOCABS))  # every default size, each built once per run
def vocabulary(vocab: int, seed: int = 0) -> Vocabulary:
    """The tables of a vocabulary size, built once (a 262k vocabulary takes a while) and shared
    by every backend of that size."""
    eos = vocab - 1
    pieces = token_pieces(vocab, seed)
    pieces[eos] = b""
    rows = logits_rows(vocab, eos, seed=seed)
    rows.flags.writeable = False
    return Vocabulary(tuple(pieces), eos, rows)


class ZeroCostBackend:
    """The engine's Backend (multiseq.llama.batch.Backend) with a model that costs nothing: decode()
    returns at once a [rows, vocab] view of a prepared logits matrix (as the real backend
    returns a view of llama.cpp's output buffer, nothing is copied), whose rows cycle through
    a few distributions by step and row. Tokens are byte tokens and words (token_pieces); a
    prompt tokenizes to its bytes. Each decode fills a real llama_batch as the llama.cpp backend
    does (its own filler), the one host cost of a decode outside llama_decode. KV is only
    counted (each slot's length), so prefix reuse and shifting behave as on a real context; a
    slot's state cannot be saved."""

    def __init__(self, num_slots: int, vocab: int, window: int, n_batch: int, seed: int = 0,
                 reasoning_opener: str = "") -> None:
        self.num_slots = num_slots
        self.reasoning_opener = reasoning_opener  # what the chat format writes at the end of a prompt
        self._batch = LlamaBatch(n_batch)
        self.n_vocab = vocab
        self.window = self.allocated_window = window
        self.pool_size = self.layout_window = None  # a window per slot
        self.device, self.model_pooling = None, None  # (a generating model, on no device in particular)
        self.kv_bytes_per_token, self.modalities, self.media = None, {"vision": False, "audio": False}, None
        self.ranks = self.embeds_whole = False
        self.can_shift = True
        self.add_bos = False
        self.last_decode_seconds = 0.0
        self.chunk_rules = ChunkRules(exact_reuse=False)
        self.chat_template_source = None  # no Jinja template: a chat renders as render_chat() says
        self.graph_sampling = None  # every row is sampled on the host
        tables = vocabulary(vocab, seed)
        self.eos = tables.eos
        self.pieces = tables.pieces
        distinct = tables.rows
        # Rows [k, k + n) of this matrix are step k's n rows: a contiguous view for any step.
        # Sampling may write into the rows it is given (bias, penalties: the engine owns them
        # until the next decode), which the benchmark's requests never ask for.
        self._matrix = distinct[np.arange(num_slots + len(distinct)) % len(distinct)]
        self._num_distinct = len(distinct)
        self.num_decodes = 0
        self.kv_lengths = [0] * num_slots
        self._grammar_tokenizer = None

    # --- text --------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def render_chat(self, messages: tuple[dict, ...], tools: list[dict] | None = None,
                    options: dict | None = None, **shaping) -> str:
        if tools:
            raise ValueError("the zero-cost backend's chat format has no tools")
        return ("".join(f"<{message['role']}>{message['content']}" for message in messages) + "<assistant>"
                + self.reasoning_opener)

    def token_bytes(self, token: int) -> bytes:
        return self.pieces[token]

    def is_end_of_generation(self, token: int) -> bool:
        return token == self.eos

    def end_of_generation_tokens(self) -> list[int]:
        return [self.eos]

    def grammar_tokenizer(self):
        """llguidance's view of the vocabulary (built on first use; the benchmark's requests
        are not constrained, but a client of the served backend may ask for a schema)."""
        if self._grammar_tokenizer is None:
            pieces = list(self.pieces)
            pieces[self.eos] = b"\xff</s>"
            self._grammar_tokenizer = tokenizer_from_pieces(pieces, [self.eos], [self.eos], list)
        return self._grammar_tokenizer

    # --- the model ---------------------------------------------------------------------------

    def step_logits(self, step: int, num_rows: int) -> np.ndarray:
        """The [num_rows, vocab] logits decode number `step` returns (a view, never a copy)."""
        if num_rows > self.num_slots:
            raise ValueError(f"num_rows must be at most the {self.num_slots} slots, got {num_rows}")
        start = step % self._num_distinct
        return self._matrix[start:start + num_rows]

    def decode(self, entries: list[BatchEntry]) -> np.ndarray:
        num_outputs = self._batch.fill(entries)
        for entry in entries:
            self.kv_lengths[entry.slot] = entry.start_pos + len(entry.tokens)
        logits = self.step_logits(self.num_decodes, num_outputs)
        self.num_decodes += 1
        return logits

    # --- KV ------------------------------------------------------------------------------------

    def reuse_prefix(self, slot: int, source_slot: int, length: int) -> bool:
        intact = length <= self.kv_lengths[source_slot]
        self.kv_lengths[slot] = length if intact else 0
        return intact

    def save_slot(self, slot: int) -> bytearray | None:
        return None  # no KV to save: the runner's host cache stays empty

    def restore_slot(self, slot: int, state: bytearray, length: int) -> bool:
        self.kv_lengths[slot] = 0
        return False

    def shift_slot(self, slot: int, keep: int, discard: int, n_past: int) -> None:
        self.kv_lengths[slot] = n_past - discard

    def close(self) -> None:
        self._matrix = np.empty((0, self.n_vocab), dtype=np.float32)


# --- one case ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One measurement: `slots` requests of `steps` generated tokens each, at once."""

    slots: int
    vocab: int
    sampling: str  # "greedy" or "sampled"
    steps: int
    reader: str | None = None  # a family whose chats are submitted (None: plain prompts, no reader)
    reads: bool = True  # its reader reads them (False: the same chats, reading off)

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}")
        if self.slots < 1 or self.steps < 1:
            raise ValueError(f"slots and steps must be at least 1, got {self.slots} and {self.steps}")

    @property
    def is_greedy(self) -> bool:
        return self.sampling == "greedy"

    def prompt(self, index: int) -> str:
        return f"Request {index:05d}: tell me something."

    def sampling_params(self, index: int) -> SamplingParams:
        """Request `index`'s sampling: steps + 1 tokens (the first comes from the prefill step,
        then one per decode step), greedy or sampled with its own seed."""
        if self.is_greedy:
            return SamplingParams(max_tokens=self.steps + 1, temperature=0.0)
        return SamplingParams(max_tokens=self.steps + 1, temperature=SAMPLED_TEMPERATURE, top_p=SAMPLED_TOP_P,
                              seed=BASE_SEED + index)

    def requests(self) -> list[Request]:
        if self.reader is None:
            return [Request(prompt=self.prompt(index), sampling=self.sampling_params(index), id=f"r{index}")
                    for index in range(self.slots)]
        return [Request(messages=({"role": "user", "content": self.prompt(index)},),
                        sampling=self.sampling_params(index), id=f"r{index}") for index in range(self.slots)]

    def backend(self) -> ZeroCostBackend:
        opener = ""
        if self.reader is not None:
            from multiseq.tools.families import family_named
            reasoning = family_named(self.reader).reasoning
            opener = reasoning[0] if reasoning else ""
        return ZeroCostBackend(self.slots, self.vocab, self.window, self.n_batch, reasoning_opener=opener)

    @property
    def window(self) -> int:
        return PROMPT_BUDGET + self.steps + 1

    @property
    def n_batch(self) -> int:
        """Every prompt is prefilled in the first step."""
        return self.slots * PROMPT_BUDGET

    def config(self) -> RunnerConfig:
        """No host cache: the zero-cost backend has no state to save."""
        return RunnerConfig(parallel=self.slots, slot_ctx=self.window, n_batch=self.n_batch, threads=1,
                            seed=BASE_SEED, cache_ram_mib=0, tool_format=self.reader,
                            reasoning_format="auto" if self.reads else "none")

    @property
    def reader_label(self) -> str:
        return "none" if self.reader is None else self.reader if self.reads else f"{self.reader}:off"


# --- phases of a step ----------------------------------------------------------------------------

class PhaseClock:
    """Seconds spent in the engine's phases during one step, from wrapped methods."""

    def __init__(self) -> None:
        self.raw: dict[str, float] = defaultdict(float)
        self.had_prefill = False

    def start_step(self) -> None:
        self.raw = defaultdict(float)
        self.had_prefill = False

    def timed(self, name: str, function: Callable) -> Callable:
        def timed_call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.raw[name] += time.perf_counter() - started
        return timed_call

    def phases(self, total: float) -> dict[str, float]:
        """The step's phases (seconds; see the module's docstring), "other" being what is left
        of `total`, the worker's whole turn."""
        raw = self.raw
        phases = {
            "schedule": raw["schedule"] - raw["plan"],
            "batch": raw["plan"] + raw["execute"] - raw["sample"],
            "sample": raw["sample"],
            "detok+stops": raw["append_token"],
            "read": raw["read"],
            "update other": raw["update"] - raw["append_token"] - raw["read"],
            "delivery": raw["take_output"] + raw["deliver"],
        }
        phases["other"] = max(0.0, total - sum(phases.values()))
        return phases


@contextmanager
def instrumented(runner: Runner) -> Iterator[PhaseClock]:
    """Wrap the runner's phase methods with a PhaseClock for the duration of the block. The
    engine's methods are wrapped on its instance, Sequence.append_token on the class (put back
    afterwards)."""
    clock = PhaseClock()
    engine = runner.engine
    schedule, execute = engine.schedule, engine.execute

    def schedule_noting_prefill():
        plan = schedule()
        clock.had_prefill = clock.had_prefill or plan.num_prefill_tokens > 0
        return plan

    def execute_noting_sampling(plan):
        executed = execute(plan)
        clock.raw["sample"] += executed.sample_seconds
        return executed

    engine.schedule = clock.timed("schedule", schedule_noting_prefill)
    engine.execute = clock.timed("execute", execute_noting_sampling)
    engine.update = clock.timed("update", engine.update)
    engine.take_output = clock.timed("take_output", engine.take_output)
    engine.scheduler.plan = clock.timed("plan", engine.scheduler.plan)
    runner._deliveries.deliver = clock.timed("deliver", runner._deliveries.deliver)
    append_token = Sequence.append_token
    Sequence.append_token = clock.timed("append_token", append_token)
    deltas_until, parsed = OutputPieces.deltas_until, OutputPieces.parsed
    OutputPieces.deltas_until = clock.timed("read", deltas_until)
    OutputPieces.parsed = clock.timed("read", parsed)
    try:
        yield clock
    finally:
        Sequence.append_token = append_token
        OutputPieces.deltas_until, OutputPieces.parsed = deltas_until, parsed
        for name in ("schedule", "execute", "update", "take_output"):
            delattr(engine, name)
        del engine.scheduler.plan
        del runner._deliveries.deliver


@dataclass
class EngineRun:
    """A case run through the engine: mean host milliseconds per decode step by phase."""

    case: Case
    phase_ms: dict[str, float]
    total_ms: float
    num_steps: int  # decode steps measured
    texts: list[str] = field(repr=False)

    @property
    def tokens_per_second(self) -> float:
        return self.case.slots * 1000.0 / self.total_ms if self.total_ms else float("inf")


def _consume(piece) -> None:
    """Takes each piece as a server's on_piece does: hands it over (a server's event loop then
    reads what it parses into, on its own thread, when it writes the stream)."""


@dataclass
class MeasuredStep:
    """A decode step's phases (seconds), its whole worker turn and the clock's raw sums."""

    phases: dict[str, float]
    total: float
    raw: dict[str, float]


def decode_steps(runner: Runner, handles: list, clock: PhaseClock) -> list[MeasuredStep]:
    """Start the runner (made with autostart=False) and time each of its worker's turns until
    every handle is done: the turns that decoded without prefilling (the first, and any with a
    prompt chunk, are left out)."""
    measured = []
    turn = runner._worker._turn

    def timed_turn() -> bool:
        clock.start_step()
        started = time.perf_counter()
        stepped = turn()
        total = time.perf_counter() - started
        if stepped and not clock.had_prefill:
            measured.append(MeasuredStep(clock.phases(total), total, dict(clock.raw)))
        return stepped

    runner._worker._turn = timed_turn
    runner.start()
    for handle in handles:
        handle.result()
    runner.between_steps(lambda: None)  # the turn that ended the last request has ended too
    return measured


def run_engine(case: Case) -> EngineRun:
    """Run the case's requests through a Runner and time each step's phases."""
    runner = Runner(case.config(), backend=case.backend(), autostart=False)
    try:
        # Every piece goes to a consumer, as a streaming server's do.
        handles = [runner.submit(request, stream=True, on_piece=_consume) for request in case.requests()]
        with instrumented(runner) as clock:
            measured = decode_steps(runner, handles, clock)
        steps, totals = [step.phases for step in measured], [step.total for step in measured]
        results = [handle.result() for handle in handles]
    finally:
        runner.close()
    failed = [result for result in results if not result.ok or result.completion_tokens != case.steps + 1]
    if failed:
        raise RuntimeError(f"request {failed[0].id} ended with {failed[0].finish_reason}, "
                           f"{failed[0].completion_tokens} tokens: {failed[0].error}")
    if not steps:
        raise RuntimeError("no decode step was measured")
    phase_ms = {phase: 1000.0 * float(np.mean([step[phase] for step in steps])) for phase in PHASES}
    return EngineRun(case, phase_ms, 1000.0 * float(np.mean(totals)), len(steps), [r.text for r in results])


# --- the references for sampling ------------------------------------------------------------------

def logits_read_ms(case: Case, repeats: int) -> float:
    """Mean milliseconds to read one step's [slots, vocab] logits once (a numpy sum)."""
    backend = case.backend()
    seconds = []
    for step in range(repeats):
        logits = backend.step_logits(step, case.slots)
        started = time.perf_counter()
        float(logits.sum())
        seconds.append(time.perf_counter() - started)
    return 1000.0 * float(np.mean(seconds))


@dataclass(frozen=True)
class ChainTimes:
    """llama.cpp's sampler chain over one step's rows, one row after another (ms per step)."""

    fill_ms: float  # writing each row into the llama_token_data array
    apply_ms: float  # llama_sampler_apply and llama_sampler_accept
    tokens: list[list[int]]  # what the chains chose, per step, per row


def _sampler_chain(llama, case: Case, slot: int):
    """One slot's chain, as llama-server builds it for these parameters (penalties, DRY and
    the other samplers it adds are off at their defaults)."""
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    if case.is_greedy:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        return chain
    for sampler in (llama.llama_sampler_init_top_k(TOP_K), llama.llama_sampler_init_top_p(SAMPLED_TOP_P, 1),
                    llama.llama_sampler_init_min_p(MIN_P, 1), llama.llama_sampler_init_temp(SAMPLED_TEMPERATURE),
                    llama.llama_sampler_init_dist(BASE_SEED + slot)):
        llama.llama_sampler_chain_add(chain, sampler)
    return chain


def llama_chain_ms(case: Case, repeats: int) -> ChainTimes:
    """llama.cpp's sampler chain applied row by row, one chain per slot, on `repeats` steps'
    rows of the zero-cost backend."""
    import llama_cpp as llama  # a benchmark reference, not part of the library

    backend = case.backend()
    token_data = np.zeros(case.vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
    if token_data.itemsize != ctypes.sizeof(llama.llama_token_data):
        raise RuntimeError("llama_token_data's layout is not (int32 id, float logit, float p)")
    pointer = token_data.ctypes.data_as(ctypes.POINTER(llama.llama_token_data))
    ids = np.arange(case.vocab, dtype=np.int32)
    chains = [_sampler_chain(llama, case, slot) for slot in range(case.slots)]
    fill = apply = 0.0
    tokens: list[list[int]] = []
    try:
        for step in range(repeats):
            tokens.append([])
            for slot, row in enumerate(backend.step_logits(step, case.slots)):
                started = time.perf_counter()
                token_data["id"] = ids
                token_data["logit"] = row
                token_data["p"] = 0.0
                candidates = llama.llama_token_data_array(data=pointer, size=case.vocab, selected=-1, sorted=False)
                filled = time.perf_counter()
                llama.llama_sampler_apply(chains[slot], ctypes.byref(candidates))
                token = candidates.data[candidates.selected].id
                llama.llama_sampler_accept(chains[slot], token)
                apply += time.perf_counter() - filled
                fill += filled - started
                tokens[-1].append(token)
    finally:
        for chain in chains:
            llama.llama_sampler_free(chain)
    return ChainTimes(1000.0 * fill / repeats, 1000.0 * apply / repeats, tokens)


# --- served ------------------------------------------------------------------------------------------

def chat_body(case: Case, index: int) -> dict:
    """Request `index` of the case as a streamed chat request with the same sampling."""
    params = case.sampling_params(index)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": case.prompt(index)}],
            "max_tokens": params.max_tokens, "temperature": params.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if not case.is_greedy:
        body |= {"top_p": params.top_p, "seed": params.seed}
    return body


@dataclass(frozen=True)
class ClientRun:
    """What the streaming clients received: completion tokens, over the run's wall time."""

    completion_tokens: int
    seconds: float


def stream_clients(host: str, port: int, bodies: list[dict]) -> ClientRun:
    """Send every body at once, streamed, each on its own connection (bench/load.py's client);
    returns when all streams ended. Runs in the client process."""
    async def send_all() -> ClientRun:
        started = time.perf_counter()
        exchanges = await asyncio.gather(*(load.stream_request(host, port, load.APIS["chat"], body, body["max_tokens"])
                                           for body in bodies))
        return ClientRun(sum(exchange.completion_tokens for exchange in exchanges), time.perf_counter() - started)
    return asyncio.run(send_all())


def client_process() -> Executor:
    """A separate process for the clients (spawned: no copy of this process's threads), started
    and warmed up (its imports done) before any timing."""
    executor = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
    executor.submit(int).result()
    return executor


def _served_tokens_per_second(case: Case, stream_interval_s: float | None, clients: Executor) -> float:
    from multiseq.server import ServerSettings, create_app
    from multiseq.server.serve import hand_back_the_gil_sooner, make_server

    runner = Runner(case.config(), backend=case.backend())
    switch_interval = sys.getswitchinterval()
    hand_back_the_gil_sooner()  # as `multiseq serve` does
    app = create_app(runner, ServerSettings(model_name=MODEL_NAME, stream_interval_s=stream_interval_s))
    server = make_server(app, "127.0.0.1", 0, access_log=False)
    thread = threading.Thread(target=server.run, name="hostpath-server", daemon=True)
    thread.start()
    try:
        if not server.listening.wait(30):
            raise RuntimeError("the server did not start listening")
        clients.submit(stream_clients, "127.0.0.1", server.port, [chat_body(case, 0)]).result()  # warm-up
        run = clients.submit(stream_clients, "127.0.0.1", server.port,
                             [chat_body(case, index) for index in range(case.slots)]).result()
    finally:
        server.stop()
        thread.join(30)
        app.state.server.close()
        runner.close()
        sys.setswitchinterval(switch_interval)
    expected = case.slots * (case.steps + 1)
    if run.completion_tokens != expected:
        raise RuntimeError(f"the clients received {run.completion_tokens} completion tokens, not {expected}")
    return run.completion_tokens / run.seconds


def _engine_tokens_per_second(case: Case) -> float:
    """The same requests as chats submitted to a Runner with its worker thread, streamed."""
    with Runner(case.config(), backend=case.backend()) as runner:
        runner.submit(Request(messages=({"role": "user", "content": case.prompt(0)},),
                              sampling=case.sampling_params(0))).result()  # warm-up
        started = time.perf_counter()
        handles = [runner.submit(Request(messages=({"role": "user", "content": case.prompt(index)},),
                                         sampling=case.sampling_params(index)), stream=True)
                   for index in range(case.slots)]
        tokens = sum(handle.result().completion_tokens for handle in handles)
        return tokens / (time.perf_counter() - started)


@dataclass(frozen=True)
class ServedRun:
    case: Case
    stream_interval_s: float | None  # None: auto
    engine_tokens_per_second: float
    server_tokens_per_second: float

    @property
    def ratio(self) -> float:
        return self.server_tokens_per_second / self.engine_tokens_per_second


def run_served(case: Case, stream_interval_s: float | None, clients: Executor) -> ServedRun:
    """Streamed tokens/s of the case served over HTTP (serve --stream-interval), and of the
    engine alone."""
    return ServedRun(case, stream_interval_s, _engine_tokens_per_second(case),
                     _served_tokens_per_second(case, stream_interval_s, clients))


# --- the report ----------------------------------------------------------------------------------

@dataclass
class CaseReport:
    run: EngineRun
    read_floor_ms: float
    chain: ChainTimes


def measure(case: Case, compare_steps: int) -> CaseReport:
    """A case's engine run and its sampling references."""
    return CaseReport(run_engine(case), logits_read_ms(case, compare_steps), llama_chain_ms(case, compare_steps))


def _vocab_label(vocab: int) -> str:
    name = VOCABS.get(vocab)
    return f"{vocab:,} ({name})" if name else f"{vocab:,}"


def phase_table(reports: list[CaseReport]) -> str:
    """Host milliseconds per decode step by phase, with the sampling references."""
    header = ["slots", "vocab", "sampling", "reader", *PHASES, "total", "tok/s", "read floor", "chain fill",
              "chain apply"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for report in reports:
        run = report.run
        cells = [str(run.case.slots), _vocab_label(run.case.vocab), run.case.sampling, run.case.reader_label,
                 *(f"{run.phase_ms[phase]:.3f}" for phase in PHASES), f"{run.total_ms:.3f}",
                 f"{run.tokens_per_second:,.0f}", f"{report.read_floor_ms:.3f}", f"{report.chain.fill_ms:.3f}",
                 f"{report.chain.apply_ms:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _interval_label(seconds: float | None) -> str:
    return "auto" if seconds is None else f"{seconds * 1000:g} ms"


def served_table(runs: list[ServedRun]) -> str:
    header = ["slots", "vocab", "sampling", "stream interval", "engine tok/s", "server tok/s", "server / engine"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        lines.append(f"| {run.case.slots} | {_vocab_label(run.case.vocab)} | {run.case.sampling} | "
                     f"{_interval_label(run.stream_interval_s)} | {run.engine_tokens_per_second:,.0f} | "
                     f"{run.server_tokens_per_second:,.0f} | {run.ratio:.2f} |")
    return "\n".join(lines)


# --- the command line ----------------------------------------------------------------------------

QUICK = dict(slots=[2], vocab=[1024], sampling=list(SAMPLINGS), steps=4, compare_steps=1)


def _numbers(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _intervals(text: str) -> list[float | None]:
    """Stream intervals, comma-separated: seconds, or auto (None)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        values = [None if part == "auto" else float(part) for part in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or seconds, comma-separated, got {text!r}") from None
    if not values or any(value is not None and value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected auto or seconds >= 0, got {text!r}")
    return values


def _samplings(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [value for value in values if value not in SAMPLINGS]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"sampling must be among {', '.join(SAMPLINGS)}, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=_numbers, default=[16, 64, 256], help="slot counts (default 16,64,256)")
    parser.add_argument("--vocab", type=_numbers, default=list(VOCABS),
                        help="vocabulary sizes (default 49152,151936,262144)")
    parser.add_argument("--sampling", type=_samplings, default=list(SAMPLINGS), help="greedy,sampled (default both)")
    parser.add_argument("--steps", type=int, default=64, help="decode steps measured: tokens per request (default 64)")
    parser.add_argument("--compare-steps", type=int, default=2,
                        help="steps of rows the sampling references run over (default 2)")
    parser.add_argument("--readers", type=_readers, default=[(None, False)], metavar="none|FAMILY|FAMILY:off,...",
                        help="run each case with plain prompts (none), a family's chats read (FAMILY) or not "
                             "(FAMILY:off) (default none)")
    parser.add_argument("--server", action="store_true", help="also serve each case over HTTP")
    parser.add_argument("--stream-interval", type=_intervals, default=[None], metavar="auto|SECONDS",
                        help="with --server: serve's --stream-interval, comma-separated to compare (default auto)")
    parser.add_argument("--quick", action="store_true",
                        help="2 slots, a 1,024-token vocabulary, 4 steps: checks that everything runs")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.steps < 1 or args.compare_steps < 1:
        parser.error("--steps and --compare-steps must be at least 1")
    return args


def _readers(text: str) -> list[tuple[str | None, bool]]:
    """(family, whether it reads) per value: none, FAMILY or FAMILY:off."""
    from multiseq.tools.families import family_names
    values = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [value for value in values if value != "none" and value.removesuffix(":off") not in family_names()]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"readers must be none, FAMILY or FAMILY:off ({', '.join(family_names())}), "
                                         f"got {text!r}")
    return [(None, False) if value == "none" else (value.removesuffix(":off"), not value.endswith(":off"))
            for value in values]


def cases(args: argparse.Namespace) -> list[Case]:
    return [Case(slots, vocab, sampling, args.steps, reader, reads)
            for slots in args.slots for vocab in args.vocab for sampling in args.sampling
            for reader, reads in args.readers]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reports = []
    for case in cases(args):
        print(f"{case.slots} slots, vocab {case.vocab}, {case.sampling}, reader {case.reader_label} ...",
              file=sys.stderr, flush=True)
        reports.append(measure(case, args.compare_steps))
    print("Host milliseconds per decode step (zero-cost backend; read floor and llama.cpp chain on the same rows)\n")
    print(phase_table(reports))
    if args.server:
        with client_process() as clients:
            served = []
            for case in cases(args):
                print(f"served: {case.slots} slots, vocab {case.vocab}, {case.sampling} ...", file=sys.stderr,
                      flush=True)
                served.extend(run_served(case, interval, clients) for interval in args.stream_interval)
        print("\nStreamed tokens/s: served over HTTP against the engine alone\n")
        print(served_table(served))
    return 0


if __name__ == "__main__":
    sys.exit(main())
