"""Configuration of the runner and of each request's sampling, validated when built.

These dataclasses are the one source of defaults: the command line and multiseq.ray read
their defaults from them (`default_of`), so the library, `multiseq batch-run` and Ray behave the
same when not told otherwise. One exception, on purpose: a Ray worker runs 1 llama.cpp thread
unless told otherwise (each actor asks Ray for its threads as CPUs; this machine's core count
says nothing about a cluster node's). Every bad value is a ValueError that names its field.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .tools.families import family_names

# llama.cpp's defaults, so that a request without settings samples as llama-server would.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05
DEFAULT_REPEAT_LAST_N = 64
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for one token's bias: [-100, 100]
MAX_OPENAI_PENALTY = 2.0  # OpenAI's range for presence and frequency penalties: [-2, 2]
REASONING_FORMATS = ("auto", "none")
# KV cache element types, as llama.cpp's -ctk/-ctv name them. A quantized V cache needs flash
# attention (llama.cpp's attention reads V through it).
KV_CACHE_TYPES = ("f16", "bf16", "f32", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
UNQUANTIZED_KV_TYPES = ("f16", "bf16", "f32")
TOOL_FORMATS = family_names()  # multiseq.tools.families: one module per family


class OverflowPolicy(str, Enum):
    """What happens to a prompt longer than its slot's window."""

    SLIDE = "slide"  # keep the first n_keep tokens and the newest tail, drop the middle
    # End the request with an error naming the sizes: a prompt that does not fit, or one that
    # leaves no room for its max_tokens (nothing is slid or shifted, ever).
    REJECT = "reject"


class SplitMode(str, Enum):
    """How a model is spread over several GPUs (llama.cpp's --split-mode)."""

    NONE = "none"  # one GPU only: --main-gpu
    LAYER = "layer"  # layers and KV split across the GPUs (llama.cpp's default)
    ROW = "row"  # weights split by rows, the GPUs working in parallel
    TENSOR = "tensor"  # weights and KV split across the GPUs (llama.cpp calls it experimental)


class FlashAttention(str, Enum):
    """Whether llama.cpp uses flash attention (its --flash-attn)."""

    ON = "on"
    OFF = "off"
    AUTO = "auto"  # llama.cpp decides, by what the device supports


class SamplingMode(str, Enum):
    """Where a step's rows are sampled (--sampling)."""

    HOST = "host"  # numpy, on the host, every row
    # llama.cpp's sampler chains in the model's graph for the rows a chain can sample (greedy;
    # temperature, top-k, top-p, min-p, seed); the host for the rest, in the same step.
    BACKEND = "backend"
    # The faster of the two where measured: the host on a CPU build (in-graph greedy measured
    # 0.88x the host's tokens/s, Gemma 3 270M at 16 slots: llama.cpp still copies each row's
    # logits and takes its argmax one row at a time).
    AUTO = "auto"

    def resolved(self) -> SamplingMode:
        return SamplingMode.HOST if self is SamplingMode.AUTO else self


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def is_int(value: Any) -> bool:
    """An integer, and not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_flag(owner: Any, name: str) -> None:
    value = getattr(owner, name)
    _require(isinstance(value, bool), f"{name} must be true or false, got {value!r}")


def _stop_strings(value: Any) -> tuple:
    """stop as a tuple: one string, or a list or tuple of them."""
    if isinstance(value, str):
        return (value,)
    _require(isinstance(value, (list, tuple)), f"stop must be a string or a list of strings, got {value!r}")
    return tuple(value)


def default_of(cls: type, name: str) -> Any:
    """The default of one field of a config dataclass (for the command line's options)."""
    for item in dataclasses.fields(cls):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            return item.default_factory()
    raise KeyError(f"{cls.__name__} has no field {name!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request generates. temperature 0 means greedy (argmax).

    The filters run in llama.cpp's order: logit bias, penalties (repeat, frequency, presence),
    top-k, top-p, min-p, then temperature, then a draw from the seeded generator of that
    request. A constraint (json_schema, grammar or json_object) removes the tokens it forbids
    before the filters, so a constrained request samples exactly as if those tokens did not
    exist; its output always follows the constraint's grammar. A json_schema whose keywords
    the grammar cannot all enforce is approximated (strict_schema refuses it instead), and
    every output that ends is validated against the whole schema (Result.schema_error).
    """

    max_tokens: int | None = 256  # None: until the slot's window is full (OpenAI's default)
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K  # 0 disables top-k
    top_p: float = DEFAULT_TOP_P  # 1.0 disables top-p
    min_p: float = DEFAULT_MIN_P  # 0.0 disables min-p
    repeat_penalty: float = 1.0  # 1.0 disables the penalty
    # llama.cpp's penalties over the same window: logit -= count * frequency + (count > 0) * presence
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    seed: int | None = None  # None: derived from the runner's seed and the request's id
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # End-of-generation tokens are not sampled before this many output tokens (vLLM's
    # min_tokens); stop strings, a complete constrained output and max_tokens still end it.
    min_tokens: int = 0
    json_schema: dict[str, Any] | None = None  # the output is JSON valid under this schema
    grammar: str | None = None  # the output follows this GBNF grammar (llama.cpp's format)
    json_object: bool = False  # the output is one JSON object (OpenAI's {"type": "json_object"})
    # A json_schema is compiled exactly, or the request is refused naming what cannot be
    # enforced; otherwise such keywords are approximated and each output validated after.
    strict_schema: bool = False
    logprobs: bool = False  # report each output token's log probability
    top_logprobs: int = 0  # and this many most likely alternatives at each position (0-20)
    # The prompt's own log probabilities (echo with logprobs, for scoring): None, none; k, each
    # prompt token's after the first, with the k most likely alternatives at its position (0-20).
    # Such a prompt is computed whole, never reused from a cache (whose rows are gone).
    prompt_logprobs: int | None = None
    # Code completion's limits (llama-server's n_indent and t_max_predict_ms): the output ends
    # at a line, after its first, indented by fewer than min_indent spaces or tabs (that line's
    # indentation kept, its text dropped), and at the first new line after newline_deadline_ms
    # of generating. 0: no limit.
    min_indent: int = 0
    newline_deadline_ms: int = 0
    # Tokens a reasoning model may spend in its reasoning block before its close is forced (-1:
    # no limit, 0: closed as soon as it opens; None: the runner's reasoning_budget), and the
    # text written before that close (None: the runner's reasoning_budget_message).
    reasoning_budget: int | None = None
    reasoning_budget_message: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        _require(self.reasoning_budget is None or (is_int(self.reasoning_budget) and self.reasoning_budget >= -1),
                 f"reasoning_budget must be an integer >= -1 (-1: no limit), got {self.reasoning_budget!r}")
        _require(self.reasoning_budget_message is None or isinstance(self.reasoning_budget_message, str),
                 f"reasoning_budget_message must be a string, got {self.reasoning_budget_message!r}")
        _require(self.max_tokens is None or (is_int(self.max_tokens) and self.max_tokens >= 1),
                 f"max_tokens must be an integer >= 1 (or None: until the window is full), got {self.max_tokens!r}")
        _require(is_number(self.temperature) and self.temperature >= 0,
                 f"temperature must be a number >= 0, got {self.temperature!r}")
        _require(is_int(self.top_k) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}")
        _require(is_number(self.top_p) and 0 < self.top_p <= 1, f"top_p must be a number in (0, 1], got {self.top_p!r}")
        _require(is_number(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be a number in [0, 1], got {self.min_p!r}")
        _require(is_number(self.repeat_penalty) and self.repeat_penalty > 0,
                 f"repeat_penalty must be a number > 0, got {self.repeat_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require(is_number(value) and -MAX_OPENAI_PENALTY <= value <= MAX_OPENAI_PENALTY,
                     f"{name} must be a number in [-2, 2], got {value!r}")
        _require(is_int(self.repeat_last_n) and self.repeat_last_n >= 0,
                 f"repeat_last_n must be an integer >= 0, got {self.repeat_last_n!r}")
        _require(self.seed is None or (is_int(self.seed) and 0 <= self.seed < 2**64),
                 f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        _require(all(isinstance(s, str) and s for s in self.stop), f"stop strings must be non-empty strings, got {self.stop!r}")
        _check_flag(self, "ignore_eos")
        _require(is_int(self.min_tokens) and self.min_tokens >= 0,
                 f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        _require(self.max_tokens is None or self.min_tokens <= self.max_tokens,
                 f"min_tokens must be at most max_tokens ({self.max_tokens}), got {self.min_tokens!r}")
        self._check_logit_bias()
        self._check_constraint()
        _check_flag(self, "logprobs")
        _require(is_int(self.top_logprobs) and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
                 f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}")
        _require(self.logprobs or not self.top_logprobs, "top_logprobs needs logprobs=True")
        _require(self.prompt_logprobs is None or (is_int(self.prompt_logprobs)
                                                  and 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS),
                 f"prompt_logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {self.prompt_logprobs!r}")
        for name in ("min_indent", "newline_deadline_ms"):
            value = getattr(self, name)
            _require(is_int(value) and value >= 0, f"{name} must be an integer >= 0, got {value!r}")

    def _check_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        _require(isinstance(self.logit_bias, dict), f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
        for token, bias in self.logit_bias.items():
            _require(is_int(token) and token >= 0, f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            _require(is_number(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS,
                     f"logit_bias of token {token} must be a number in [-100, 100], got {bias!r}")

    def _check_constraint(self) -> None:
        given = [name for name in ("json_schema", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        _require(len(given) <= 1, f"give at most one of json_schema, grammar and json_object, got {', '.join(given)}")
        _require(self.json_schema is None or isinstance(self.json_schema, dict),
                 f"json_schema must be a JSON Schema object (a dict), got {self.json_schema!r}")
        _require(self.grammar is None or (isinstance(self.grammar, str) and self.grammar.strip() != ""),
                 f"grammar must be non-empty GBNF text, got {self.grammar!r}")
        _check_flag(self, "json_object")
        _check_flag(self, "strict_schema")

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1

    @property
    def uses_penalties(self) -> bool:
        """Whether any of the repeat, frequency and presence penalties changes a logit."""
        active = self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        return active and self.repeat_last_n > 0

    @property
    def is_constrained(self) -> bool:
        return self.json_schema is not None or self.grammar is not None or self.json_object


# How an embedding request's prompt rows become its embedding (multiseq.loop.pooling): their
# mean, the first token's (cls), the last token's, or none (every token's row, as a matrix).
POOLINGS = ("mean", "cls", "last", "none")
DEFAULT_POOLING = "default"  # an embedding request's: the runner's (RunnerConfig.pooling, else the model's)
# A reranker's: llama.cpp pools each input and applies the model's classifier head; a request's
# "embedding" is then its scores (a query and a document together: multiseq.llama.rerank).
RANK = "rank"
CONTEXT_POOLINGS = (*POOLINGS, RANK)

DEFAULT_SLOT_CTX = 2048
KV_POOL_AUTO = "auto"


# Speculative decoding's draft sources (llama-server's --spec-type names).
SPEC_TYPES = ("none", "ngram-simple", "ngram-mod")
KV_LAYOUTS = ("auto", "pool")  # how a kv_pool is held (RunnerConfig.kv_layout)

THREADS_ENV = "MULTISEQ_THREADS"


def default_threads() -> int:
    """llama.cpp's threads when none are given: MULTISEQ_THREADS, else every core. The variable
    is for several runners on one machine (test workers, one server per socket): each thread
    spins on its core while a step runs, so runners sharing cores must split them."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return os.cpu_count() or 1
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{THREADS_ENV}={value!r}: a thread count is a whole number of at least 1")
    return int(value)

@dataclass(frozen=True)
class RunnerConfig:
    """The runner: one llama.cpp context with `parallel` slots, each with a window of
    `slot_ctx` tokens, or all sharing one pool of `kv_pool` KV cells (llama.cpp's unified KV).

    In a pool a session may grow to the whole pool (or to `slot_ctx`, a cap then, not a
    reservation), a prefix shared by several sessions is held once, and a request is admitted
    when its prompt fits in the free cells. `slot_ctx` is the cap the runner enforces; llama.cpp
    may allocate a little more (it rounds up to a multiple of 256), and that excess is never used.
    """

    model: str | None = None  # registry name or path to a .gguf; None: the default model
    parallel: int = 8
    slot_ctx: int | None = None  # None: 2,048 tokens a slot; in a pool, the whole pool
    # KV cells the slots share; "auto": sized from the model's trained context and the memory
    # free (multiseq.llama.kv_sizing); None: a window of slot_ctx each.
    kv_pool: int | str | None = None
    # How llama.cpp holds a kv_pool: "auto", a window per slot while every slot's KV fits its
    # window (kv_pool / parallel: attention then reads only a sequence's own cells) and one pool
    # from the step a slot needs more, back to windows once none has for a while; "pool", one
    # pool always (llama.cpp's kv_unified).
    kv_layout: str = "auto"
    n_batch: int = 512  # most tokens in one llama_decode call
    # The step's token budget: every decoding sequence's token, then prompt chunks up to it (at
    # least one chunk of the backend's smallest size). Smaller keeps streams flowing while long
    # prompts arrive; None is n_batch (throughput first, as a batch job wants).
    step_tokens: int | None = None
    threads: int = field(default_factory=default_threads)
    n_keep: int = 0  # prompt tokens always kept when sliding (the BOS token is kept besides)
    n_discard: int = 0  # tokens dropped per generation shift; 0: half of what follows n_keep
    overflow: OverflowPolicy = OverflowPolicy.SLIDE
    seed: int | None = None  # base seed for requests without one; None: fresh entropy
    # The model's projector GGUF (llama.cpp's mmproj): prompts may then hold images or audio.
    mmproj: str | None = None
    # Without mmproj: load the projector a Hugging Face repository holds beside its model (as
    # llama.cpp's -hf does; --no-mmproj turns it off).
    auto_mmproj: bool = True
    # LoRA adapters (GGUF file, scale) applied to every sequence (llama-server's --lora-scaled).
    lora: tuple[tuple[str, float], ...] = ()
    # LoRA adapters by name (name, GGUF path, scale), each on the requests that name it
    # (Request.adapter) over `lora`: vLLM's --lora-modules. One context: a step runs one adapter.
    lora_modules: tuple[tuple[str, str, float], ...] = ()
    # Overrides the model's template: a llama.cpp built-in template name, Jinja template text,
    # or the path of a Jinja template file (rendered with jinja2; see chat_template.py).
    chat_template: str | None = None
    # The family the model writes tool calls and reasoning in (a name of multiseq.tools.families,
    # e.g. hermes, qwen3-xml, gpt-oss); None: detected from the chat template (generic where
    # it knows no tools).
    tool_format: str | None = None
    # "auto": a reasoning model's thinking is split from its answer (reasoning_content); "none":
    # the raw text is the answer, thinking and its markers included (llama-server's
    # --reasoning-format none).
    reasoning_format: str = "auto"
    # A reasoning model's reasoning tokens per request before its block's close is forced (-1:
    # no limit; 0: none), and the text written before that close (llama-server's
    # --reasoning-budget and --reasoning-budget-message); a request's own wins.
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""
    prefix_cache: bool = True  # reuse prompt prefixes already in some slot's KV instead of prefilling them
    # Host memory (MiB) for slots' KV saved before it is overwritten, restored when a prompt
    # comes back to it (llama-server's --cache-ram); 0 turns it off.
    cache_ram_mib: int = 2048
    # A folder where states leaving host memory, and at close what the slots and host memory
    # keep, are written, to be restored after a restart (None: off); bounded in MiB.
    cache_disk: str | None = None
    cache_disk_mib: int = 10240
    # A request's output independent of what shares its batch (parallelism, prefix reuse, the
    # other requests), at some cost in speed: flash attention and weight repacking are off, and
    # a step holds either one prompt chunk or the decoding tokens.
    batch_invariant: bool = False
    # Where the model runs; llama.cpp's model and context parameters of the same names.
    # Layers stored on the GPU: None is llama.cpp's default (every layer, on a build with a GPU
    # backend), -1 every layer, 0 none. A CPU-only build ignores all of these but flash_attn.
    n_gpu_layers: int | None = None
    main_gpu: int = 0  # the GPU for the whole model with split_mode "none"
    split_mode: SplitMode = SplitMode.LAYER
    tensor_split: tuple[float, ...] | None = None  # each GPU's share of the model, e.g. (3, 1)
    # "auto" lets llama.cpp decide; batch_invariant turns it off (its kernels depend on the batch).
    flash_attn: FlashAttention = FlashAttention.AUTO
    # The KV cache's element types (llama.cpp's --cache-type-k/-v): q8_0 holds about twice the
    # tokens of f16 in the same memory.
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    sampling: SamplingMode = SamplingMode.AUTO  # where rows are sampled: the host, or llama.cpp's graph
    # Speculative decoding from the session's own text (multiseq.loop.speculation), llama-server's
    # names: "ngram-simple" drafts from the session's prompt and output, "ngram-mod" also from
    # a pool of n-grams shared by every session; drafts of spec_draft_min..spec_draft_max
    # tokens, found by matching the last spec_ngram_size tokens.
    spec_type: str = "none"
    spec_draft_max: int = 16
    spec_draft_min: int = 1
    spec_ngram_size: int = 4
    # How embedding requests pool by default (one of POOLINGS, or rank: the model is used as a
    # reranker); None: as the GGUF says, else mean.
    pooling: str | None = None

    def __post_init__(self) -> None:
        _require(self.pooling is None or self.pooling in CONTEXT_POOLINGS,
                 f"pooling must be one of {', '.join(CONTEXT_POOLINGS)} (or None: the model's), got {self.pooling!r}")
        _require(self.overflow in [policy.value for policy in OverflowPolicy],
                 f"overflow must be one of {', '.join(policy.value for policy in OverflowPolicy)}, got {self.overflow!r}")
        object.__setattr__(self, "overflow", OverflowPolicy(self.overflow))
        self._check_files()
        _require(self.seed is None or (is_int(self.seed) and 0 <= self.seed < 2**64),
                 f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        _require(is_int(self.reasoning_budget) and self.reasoning_budget >= -1,
                 f"reasoning_budget must be an integer >= -1 (-1: no limit), got {self.reasoning_budget!r}")
        _require(isinstance(self.reasoning_budget_message, str),
                 f"reasoning_budget_message must be a string, got {self.reasoning_budget_message!r}")
        _require(self.reasoning_format in REASONING_FORMATS,
                 f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got {self.reasoning_format!r}")
        _require(self.tool_format is None or self.tool_format in TOOL_FORMATS,
                 f"tool_format must be one of {', '.join(TOOL_FORMATS)} (or None: told by the chat template), "
                 f"got {self.tool_format!r}")
        _check_flag(self, "prefix_cache")
        _require(is_int(self.cache_ram_mib) and self.cache_ram_mib >= 0,
                 f"cache_ram_mib must be an integer >= 0 (0: off), got {self.cache_ram_mib!r}")
        _require(self.cache_disk is None or isinstance(self.cache_disk, str),
                 f"cache_disk must be a folder's path or None, got {self.cache_disk!r}")
        _require(is_int(self.cache_disk_mib) and self.cache_disk_mib >= 1,
                 f"cache_disk_mib must be an integer >= 1, got {self.cache_disk_mib!r}")
        _check_flag(self, "batch_invariant")
        _require(is_int(self.parallel) and self.parallel >= 1, f"parallel must be >= 1, got {self.parallel!r}")
        _require(self.slot_ctx is None or (is_int(self.slot_ctx) and self.slot_ctx >= 16),
                 f"slot_ctx must be >= 16 tokens (or None), got {self.slot_ctx!r}")
        _require(self.kv_pool in (None, KV_POOL_AUTO) or (is_int(self.kv_pool) and self.kv_pool >= 16),
                 f"kv_pool must be >= 16 tokens, '{KV_POOL_AUTO}' or None (a window per slot), got {self.kv_pool!r}")
        _require(self.kv_layout in KV_LAYOUTS,
                 f"kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {self.kv_layout!r}")
        _require(is_int(self.n_batch) and self.n_batch >= self.parallel,
                 f"n_batch ({self.n_batch}) must be at least parallel ({self.parallel}) so every slot can decode each step")
        _require(self.step_tokens is None or (is_int(self.step_tokens) and self.parallel <= self.step_tokens <= self.n_batch),
                 f"step_tokens must be between parallel ({self.parallel}) and n_batch ({self.n_batch}), "
                 f"or None (n_batch), got {self.step_tokens!r}")
        _require(is_int(self.threads) and self.threads >= 1, f"threads must be >= 1, got {self.threads!r}")
        _require(self.kv_pool is None or not self.batch_invariant,
                 "batch_invariant needs a KV window per slot (kv_pool None): in a shared pool a sequence attends "
                 "over cells that lie among the others', and its numbers depend on where they lie")
        self._check_speculation()
        _require(is_int(self.n_keep) and 0 <= self.n_keep < self.session_ctx // 2,
                 f"n_keep must be in [0, slot_ctx/2) = [0, {self.session_ctx // 2}), got {self.n_keep!r}")
        _require(is_int(self.n_discard) and self.n_discard >= 0, f"n_discard must be >= 0, got {self.n_discard!r}")
        self._check_devices()

    @property
    def session_ctx(self) -> int:
        """The most tokens one request holds (prompt and generation): slot_ctx, else the whole
        pool, else the default window."""
        pool = self.kv_pool if is_int(self.kv_pool) else None  # "auto" is known once the model is
        if self.slot_ctx is not None:
            return min(self.slot_ctx, pool or self.slot_ctx)
        return pool or DEFAULT_SLOT_CTX

    def _check_files(self) -> None:
        _require(self.model is None or isinstance(self.model, (str, os.PathLike)),
                 f"model must be a registry name or a path, got {self.model!r}")
        _require(self.mmproj is None or isinstance(self.mmproj, (str, os.PathLike)),
                 f"mmproj must be a path, got {self.mmproj!r}")
        _require(isinstance(self.lora, tuple) and all(
            isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], (str, os.PathLike))
            and is_number(pair[1]) for pair in self.lora),
            f"lora must be a tuple of (adapter GGUF path, scale) pairs, got {self.lora!r}")
        _require(isinstance(self.lora_modules, tuple) and all(
            isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], str) and entry[0]
            and isinstance(entry[1], (str, os.PathLike)) and is_number(entry[2]) for entry in self.lora_modules)
            and len({entry[0] for entry in self.lora_modules}) == len(self.lora_modules),
            f"lora_modules must be a tuple of (name, adapter GGUF path, scale), each name once, got "
            f"{self.lora_modules!r}")
        _require(self.chat_template is None or isinstance(self.chat_template, str),
                 f"chat_template must be a string, got {self.chat_template!r}")

    def _check_speculation(self) -> None:
        _require(self.spec_type in SPEC_TYPES,
                 f"spec_type must be one of {', '.join(SPEC_TYPES)}, got {self.spec_type!r}")
        _require(is_int(self.spec_draft_max) and is_int(self.spec_draft_min)
                 and 1 <= self.spec_draft_min <= self.spec_draft_max,
                 f"speculative drafts need 1 <= spec_draft_min <= spec_draft_max, got {self.spec_draft_min!r} and "
                 f"{self.spec_draft_max!r}")
        _require(is_int(self.spec_ngram_size) and self.spec_ngram_size >= 1,
                 f"spec_ngram_size must be an integer >= 1, got {self.spec_ngram_size!r}")
        _require(self.spec_type == "none" or not self.batch_invariant,
                 "batch_invariant cannot verify drafts: llama.cpp computes a draft's rows with other kernels "
                 "than a lone decoded token's (their logits differ in the last bits), so give spec_type 'none'")

    def _check_devices(self) -> None:
        _require(self.n_gpu_layers is None or (is_int(self.n_gpu_layers) and self.n_gpu_layers >= -1),
                 f"n_gpu_layers must be an integer >= -1 (-1: every layer) or None, got {self.n_gpu_layers!r}")
        _require(is_int(self.main_gpu) and self.main_gpu >= 0, f"main_gpu must be an integer >= 0, got {self.main_gpu!r}")
        _require(self.split_mode in [mode.value for mode in SplitMode],
                 f"split_mode must be one of {', '.join(mode.value for mode in SplitMode)}, got {self.split_mode!r}")
        object.__setattr__(self, "split_mode", SplitMode(self.split_mode))
        if self.tensor_split is not None:
            shares = self.tensor_split
            _require(isinstance(shares, (list, tuple)) and len(shares) > 0
                     and all(is_number(share) and 0 <= share < float("inf") for share in shares)
                     and sum(shares) > 0,
                     f"tensor_split must be a list of shares >= 0 (one per GPU), not all 0, got {shares!r}")
            object.__setattr__(self, "tensor_split", tuple(float(share) for share in shares))
        _require(self.flash_attn in [mode.value for mode in FlashAttention],
                 f"flash_attn must be one of {', '.join(mode.value for mode in FlashAttention)}, got {self.flash_attn!r}")
        object.__setattr__(self, "flash_attn", FlashAttention(self.flash_attn))
        _require(self.sampling in [mode.value for mode in SamplingMode],
                 f"sampling must be one of {', '.join(mode.value for mode in SamplingMode)}, got {self.sampling!r}")
        object.__setattr__(self, "sampling", SamplingMode(self.sampling))
        for field_name in ("cache_type_k", "cache_type_v"):
            _require(getattr(self, field_name) in KV_CACHE_TYPES,
                     f"{field_name} must be one of {', '.join(KV_CACHE_TYPES)}, got {getattr(self, field_name)!r}")
        flash_off = self.flash_attn is FlashAttention.OFF or self.batch_invariant
        _require(self.cache_type_v in UNQUANTIZED_KV_TYPES or not flash_off,
                 f"a quantized V cache ({self.cache_type_v}) needs flash attention, which "
                 f"{'batch_invariant' if self.batch_invariant else 'flash_attn off'} turns off: give cache_type_v "
                 f"f16, or leave flash attention on")
        _require(not (self.flash_attn is FlashAttention.ON and self.batch_invariant),
                 "flash_attn 'on' does not go with batch_invariant, which turns flash attention off "
                 "(its kernels compute a token differently by what shares its batch)")
