"""The only module that imports llama_cpp: model, context, batch, decode, logits, KV, tokenizer, devices.

One llama.cpp context holds `num_slots` sequences (n_seq_max), either with one KV stream each
(kv_unified off: each slot owns a window of llama_n_ctx_seq() positions) or in one pool of cells
the slots share (kv_unified on: a slot may grow to the whole pool, and a prefix copied between
slots is the same cells, not a copy). The batch is a llama_batch whose arrays are numpy buffers
owned here, filled with slice assignments.
"""

from __future__ import annotations

import ctypes
import mmap
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

# llama.cpp's CPU threads are OpenMP threads, and libgomp keeps them spinning (300,000 turns by
# default) after each decode returns: on the cores where the host then samples the step's rows.
# With a short spin they sleep at once: the decode took as long (49.4 against 50.1 ms, Gemma 3
# 270M, 16 slots, 2 cores) and sampling on two threads 1.25 instead of 2.0 ms. libgomp reads it
# when it loads, with llama_cpp just below; a value the user set is kept.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
import llama_cpp as llama  # noqa: E402

from .batch import BatchEntry, ChainSpec, ChunkRules, SlotState
from .chat_template import ChatTemplate, JinjaRenderer, load_chat_template
from .errors import BackendError, NoKvSlot

logger = logging.getLogger("multiseq.llama")
notices = logging.getLogger("multiseq.backend")  # multiseq's own notices about llama.cpp (not its log)

_GGML_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}  # ggml's WARN and ERROR
_GGML_DEBUG, _GGML_INFO = 1, 2
_init_lock = threading.Lock()
_log_callback = None  # kept referenced: llama.cpp calls it for the life of the process
_capture_lock = threading.Lock()
_capture: _LlamaLog | None = None  # what llama.cpp logs while a model loads or a context is created
_PIECE_BUFFER_BYTES = 256
_DECODE_NO_KV_SLOT = 1
_STATE_FLAGS = 0  # LLAMA_STATE_SEQ_FLAGS_NONE: the whole state, in host memory
_UNTILED_ROWS_BELOW = 64  # GGML_FA_TILE_Q of ggml-cpu's flash attention
_TOKENS_PER_PRODUCT_GROUP = 4  # columns per ggml-cpu repacked GEMM call; the rest go through GEMV

_SPLIT_MODES = {"none": llama.LLAMA_SPLIT_MODE_NONE, "layer": llama.LLAMA_SPLIT_MODE_LAYER,
                "row": llama.LLAMA_SPLIT_MODE_ROW, "tensor": llama.LLAMA_SPLIT_MODE_TENSOR}
# The KV cache types by llama.cpp's names (-ctk/-ctv), as ggml's enum (ggml.h) numbers them;
# llama-cpp-python does not export them all (no GGML_TYPE_BF16).
_KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
# Bytes per value of each KV type (ggml's block size and bytes per block: q8_0 is 34 bytes per 32).
_KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                  "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}
_FLASH_ATTENTION = {"on": llama.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": llama.LLAMA_FLASH_ATTN_TYPE_DISABLED,
                    "auto": llama.LLAMA_FLASH_ATTN_TYPE_AUTO}
# What llama.cpp says, at debug and info level, about where things run (llama-model.cpp's
# load_tensors and llama-context.cpp; the lines are the same on every backend).
_LAYER_DEVICE = re.compile(r"load_tensors: layer +\d+ assigned to device (\S+?),")
_FLASH_ATTENTION_ASKED = re.compile(r"llama_context: flash_attn += (\w+)")
_FLASH_ATTENTION_RESOLVED = re.compile(r"Flash Attention (enabled|not supported)")
_no_gpu_noted = False


@dataclass
class _LlamaLog:
    """llama.cpp's log lines during one model load or context creation: its errors, which a
    failure reports, and its debug and info lines, which say where layers went."""

    errors: list[str]
    lines: list[str]


def _forward_llama_log(level: int, text: bytes, _user_data) -> None:
    capture = _capture
    if capture is not None and level in (_GGML_DEBUG, _GGML_INFO) and text:
        capture.lines.append(text.decode("utf-8", "replace"))
        return
    python_level = _GGML_LOG_LEVELS.get(level)
    if python_level is None or not text:
        return
    message = text.decode("utf-8", "replace").rstrip()
    if capture is not None and python_level >= logging.ERROR:
        # A failed load is reported by its BackendError, in one line naming this cause; the
        # log lines themselves are only warnings then (batch-run shows them with -v).
        capture.errors.append(message)
        python_level = logging.WARNING
    logger.log(python_level, message)


@contextmanager
def _capturing_llama_log() -> Iterator[_LlamaLog]:
    """While a model loads or a context is created, collect what llama.cpp logs (one at a time)."""
    global _capture
    with _capture_lock:
        _capture = _LlamaLog([], [])
        try:
            yield _capture
        finally:
            _capture = None


def builtin_chat_templates() -> list[str]:
    """The names of llama.cpp's built-in chat templates."""
    count = llama.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * count)()
    llama.llama_chat_builtin_templates(names, count)
    return [name.decode("utf-8") for name in names]


def _init_llama_once() -> None:
    global _log_callback
    with _init_lock:
        if _log_callback is None:
            _log_callback = llama.llama_log_callback(_forward_llama_log)
            llama.llama_log_set(_log_callback, None)
            llama.llama_backend_init()


class _BatchBuffers:
    """A llama_batch whose arrays are numpy buffers; each token belongs to one sequence."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.positions = np.zeros(capacity, dtype=np.int32)
        self.num_seq_ids = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.outputs = np.zeros(capacity, dtype=np.int8)
        seq_id_pointer = ctypes.POINTER(llama.llama_seq_id)
        base = self.seq_ids.ctypes.data
        item = self.seq_ids.itemsize
        self._seq_id_rows = (seq_id_pointer * capacity)(
            *(ctypes.cast(base + index * item, seq_id_pointer) for index in range(capacity)))
        self.batch = llama.llama_batch()
        self.batch.token = self.tokens.ctypes.data_as(ctypes.POINTER(llama.llama_token))
        self.batch.embd = None
        self.batch.pos = self.positions.ctypes.data_as(ctypes.POINTER(llama.llama_pos))
        self.batch.n_seq_id = self.num_seq_ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.batch.seq_id = self._seq_id_rows
        self.batch.logits = self.outputs.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill(self, entries: list[BatchEntry]) -> int:
        """Write the entries into the batch; return the number of output rows requested.

        Built as Python lists and copied in with one assignment per array: cheaper than
        several small numpy writes per entry when most entries are a single token."""
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        output_indices: list[int] = []
        for entry in entries:
            length = len(entry.tokens)
            tokens += entry.tokens
            positions += range(entry.start_pos, entry.start_pos + length)
            seq_ids += [entry.slot] * length
            if entry.wants_output:
                output_indices += range(len(tokens) - entry.num_drafted - 1, len(tokens))
        count = len(tokens)
        assert count <= self.capacity, "a step never holds more than n_batch tokens"
        self.tokens[:count] = tokens
        self.positions[:count] = positions
        self.seq_ids[:count] = seq_ids
        self.outputs[:count] = 0
        self.outputs[output_indices] = 1
        self.batch.n_tokens = count
        self.output_indices = output_indices  # where each output row's token is in the batch
        return len(output_indices)


class _SlotChains:
    """Sampler chains inside the model's graph, one per slot (llama_set_sampler): llama.cpp
    samples those slots' rows itself, and copies no logits when every row of a micro-batch
    has a chain. The chains are owned here, freed once detached."""

    def __init__(self, ctx, batch: _BatchBuffers, n_vocab: int) -> None:
        self._ctx = ctx
        self._batch = batch
        self._n_vocab = n_vocab
        self._chains: dict[int, object] = {}

    def attach(self, slot: int, spec: ChainSpec, num_accepted: int) -> bool:
        self.detach(slot)
        chain = _new_chain(spec, num_accepted, self._n_vocab)
        if not llama.llama_set_sampler(self._ctx, slot, chain):
            llama.llama_sampler_free(chain)
            return False
        self._chains[slot] = chain
        return True

    def detach(self, slot: int) -> None:
        chain = self._chains.pop(slot, None)
        if chain is not None:
            llama.llama_set_sampler(self._ctx, slot, None)
            llama.llama_sampler_free(chain)

    @property
    def has_chains(self) -> bool:
        return bool(self._chains)

    def sampled_tokens(self, rows: list[int]) -> list[int]:
        indices = self._batch.output_indices
        return [llama.llama_get_sampled_token_ith(self._ctx, indices[row]) for row in rows]

    def accept(self, slot: int, token: int) -> None:
        llama.llama_sampler_accept(self._chains[slot], token)

    def close(self) -> None:
        for slot in list(self._chains):
            self.detach(slot)


_NO_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp would seed from entropy


def _new_chain(spec: ChainSpec, num_accepted: int, n_vocab: int):
    """llama.cpp's chain for the spec. Its draw is advanced past the tokens already accepted
    (one draw each, as llama.cpp's dist sampler draws once per accepted output), so a
    sequence given a new chain (preempted, then resumed) draws what it would have drawn."""
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    if spec.logit_bias:
        pairs = (llama.llama_logit_bias * len(spec.logit_bias))(*(llama.llama_logit_bias(token, bias)
                                                                  for token, bias in spec.logit_bias))
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_logit_bias(n_vocab, len(spec.logit_bias), pairs))
    if spec.is_greedy:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        return chain
    if spec.top_k > 0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_k(spec.top_k))
    if spec.top_p < 1.0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_p(spec.top_p, 1))
    if spec.min_p > 0.0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_min_p(spec.min_p, 1))
    llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_temp(spec.temperature))
    dist = llama.llama_sampler_init_dist(spec.seed if spec.seed != _NO_SEED else 0)
    _advance_draws(dist, num_accepted)
    llama.llama_sampler_chain_add(chain, dist)
    return chain


def _advance_draws(dist, count: int) -> None:
    """Draw `count` times from a dist sampler: applied to a one-token array, it draws once."""
    one = (llama.llama_token_data * 1)(llama.llama_token_data(0, 0.0, 1.0))
    array = llama.llama_token_data_array(one, 1, -1, False)
    for _ in range(count):
        llama.llama_sampler_apply(dist, ctypes.byref(array))


class LlamaModel:
    """A loaded GGUF: weights, vocabulary, chat template. Contexts are created on it."""

    def __init__(self, model_path: str, chat_template: str | None = None,
                 chat_template_fallback: str | None = None, repack_weights: bool = True,
                 n_gpu_layers: int | None = None, main_gpu: int = 0, split_mode: str = "layer",
                 tensor_split: Sequence[float] | None = None, vocab_only: bool = False) -> None:
        _init_llama_once()
        # A template the user gave is checked before the (slower) load.
        chosen = _load_user_template(chat_template) if chat_template else None
        self.params = self._model_params(repack_weights, n_gpu_layers, main_gpu, split_mode, tensor_split)
        self.params.vocab_only = vocab_only  # the vocabulary and metadata alone: no weights, no context
        self.repack_weights = repack_weights
        if n_gpu_layers and not gpu_offload_supported():
            _note_no_gpu(n_gpu_layers)
        with _capturing_llama_log() as log:
            self.handle = llama.llama_model_load_from_file(str(model_path).encode(), self.params)
        if not self.handle:
            cause = f": {log.errors[0]}" if log.errors else ""
            raise BackendError(f"llama.cpp could not load the model file {model_path}{cause}")
        # Where llama.cpp put each layer (the output layer counted, as llama.cpp counts it), by
        # device name: the placement it chose, read back from what it reports.
        self.layer_devices: dict[str, int] = dict(Counter(
            match.group(1) for line in log.lines if (match := _LAYER_DEVICE.search(line))))
        self.path = str(model_path)
        self._vocab = llama.llama_model_get_vocab(self.handle)
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self.add_bos = bool(llama.llama_vocab_get_add_bos(self._vocab))
        embedded = llama.llama_model_chat_template(self.handle, None)
        # An explicit template wins; then the GGUF's own; then the registry's fallback, for
        # GGUFs without one (llama.cpp would otherwise pick chatml, wrong for Gemma).
        if chosen is None and embedded:
            chosen = ChatTemplate.embedded(embedded.decode("utf-8", "replace"))
        if chosen is None and chat_template_fallback:
            chosen = ChatTemplate.builtin(chat_template_fallback)
        self.chat_template = chosen
        self._jinja: JinjaRenderer | None = None
        self._piece_cache: dict[int, bytes] = {}
        self._end_of_generation_tokens: list[int] | None = None
        self._grammar_tokenizer = None
        self._grammar_tokenizer_lock = threading.Lock()

    def _model_params(self, repack_weights: bool, n_gpu_layers: int | None, main_gpu: int, split_mode: str,
                      tensor_split: Sequence[float] | None):
        """llama.cpp's model parameters; kept on the model (with the array tensor_split points
        to), so that what was passed can be read back."""
        params = llama.llama_model_default_params()
        # llama.cpp repacks some weight types for faster matrix products, which then take a
        # batch's tokens four at a time and its last ones one by one, with other rounding: a
        # token's numbers would depend on how many tokens share its micro-batch.
        params.use_extra_bufts = repack_weights
        if n_gpu_layers is not None:
            params.n_gpu_layers = n_gpu_layers
        params.main_gpu = main_gpu
        params.split_mode = _SPLIT_MODES[str(getattr(split_mode, "value", split_mode))]
        self._tensor_split = None
        if tensor_split:
            max_devices = llama.llama_max_devices()
            if len(tensor_split) > max_devices:
                raise BackendError(f"tensor_split has {len(tensor_split)} shares; this llama.cpp build takes at "
                                   f"most {max_devices} devices")
            self._tensor_split = (ctypes.c_float * max_devices)(*tensor_split)
            params.tensor_split = self._tensor_split
        return params

    @property
    def n_ctx_train(self) -> int:
        """The context the model was trained with (what a session may use before it degrades),
        from the GGUF's metadata (read with the vocabulary alone too); 0 when it does not say."""
        return self._metadata_int("context_length") or 0

    def kv_bytes_per_token(self, cache_types: tuple[str, str] = ("f16", "f16")) -> int | None:
        """The KV cache's bytes for one token in every layer, with these K and V types, from the
        GGUF's metadata: each layer keeps head_count_kv keys and values of the key and value
        lengths (a full-size sliding-window cache, multiseq's default, is as large as the full
        one). None when the metadata does not say (a per-layer head count, say)."""
        n_layer, n_head = self._metadata_int("block_count"), self._metadata_int("attention.head_count")
        n_head_kv = self._metadata_int("attention.head_count_kv") or n_head
        embedding = self._metadata_int("embedding_length")
        if not (n_layer and n_head and n_head_kv and embedding):
            return None
        key_length = self._metadata_int("attention.key_length") or embedding // n_head
        value_length = self._metadata_int("attention.value_length") or embedding // n_head
        per_layer = n_head_kv * (key_length * _KV_TYPE_BYTES[cache_types[0]] + value_length * _KV_TYPE_BYTES[cache_types[1]])
        return int(n_layer * per_layer)

    def _metadata_int(self, key: str) -> int | None:
        """An integer of the GGUF's metadata under the model's architecture (None: not there)."""
        buffer = ctypes.create_string_buffer(64)
        if llama.llama_model_meta_val_str(self.handle, b"general.architecture", buffer, len(buffer)) < 0:
            return None
        full = f"{buffer.value.decode()}.{key}".encode()
        if llama.llama_model_meta_val_str(self.handle, full, buffer, len(buffer)) < 0:
            return None
        try:
            return int(buffer.value.decode())
        except ValueError:
            return None

    @property
    def num_layers(self) -> int:
        """The model's layers, plus its output layer (what llama.cpp's -ngl counts)."""
        return llama.llama_model_n_layer(self.handle) + 1

    @property
    def device(self) -> str:
        """Where the model runs, as llama.cpp placed its layers: "CPU (AMD EPYC)", or the GPUs
        and how many layers each holds."""
        return describe_placement(self.layer_devices, device_descriptions())

    def close(self) -> None:
        if self.handle:
            llama.llama_model_free(self.handle)
            self.handle = None

    # --- text ------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Text -> tokens, with the model's BOS (unless add_special is false) and special tokens
        parsed (as llama-server does)."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama.llama_token * capacity)()
        count = llama.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, True)
        if count < 0:
            capacity = -count
            tokens = (llama.llama_token * capacity)()
            count = llama.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, True)
        if count < 0:
            raise BackendError("tokenization failed")
        return tokens[:count]
    def token_bytes(self, token: int) -> bytes:
        """The bytes a generated token stands for; special tokens render as nothing. Safe from
        any thread: each call that reaches llama.cpp writes into a buffer of its own (the call
        releases the GIL, so a shared buffer would hand one thread another's bytes), and a
        cached piece is only ever stored whole."""
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = _token_piece(self._vocab, token, render_special=False)
            self._piece_cache[token] = piece
        return piece

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama.llama_vocab_is_eog(self._vocab, token))

    def end_of_generation_tokens(self) -> list[int]:
        """Every end-of-generation token (EOS, EOT, ...): what ignore_eos forbids sampling."""
        if self._end_of_generation_tokens is None:
            self._end_of_generation_tokens = [
                token for token in range(self.n_vocab) if llama.llama_vocab_is_eog(self._vocab, token)]
        return self._end_of_generation_tokens

    def grammar_tokenizer(self):
        """llguidance's tokenizer over this vocabulary, for constrained requests: built at the
        first one (1.2 s on a 262k vocabulary, 0.3 s on a 49k one), then shared by every runner
        on the model. Every end-of-generation token ends a constrained document, as it ends
        generation."""
        with self._grammar_tokenizer_lock:
            if self._grammar_tokenizer is None:
                from llguidance import LLTokenizer

                tokenize = ctypes.cast(llama.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
                self._grammar_tokenizer = LLTokenizer.from_llamacpp(
                    tokens=_grammar_pieces(self._vocab, self.n_vocab), vocab_ptr=self._vocab,
                    tokenize_fptr=tokenize, eos_token=self.end_of_generation_tokens(), slices=None)
            return self._grammar_tokenizer

    @property
    def chat_template_source(self) -> str | None:
        """The Jinja text of the chat template (None for a llama.cpp built-in one): what tells
        which tool-call format the model writes."""
        return self.chat_template.jinja_source if self.chat_template is not None else None

    def render_chat(self, messages: tuple[dict, ...], tools: list[dict] | None = None,
                    options: dict | None = None) -> str:
        """Chat messages -> prompt text in the model's template, ending where the model speaks.
        With `tools` (OpenAI function specs), the Jinja template renders them itself: only a
        template that knows tools is given them (runner.tools.prompts decides). `options` are
        more names the Jinja template reads (enable_thinking, reasoning_effort); llama.cpp's
        built-in templates know none."""
        template = self.chat_template
        if template is None:
            raise BackendError("this model has no chat template; give a prompt instead of messages, or a chat "
                               "template (RunnerConfig.chat_template, batch-run --chat-template)")
        if tools is not None and template.jinja_source is not None:
            try:
                return self._jinja_renderer(template).render(messages, tools, options)
            except ValueError as error:
                raise BackendError(str(error)) from None
        if template.llama_name is not None:
            text = self._apply_llama_template(template.llama_name, messages)
            if text is not None:
                return text
        if template.jinja_source is None:
            raise BackendError(f"llama.cpp does not support the chat template {template.llama_name[:40]!r}")
        try:
            return self._jinja_renderer(template).render(messages, options=options)
        except ValueError as error:
            raise BackendError(str(error)) from None

    def _apply_llama_template(self, name: str, messages: tuple[dict, ...]) -> str | None:
        """llama.cpp's rendering with a built-in template; None when it does not know `name`."""
        encoded = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
        chat = (llama.llama_chat_message * len(encoded))(
            *(llama.llama_chat_message(role=role, content=content) for role, content in encoded))
        template = name.encode("utf-8")
        capacity = 2 * sum(len(role) + len(content) for role, content in encoded) + 256
        for _attempt in range(2):
            buffer = ctypes.create_string_buffer(capacity)
            length = llama.llama_chat_apply_template(template, chat, len(encoded), True, buffer, capacity)
            if length < 0:
                return None
            if length <= capacity:
                return buffer.raw[:length].decode("utf-8", "replace")
            capacity = length
        raise BackendError("the chat template output kept growing")

    def _jinja_renderer(self, template: ChatTemplate) -> JinjaRenderer:
        if self._jinja is None:
            self._jinja = JinjaRenderer(template.jinja_source, template.description,
                                        self._special_text(llama.llama_vocab_bos(self._vocab)),
                                        self._special_text(llama.llama_vocab_eos(self._vocab)), self.add_bos)
        return self._jinja

    def _special_text(self, token: int) -> str:
        """A special token's text (as templates write it), "" for none."""
        if token < 0:
            return ""
        return _token_piece(self._vocab, token, render_special=True).decode("utf-8", "replace")


def _token_piece(vocab, token: int, render_special: bool) -> bytes:
    """llama.cpp's text of one token, in a buffer of this call's own (grown when too small)."""
    buffer = ctypes.create_string_buffer(_PIECE_BUFFER_BYTES)
    length = llama.llama_token_to_piece(vocab, token, buffer, _PIECE_BUFFER_BYTES, 0, render_special)
    if length < 0:
        buffer = ctypes.create_string_buffer(-length)
        length = llama.llama_token_to_piece(vocab, token, buffer, -length, 0, render_special)
    return buffer.raw[:max(length, 0)]


def _grammar_pieces(vocab, n_vocab: int) -> list[bytes]:
    """Each token's bytes as llguidance's adapter for llama.cpp (llguidance.llamacpp) gives
    them to its tokenizer: special tokens rendered, and a control token, or a user-defined one
    written like one (<...>), marked with a leading 0xff. The adapter's own loop reads a
    token's attributes through a deprecated llama.cpp name, whose warning is raised and
    filtered once per token (and silencing it changes the process's warning filters while
    other threads run): this loop takes 0.4 s on a 262k vocabulary, the adapter's 0.6 s."""
    control, user_defined = llama.LLAMA_TOKEN_ATTR_CONTROL, llama.LLAMA_TOKEN_ATTR_USER_DEFINED
    pieces = []
    for token in range(n_vocab):
        piece = _token_piece(vocab, token, render_special=True)
        attributes = llama.llama_vocab_get_attr(vocab, token)
        if attributes & control or (attributes & user_defined and piece.startswith(b"<") and piece.endswith(b">")):
            piece = b"\xff" + piece
        pieces.append(piece)
    return pieces


def _load_user_template(value: str) -> ChatTemplate:
    try:
        return load_chat_template(value, builtin_chat_templates())
    except ValueError as error:
        raise BackendError(str(error)) from None


def _rows_in_entry_order(entries: list[BatchEntry], chunk_rows: np.ndarray, token_rows: np.ndarray) -> np.ndarray:
    """One step's output rows from two decodes (its prompt chunks', its decoding tokens'), in
    the order of the entries."""
    rows = np.empty((chunk_rows.shape[0] + token_rows.shape[0], chunk_rows.shape[1]), dtype=np.float32)
    row = chunk_row = token_row = 0
    for entry in entries:
        count = entry.num_outputs
        if entry.is_prompt_chunk:
            rows[row:row + count] = chunk_rows[chunk_row:chunk_row + count]
            chunk_row += count
        else:
            rows[row:row + count] = token_rows[token_row:token_row + count]
            token_row += count
        row += count
    return rows


class LlamaBackend:
    """One llama.cpp context with `num_slots` sequences on a model, driven a step at a time."""

    def __init__(self, model: LlamaModel, num_slots: int, slot_ctx: int, n_batch: int, threads: int,
                 owns_model: bool = False, swa_full: bool = True, batch_invariant: bool = False,
                 flash_attn: str = "auto", cache_types: tuple[str, str] = ("f16", "f16"),
                 pool_tokens: int | None = None) -> None:
        if batch_invariant and model.repack_weights:
            raise BackendError("batch_invariant needs the model loaded with repack_weights=False "
                               "(repacked weights compute a token differently by its place in the batch)")
        self.model = model
        self.num_slots = num_slots
        self.n_batch = n_batch
        self._owns_model = owns_model
        self.cache_types = cache_types  # (K, V): the KV cache's element types
        self._ctx = self._new_context(num_slots, slot_ctx, n_batch, threads, swa_full, batch_invariant,
                                      str(getattr(flash_attn, "value", flash_attn)), pool_tokens)
        # Where llama.cpp's CPU kernels change with the shape of a micro-batch: flash attention
        # computes a sequence's rows in tiles once it has 64 of them, and one by one below that;
        # without it, only a sequence's lone row is computed differently. Matrix products with
        # repacked weights take tokens four at a time, the last ones of a batch one by one.
        # A chunk needs one row more than a tile: llama.cpp's split_equal joins consecutive slots
        # into one micro-batch, so a chunk beside a decoding slot gives its first token to the
        # decode micro-batch, and 64 rows left would fall to 63, computed one by one (at a
        # 440-token context that costs 4.9 instead of 3.7 ms a token, measured).
        # Reused prefixes follow the rules only in batch-invariant mode, where outputs must not
        # depend on what was reused. Elsewhere they already depend on the batch's shape, and
        # leaving 65 tokens to compute after every reused prefix cost 4x the prompt tokens on
        # short chats sharing a system prompt (1,829 computed against llama-server's 459).
        self.chunk_rules = ChunkRules(min_tokens=2 if batch_invariant else _UNTILED_ROWS_BELOW + 1,
                                      alignment=_TOKENS_PER_PRODUCT_GROUP, exact_reuse=batch_invariant)
        self._memory = llama.llama_get_memory(self._ctx)
        self._n_swa = max(0, llama.llama_model_n_swa(model.handle))  # 0: no sliding-window attention
        self.n_vocab = model.n_vocab
        self.add_bos = model.add_bos
        # llama.cpp rounds each slot's window (or the pool) up to a multiple of 256; the runner
        # enforces the size that was asked for, so a run behaves the same whatever the rounding.
        self.allocated_window = llama.llama_n_ctx_seq(self._ctx)
        self.window = min(slot_ctx, self.allocated_window, pool_tokens or self.allocated_window)
        # The cells the slots share (None: a window each): what admission counts against.
        self.pool_size = min(pool_tokens, llama.llama_n_ctx(self._ctx)) if pool_tokens else None
        self.device = model.device
        self.can_shift = bool(llama.llama_memory_can_shift(self._memory))
        self._batch = _BatchBuffers(n_batch)
        self.graph_sampling = _SlotChains(self._ctx, self._batch, model.n_vocab)
        self.last_decode_seconds = 0.0  # the llama_decode call alone, without filling the batch
        # Text work needs only the model; the runner reaches it through the backend.
        self.tokenize = model.tokenize
        self.token_bytes = model.token_bytes
        self.is_end_of_generation = model.is_end_of_generation
        self.end_of_generation_tokens = model.end_of_generation_tokens
        self.render_chat = model.render_chat
        self.chat_template_source = model.chat_template_source
        self.grammar_tokenizer = model.grammar_tokenizer

    def _new_context(self, num_slots: int, slot_ctx: int, n_batch: int, threads: int, swa_full: bool,
                     batch_invariant: bool, flash_attn: str, pool_tokens: int | None):
        """The context, its parameters kept as context_params, and whether llama.cpp runs
        flash attention in it (as it reports: "auto" is settled when the context is made)."""
        params = llama.llama_context_default_params()
        # llama.cpp's default lets flash attention decide per micro-batch shape which kernels
        # run, so a sequence's numbers depend on what shares its batch. Without it, they do not.
        params.flash_attn_type = _FLASH_ATTENTION["off" if batch_invariant else flash_attn]
        # A full-size sliding-window cache (llama.cpp's default) never drops a slot's first
        # positions, so every prefix a slot held stays reusable; a smaller one saves memory.
        params.swa_full = swa_full
        params.n_ctx = pool_tokens or num_slots * slot_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = num_slots
        # One stream per slot: attention never scans another slot's cells. One pool: cells are
        # shared (and a slot may take what others leave), and a step's sequences attend over the
        # used cells with the others masked.
        params.kv_unified = pool_tokens is not None
        params.type_k, params.type_v = (_KV_TYPES[name] for name in self.cache_types)
        params.n_threads = threads
        params.n_threads_batch = threads
        self.context_params = params
        with _capturing_llama_log() as log:
            ctx = llama.llama_init_from_model(self.model.handle, params)
        if not ctx:
            cause = f": {log.errors[0]}" if log.errors else ""
            size = f"a pool of {pool_tokens}" if pool_tokens else f"{num_slots} x {slot_ctx}"
            raise BackendError(f"llama.cpp could not create a context of {size} tokens{cause}")
        self.flash_attention = _flash_attention_used(log.lines)
        return ctx

    def close(self) -> None:
        if self._ctx:
            self.graph_sampling.close()
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._owns_model:
            self.model.close()

    # --- the step --------------------------------------------------------------------------

    def decode(self, entries: list[BatchEntry]) -> np.ndarray:
        """The step's llama_decode; the logits rows of the entries that want output, in entry
        order, as a (rows, n_vocab) array valid until the next decode. A row whose slot has a
        sampler chain holds no logits when no row beside it needed them (its token is in
        graph_sampling.sampled_tokens).

        In a pool, prompt chunks beside decoding tokens go in a llama_decode of their own, as
        llama.cpp's split does between KV windows: in one micro-batch the chunk's rows share
        flash attention's tiles with the other sequences' rows, so few blocks of cells are
        masked for the whole tile and skipped (SmolLM2, 3 decoding tokens beside a 96-token
        chunk: 457 against 360 ms as two calls, 290 with windows)."""
        chunks = [] if self.pool_size is None else [entry for entry in entries if entry.is_prompt_chunk]
        if not chunks or len(chunks) == len(entries) or self.graph_sampling.has_chains:
            rows = self._decode_once(entries)
            return rows if rows is not None else np.empty((0, self.n_vocab), dtype=np.float32)
        chunk_rows = self._decode_once(chunks)
        chunk_rows = None if chunk_rows is None else chunk_rows.copy()  # the next decode overwrites them
        seconds = self.last_decode_seconds
        tokens = [entry for entry in entries if not entry.is_prompt_chunk]
        try:
            token_rows = self._decode_once(tokens)
        except (NoKvSlot, BackendError):
            # As a single llama_decode that found no room: nothing of the step stays in the KV
            # (the engine retries it with smaller prompt chunks, or sequence by sequence).
            for entry in chunks:
                self._cut_back(entry.slot, entry.start_pos)
            raise
        self.last_decode_seconds += seconds
        if chunk_rows is None:
            return token_rows
        return _rows_in_entry_order(entries, chunk_rows, token_rows)

    def _decode_once(self, entries: list[BatchEntry]) -> np.ndarray | None:
        """One llama_decode; the output rows as a view into llama.cpp's logits (None: none)."""
        num_outputs = self._batch.fill(entries)
        started = time.perf_counter()
        code = llama.llama_decode(self._ctx, self._batch.batch)
        self.last_decode_seconds = time.perf_counter() - started
        if code == _DECODE_NO_KV_SLOT:
            raise NoKvSlot("llama_decode found no KV slot for the batch")
        if code != 0:
            raise BackendError(f"llama_decode failed with code {code}")
        if num_outputs == 0:
            return None
        pointer = llama.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(num_outputs, self.n_vocab))

    # --- KV of one slot --------------------------------------------------------------------

    def clear_slot(self, slot: int) -> None:
        llama.llama_memory_seq_rm(self._memory, slot, -1, -1)

    def reuse_prefix(self, slot: int, source_slot: int, length: int) -> bool:
        """Make the slot's KV hold positions [0, length) of the source slot's.

        In one pool the slot is given the source's cells for those positions (they are shared,
        at once, no data copied). Between two KV streams llama.cpp copies only whole streams (a
        partial range aborts the process), so the whole stream is copied and then cut back to
        the prefix; that copy is queued and done at the start of the next llama_decode, before
        that decode writes anything. False (and the slot cleared) when the prefix is not intact."""
        if source_slot != slot and self.pool_size is not None:
            self.clear_slot(slot)
            if length > 0:
                llama.llama_memory_seq_cp(self._memory, source_slot, slot, 0, length)
        elif source_slot != slot:
            llama.llama_memory_seq_cp(self._memory, source_slot, slot, -1, -1)
        return self._cut_back(slot, length)

    def undo_failed_decode(self, slot: int, start_pos: int) -> bool:
        return self._cut_back(slot, start_pos)

    def rewind_slot(self, slot: int, length: int) -> bool:
        return self._cut_back(slot, length)

    def save_slot(self, slot: int) -> SlotState | None:
        """The slot's KV state (llama_state_seq_get_data), to restore later; None on failure.
        The buffer is left unfilled until llama.cpp writes it, without the GIL: zero-filling
        a bytearray of a 2,000-token SmolLM2 state (41 MB) held the GIL for 23 ms, a pause in
        every other thread (the server's event loop among them)."""
        size = llama.llama_state_seq_get_size_ext(self._ctx, slot, _STATE_FLAGS)
        state = _mapped_bytes(size)
        written = llama.llama_state_seq_get_data_ext(self._ctx, (ctypes.c_uint8 * size).from_buffer(state), size,
                                                     slot, _STATE_FLAGS)
        return state if size and written == size else None

    def restore_slot(self, slot: int, state: SlotState, length: int) -> bool:
        """Put a saved state into the slot (llama.cpp clears it first, and writes at once, not
        at the next decode), cut back to positions [0, length). False (and the slot cleared)
        when it does not load or the prefix is not intact."""
        read = llama.llama_state_seq_set_data_ext(self._ctx, (ctypes.c_uint8 * len(state)).from_buffer(state),
                                                  len(state), slot, _STATE_FLAGS)
        if read != len(state):
            self.clear_slot(slot)
            return False
        return self._cut_back(slot, length)

    def _cut_back(self, slot: int, length: int) -> bool:
        """Keep positions [0, length) of the slot; whether what the next tokens need is there.

        A sliding-window cache keeps (and saves) only the cells inside its window, and
        llama_memory_seq_pos_min reports that cache's first position: tokens from `length` on
        attend to the window before it, so those n_swa positions must be there (all positions
        for a model without one). Otherwise the slot is cleared and False returned."""
        removed = llama.llama_memory_seq_rm(self._memory, slot, length, -1)
        if length == 0:
            return True
        needed_from = max(0, length - self._n_swa) if self._n_swa else 0
        intact = (removed and 0 <= llama.llama_memory_seq_pos_min(self._memory, slot) <= needed_from
                  and llama.llama_memory_seq_pos_max(self._memory, slot) == length - 1)
        if not intact:
            self.clear_slot(slot)
        return intact

    def shift_slot(self, slot: int, keep: int, discard: int, n_past: int) -> None:
        """Drop positions [keep, keep+discard) and move the rest back by `discard`."""
        llama.llama_memory_seq_rm(self._memory, slot, keep, keep + discard)
        llama.llama_memory_seq_add(self._memory, slot, keep + discard, n_past, -discard)

    def slot_pos_max(self, slot: int) -> int:
        """The largest position in the slot's KV, -1 when empty."""
        return llama.llama_memory_seq_pos_max(self._memory, slot)

    def slot_pos_min(self, slot: int) -> int:
        """The smallest position in the slot's KV, -1 when empty."""
        return llama.llama_memory_seq_pos_min(self._memory, slot)


# --- where things run --------------------------------------------------------------------------

def _flash_attention_used(lines: list[str]) -> str:
    """"enabled" or "disabled", as llama.cpp reported it while making a context: what was asked,
    or what "auto" became."""
    asked = resolved = None
    for line in lines:
        if match := _FLASH_ATTENTION_ASKED.search(line):
            asked = match.group(1)
        elif match := _FLASH_ATTENTION_RESOLVED.search(line):
            resolved = "enabled" if match.group(1) == "enabled" else "disabled"
    return resolved or asked or "unknown"


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build has a GPU backend (CUDA, Metal, Vulkan, ...)."""
    return bool(llama.llama_supports_gpu_offload())


def _note_no_gpu(n_gpu_layers: int) -> None:
    """Say once per process that GPU layers were asked of a build without a GPU backend."""
    global _no_gpu_noted
    if not _no_gpu_noted:
        _no_gpu_noted = True
        notices.warning(f"no GPU backend in this llama.cpp build (CPU only): n_gpu_layers {n_gpu_layers} (-ngl) has "
                        f"no effect, the model runs on the CPU; `multiseq info` shows the build, and the README's "
                        f"GPU section how to install one with a GPU backend")


def describe_placement(layer_devices: dict[str, int], descriptions: dict[str, str]) -> str:
    """A model's place in words: "CPU (AMD EPYC)" when every layer is on the CPU, else each
    device with its share of the layers, GPUs first: "CUDA0 (NVIDIA L4) 31/31 layers"."""
    total = sum(layer_devices.values())
    if not total:
        return "unknown"

    def named(device: str) -> str:
        description = descriptions.get(device)
        return f"{device} ({description})" if description and description != device else device

    if set(layer_devices) == {"CPU"}:
        return named("CPU")
    order = sorted(layer_devices, key=lambda device: (device == "CPU", device))
    return ", ".join(f"{named(device)} {layer_devices[device]}/{total} layers" for device in order)


@dataclass(frozen=True)
class Device:
    """A device ggml sees: its name (CPU, CUDA0, Metal, Vulkan0, ...), description, kind, memory."""

    name: str
    description: str
    kind: str  # "CPU", "GPU", "integrated GPU", "accelerator" or "meta"
    memory_free_bytes: int
    memory_total_bytes: int


_DEVICE_KINDS = ("CPU", "GPU", "integrated GPU", "accelerator", "meta")  # ggml_backend_dev_type's order
_ggml_library = None


def _ggml():
    """ggml's device registry (ggml-backend.h), which llama-cpp-python loads but does not bind:
    bound here, on the library llama_cpp loaded. None when it cannot be found."""
    global _ggml_library
    if _ggml_library is None:
        try:
            from llama_cpp import _ggml as ggml_module

            library = ctypes.CDLL(ggml_module.libggml._name)
            library.ggml_backend_reg_count.restype = ctypes.c_size_t
            library.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
            library.ggml_backend_reg_get.restype = ctypes.c_void_p
            library.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
            library.ggml_backend_reg_name.restype = ctypes.c_char_p
            library.ggml_backend_dev_count.restype = ctypes.c_size_t
            library.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
            library.ggml_backend_dev_get.restype = ctypes.c_void_p
            for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
                getattr(library, name).argtypes = [ctypes.c_void_p]
                getattr(library, name).restype = ctypes.c_char_p
            library.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
            library.ggml_backend_dev_type.restype = ctypes.c_int
            library.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                        ctypes.POINTER(ctypes.c_size_t)]
            library.ggml_backend_dev_memory.restype = None
        except (ImportError, AttributeError, OSError):
            return None
        _ggml_library = library
    return _ggml_library


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def backends() -> list[str]:
    """The ggml backends this build registered (CPU, CUDA, Metal, Vulkan, BLAS, ...)."""
    _init_llama_once()
    library = _ggml()
    if library is None:
        return []
    return [_text(library.ggml_backend_reg_name(library.ggml_backend_reg_get(index)))
            for index in range(library.ggml_backend_reg_count())]


def devices() -> list[Device]:
    """Every device the build's backends see, with its memory (free and total)."""
    _init_llama_once()
    library = _ggml()
    if library is None:
        return []
    found = []
    for index in range(library.ggml_backend_dev_count()):
        device = library.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        library.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        kind = library.ggml_backend_dev_type(device)
        found.append(Device(_text(library.ggml_backend_dev_name(device)),
                            _text(library.ggml_backend_dev_description(device)),
                            _DEVICE_KINDS[kind] if 0 <= kind < len(_DEVICE_KINDS) else str(kind),
                            free.value, total.value))
    return found


def free_memory_for_kv(model: LlamaModel) -> int | None:
    """Bytes free where the model's KV goes: the GPUs that hold its layers (their free memory,
    together), else host memory."""
    from .kvsizing import free_host_memory

    gpus = [device for device in devices() if device.name in model.layer_devices and device.kind != "CPU"]
    if gpus:
        return sum(device.memory_free_bytes for device in gpus)
    return free_host_memory()


def device_descriptions() -> dict[str, str]:
    return {device.name: device.description for device in devices()}


@dataclass(frozen=True)
class LlamaBuild:
    """What the llama.cpp under multiseq was built with, and what it sees on this machine."""

    llama_cpp_python: str  # the version of llama-cpp-python, which pins llama.cpp's sources
    gpu_offload: bool  # whether a GPU backend is present
    max_devices: int
    supports_mmap: bool
    supports_mlock: bool
    backends: list[str]
    devices: list[Device]
    cpu_features: list[str]  # the CPU features the build uses (AVX2, NEON, ...), from system_info
    system_info: str  # llama_print_system_info(), as llama.cpp prints it


def _system_info_sections(text: str) -> dict[str, dict[str, str]]:
    """llama_print_system_info()'s "CPU : SSE3 = 1 | AVX = 1 | CUDA : ARCHS = 890 | ..." as
    {"CPU": {"SSE3": "1", "AVX": "1"}, "CUDA": {"ARCHS": "890"}}."""
    sections: dict[str, dict[str, str]] = {}
    current = sections.setdefault("", {})
    for part in text.split("|"):
        if " : " in part:
            section, part = part.split(" : ", 1)
            current = sections.setdefault(section.strip(), {})
        name, equals, value = part.partition("=")
        if equals:
            current[name.strip()] = value.strip()
    return sections


def llama_build() -> LlamaBuild:
    _init_llama_once()
    system_info = _text(llama.llama_print_system_info()).strip()
    features = [name for name, value in _system_info_sections(system_info).get("CPU", {}).items() if value == "1"]
    return LlamaBuild(llama_cpp_python=llama.__version__, gpu_offload=gpu_offload_supported(),
                      max_devices=int(llama.llama_max_devices()), supports_mmap=bool(llama.llama_supports_mmap()),
                      supports_mlock=bool(llama.llama_supports_mlock()), backends=backends(), devices=devices(),
                      cpu_features=features, system_info=system_info)


def _mapped_bytes(size: int) -> np.ndarray:
    """A writable byte array in pages of its own (an anonymous mmap), given back to the system
    when the array goes: the RAM tier saves and evicts states of tens of megabytes all the time,
    and from malloc's heap their freed memory stayed in the process (bench/soak.py: RSS beside a
    full --cache-ram grew by 1.2 GiB in ten minutes)."""
    return np.frombuffer(mmap.mmap(-1, max(size, 1)), dtype=np.uint8)[:size]
