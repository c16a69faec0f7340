"""The only module that imports llama_cpp: it loads llama.cpp, and makes models and contexts on it.

One llama.cpp context holds `num_slots` sequences (n_seq_max), either with one KV stream each
(kv_unified off: each slot owns a window of llama_n_ctx_seq() positions) or in one pool of cells
the slots share (kv_unified on: a slot may grow to the whole pool, and a prefix copied between
slots is the same cells, not a copy). The batch is a llama_batch whose arrays are numpy buffers
owned here, filled with slice assignments.

The parts beside it import nothing of llama_cpp; those that call llama.cpp are handed the
library by this module: llama_log (llama.cpp's log, captured and read), llama_devices (the
devices and the build, as plain values), llama_batch (the batch's arrays, the output rows, the
chunk rules), llama_kv (KV types, each slot's KV), llama_chains (sampler chains in the graph),
llama_text (tokens and text, chat templates rendered).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Sequence
from functools import partial

import numpy as np

# llama.cpp's CPU threads are OpenMP threads, and libgomp keeps them spinning (300,000 turns by
# default) after each decode returns: on the cores where the host then samples the step's rows.
# With a short spin they sleep at once: the decode took as long (49.4 against 50.1 ms, Gemma 3
# 270M, 16 slots, 2 cores) and sampling on two threads 1.25 instead of 2.0 ms. libgomp reads it
# when it loads, with llama_cpp just below; a value the user set is kept.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
import llama_cpp as llama  # noqa: E402
import llama_cpp.mtmd_cpp as mtmd  # noqa: E402

from .batch import BatchEntry
from .chat_template import ChatTemplate, JinjaRenderer
from ..errors import BackendError, NoKvSlot
from .batch_arrays import BatchArrays, chunk_rules_for, rows_in_entry_order
from .chains import SlotChains
from .embeddings import POOLING_NAMES, EmbeddingOutput
from .facts import read_model_facts
from .adapters import AdapterSets, load_adapter
from .devices import Platform, describe_placement, extra_layouts_are_safe, note_no_gpu, note_weights_not_repacked
from .kv import KV_TYPES, SlotKv, kv_bytes_per_token
from .layout import moved_states, put_back
from .media import MediaDecoder, MediaPrompt, Projector, is_placeholder
from .rerank import RerankLayout, rerank_template
from .log import capturing_llama_log, flash_attention_used, forward_llama_log, layer_devices
from .text import GrammarTokenizers, Vocabulary, apply_builtin_template, load_user_template, render_chat

# not a child of multiseq.llama (llama.cpp's own log, which the CLI quiets below errors)
notices = logging.getLogger("multiseq.backend")  # multiseq's own notices about llama.cpp

_init_lock = threading.Lock()
_log_callback = None  # kept referenced: llama.cpp calls it for the life of the process
_DECODE_NO_KV_SLOT = 1

_SPLIT_MODES = {"none": llama.LLAMA_SPLIT_MODE_NONE, "layer": llama.LLAMA_SPLIT_MODE_LAYER,
                "row": llama.LLAMA_SPLIT_MODE_ROW, "tensor": llama.LLAMA_SPLIT_MODE_TENSOR}
_FLASH_ATTENTION = {"on": llama.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": llama.LLAMA_FLASH_ATTN_TYPE_DISABLED,
                    "auto": llama.LLAMA_FLASH_ATTN_TYPE_AUTO}


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
            _log_callback = llama.llama_log_callback(forward_llama_log)
            llama.llama_log_set(_log_callback, None)
            mtmd.mtmd_log_set(_log_callback, None)  # the multimodal library's log, as llama.cpp's
            mtmd.mtmd_helper_log_set(_log_callback, None)
            llama.llama_backend_init()


class _BatchBuffers(BatchArrays):
    """A llama_batch whose arrays are the numpy buffers of BatchArrays."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
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
        """Write the entries into the batch; return the number of output rows requested."""
        num_outputs = super().fill(entries)
        self.batch.n_tokens = self.num_tokens
        return num_outputs


class LlamaModel:
    """A loaded GGUF: weights, vocabulary, chat template. Contexts are created on it."""

    def __init__(self, model_path: str, chat_template: str | None = None,
                 chat_template_fallback: str | None = None, repack_weights: bool = True,
                 n_gpu_layers: int | None = None, main_gpu: int = 0, split_mode: str = "layer",
                 tensor_split: Sequence[float] | None = None, vocab_only: bool = False) -> None:
        _init_llama_once()
        # A template the user gave is checked before the (slower) load.
        chosen = load_user_template(chat_template, builtin_chat_templates()) if chat_template else None
        self.params = self._model_params(repack_weights, n_gpu_layers, main_gpu, split_mode, tensor_split)
        self.params.vocab_only = vocab_only  # the vocabulary and metadata alone: no weights, no context
        self.repack_weights = repack_weights
        if n_gpu_layers and not gpu_offload_supported():
            note_no_gpu(n_gpu_layers)
        with capturing_llama_log() as log:
            self.handle = llama.llama_model_load_from_file(str(model_path).encode(), self.params)
        if not self.handle:
            cause = f": {log.errors[0]}" if log.errors else ""
            raise BackendError(f"llama.cpp could not load the model file {model_path}{cause}")
        if repack_weights and not self.params.use_extra_bufts:
            note_weights_not_repacked()
        self.layer_devices: dict[str, int] = layer_devices(log.lines)
        self.path = str(model_path)
        self.facts = read_model_facts(llama, self.handle, self.path)  # what model lists say of it
        self._vocab = llama.llama_model_get_vocab(self.handle)
        self._vocabulary = vocabulary = Vocabulary(llama, self._vocab)
        self.n_vocab = vocabulary.n_vocab
        self.add_bos = vocabulary.add_bos
        embedded = llama.llama_model_chat_template(self.handle, None)
        # An explicit template wins; then the GGUF's own; then the registry's fallback, for
        # GGUFs without one (llama.cpp would otherwise pick chatml, wrong for Gemma).
        if chosen is None and embedded:
            chosen = ChatTemplate.embedded(embedded.decode("utf-8", "replace"))
        if chosen is None and chat_template_fallback:
            chosen = load_user_template(chat_template_fallback, builtin_chat_templates())
        self.chat_template = chosen
        self._jinja: JinjaRenderer | None = None
        self.projector: Projector | None = None  # load_projector: what reads its images or audio
        self._adapters: dict[str, object] = {}  # LoRA adapters by file, freed with the model
        self.found_projector: str | None = None  # one found beside it (a Hugging Face repository's)
        # Text work needs only the vocabulary (Vocabulary's methods say what each does).
        self.tokenize = vocabulary.tokenize
        self.token_bytes = vocabulary.token_bytes
        self.is_end_of_generation = vocabulary.is_end_of_generation
        self.end_of_generation_tokens = vocabulary.end_of_generation_tokens
        self.grammar_tokenizer = vocabulary.grammar_tokenizer if vocab_only else partial(grammar_tokenizers.of, self.path)
        self.bos_and_eos_texts = vocabulary.bos_and_eos_texts
        self.fim_tokens = vocabulary.fim_tokens
        self.rerank_tokens = RerankLayout(llama, self._vocab, vocabulary.tokenize,
                                          rerank_template(llama, self.handle)).tokens
        self.bos_token = vocabulary.bos
        self.render_tokens = vocabulary.render

    def _model_params(self, repack_weights: bool, n_gpu_layers: int | None, main_gpu: int, split_mode: str,
                      tensor_split: Sequence[float] | None):
        """llama.cpp's model parameters; kept on the model (with the array tensor_split points
        to), so that what was passed can be read back."""
        params = llama.llama_model_default_params()
        # llama.cpp repacks some weight types for faster matrix products, which then take a
        # batch's tokens four at a time and its last ones one by one, with other rounding: a
        # token's numbers would depend on how many tokens share its micro-batch.
        params.use_extra_bufts = repack_weights and extra_layouts_are_safe(_platform.cpu_extra_buffer_types())
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
        GGUF's metadata (see multiseq.llama.kv.kv_bytes_per_token); None when it does not say."""
        return kv_bytes_per_token(self._metadata_int, cache_types)

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
    def pooling(self) -> str | None:
        """How the GGUF says to pool its embeddings (mean, cls, last, rank; None: it does not)."""
        return POOLING_NAMES.get(self._metadata_int("pooling_type"))

    @property
    def num_layers(self) -> int:
        """The model's layers, plus its output layer (what llama.cpp's -ngl counts)."""
        return llama.llama_model_n_layer(self.handle) + 1

    @property
    def device(self) -> str:
        """Where the model runs, as llama.cpp placed its layers: "CPU (AMD EPYC)", or the GPUs
        and how many layers each holds."""
        return describe_placement(self.layer_devices, device_descriptions())

    def load_projector(self, path: str, threads: int, flash_attn: str = "auto") -> None:
        """Read a projector GGUF (--mmproj) for this model: its prompts may hold images or audio."""
        self.projector = Projector(llama, mtmd, self.handle, path, threads, gpu_offload_supported(),
                                   _FLASH_ATTENTION[flash_attn])

    def adapter(self, path: str):
        """The LoRA adapter in `path`, loaded for this model once (BackendError when it does not go)."""
        if path not in self._adapters:
            self._adapters[path] = load_adapter(llama, self.handle, path)
        return self._adapters[path]

    def tokenize_media(self, texts: list[str], media: list[bytes]) -> MediaPrompt:
        """Texts with media between them as tokens (see multiseq.llama.media)."""
        if self.projector is None:
            raise ValueError("the model reads text only: give it a projector (--mmproj) to read images or audio")
        return self.projector.tokenize(texts, media)

    def close(self) -> None:
        if self.projector is not None:
            self.projector.close()
        if self.handle:
            llama.llama_model_free(self.handle)
            self.handle = None

    @property
    def chat_template_source(self) -> str | None:
        """The Jinja text of the chat template (None for a llama.cpp built-in one): what tells
        which tool-call format the model writes."""
        return self.chat_template.jinja_source if self.chat_template is not None else None

    def render_chat(self, messages: Sequence[dict], tools: list[dict] | None = None, options: dict | None = None,
                    **shaping) -> str:
        """Chat messages -> prompt text in the model's template, as llama-server renders it:
        `tools` (OpenAI function specs), `options` (chat_template_kwargs) and `shaping` as
        JinjaRenderer.render takes them (a built-in template reads none of them)."""
        return render_chat(self.chat_template, messages, tools, options,
                           lambda name, chat: apply_builtin_template(llama, name, chat), self._jinja_renderer,
                           **shaping)

    def _jinja_renderer(self, template: ChatTemplate) -> JinjaRenderer:
        if self._jinja is None:
            bos_text, eos_text = self._vocabulary.bos_and_eos_texts()
            self._jinja = JinjaRenderer(template.jinja_source, template.description, bos_text, eos_text, self.add_bos,
                                        self._vocabulary.add_eos)
        return self._jinja


class LlamaBackend:
    """One llama.cpp context with `num_slots` sequences on a model, driven a step at a time."""

    def __init__(self, model: LlamaModel, num_slots: int, slot_ctx: int, n_batch: int, threads: int,
                 owns_model: bool = False, swa_full: bool = True, batch_invariant: bool = False,
                 flash_attn: str = "auto", cache_types: tuple[str, str] = ("f16", "f16"),
                 pool_tokens: int | None = None, windows_while_they_fit: bool = False, ranks: bool = False,
                 adapters: Sequence[tuple[str, float]] = (), named_adapters: Sequence[tuple[str, float]] = ()) -> None:
        if batch_invariant and model.repack_weights:
            raise BackendError("batch_invariant needs the model loaded with repack_weights=False "
                               "(repacked weights compute a token differently by its place in the batch)")
        self.model, self.num_slots, self.n_batch = model, num_slots, n_batch
        self.ranks, self._owns_model = ranks, owns_model  # ranks: a reranker's context (llama/embeddings)
        self.cache_types = cache_types  # (K, V): the KV cache's element types
        # LoRA adapters (file, scale): on every sequence, and one of `named` on a step's (llama/adapters)
        self.adapter_sets = AdapterSets(llama, model.adapter, adapters, named_adapters)
        # A pool held in a window per slot while every slot fits its window (windows_while_they_fit):
        # the engine counts one pool of cells either way; relayout changes what llama.cpp holds.
        self.pooled = pool_tokens is not None and not windows_while_they_fit
        self._context_args = (num_slots, slot_ctx, n_batch, threads, swa_full, batch_invariant,
                              str(getattr(flash_attn, "value", flash_attn)), pool_tokens)
        self._ctx = self._new_context(*self._context_args, pooled=self.pooled)
        self.chunk_rules = chunk_rules_for(batch_invariant)
        self.n_vocab, self.add_bos = model.n_vocab, model.add_bos
        # llama.cpp rounds each slot's window (or the pool) up to a multiple of 256; the runner
        # enforces the size that was asked for, so a run behaves the same whatever the rounding.
        self.allocated_window = llama.llama_n_ctx(self._ctx) if pool_tokens else llama.llama_n_ctx_seq(self._ctx)
        self.window = min(slot_ctx, self.allocated_window, pool_tokens or self.allocated_window)
        # The window each slot has while the pool is held in windows; None: the layout is fixed.
        self.layout_window = llama.llama_n_ctx_seq(self._ctx) if pool_tokens and not self.pooled else None
        # The cells the slots share (None: a window each): what admission counts against.
        self.pool_size = min(pool_tokens, llama.llama_n_ctx(self._ctx)) if pool_tokens else None
        self.device = model.device
        n_swa = max(0, llama.llama_model_n_swa(model.handle))  # 0: no sliding-window attention
        self.slot_kv = SlotKv(llama, self._ctx, self.pooled, n_swa, num_slots)
        self.can_shift = self.slot_kv.can_shift
        self._batch = _BatchBuffers(n_batch)
        projector = model.projector
        self.media = MediaDecoder(llama, mtmd, projector, n_batch) if projector is not None else None
        if projector is not None and projector.uses_mrope:  # an image takes fewer positions than tokens
            self.slot_kv.stretches, self._batch.position_of = True, self.slot_kv.positions.position
        self.modalities = {"vision": bool(projector and projector.reads_images),
                           "audio": bool(projector and projector.reads_audio)}
        self.graph_sampling = SlotChains(llama, self._ctx, self._batch, model.n_vocab)
        self.n_embd = llama.llama_model_n_embd_out(model.handle)
        self.embedding_output = EmbeddingOutput(llama, self.n_embd, llama.llama_model_n_cls_out(model.handle)
                                                if ranks else None)
        # An input is pooled whole in one decode where llama.cpp pools it (a reranker), or where
        # every token's row depends on the tokens after it (bidirectional attention: a BERT).
        self.embeds_whole = ranks or not llama.llama_get_causal_attn(self._ctx)
        self.last_embeddings: dict = {}
        self.last_decode_seconds = 0.0  # the llama_decode call alone, without filling the batch
        # Text work needs only the model; the runner reaches it through the backend.
        for name in ("tokenize", "token_bytes", "is_end_of_generation", "end_of_generation_tokens", "render_chat",
                     "chat_template_source", "grammar_tokenizer", "bos_and_eos_texts", "fim_tokens", "rerank_tokens",
                     "bos_token", "render_tokens", "tokenize_media", "facts"):
            setattr(self, name, getattr(model, name))
        self.model_pooling, self.kv_bytes_per_token = model.pooling, model.kv_bytes_per_token(cache_types)
        self.use_adapter_set = self.adapter_sets.use  # the adapter set of the steps from now on
        # The KV of one slot (SlotKv's methods say what each does), for the engine.
        for name in ("clear_slot", "reuse_prefix", "undo_failed_decode", "rewind_slot", "save_slot", "restore_slot",
                     "shift_slot", "slot_pos_max", "slot_pos_min"):
            setattr(self, name, getattr(self.slot_kv, name))

    def _new_context(self, num_slots: int, slot_ctx: int, n_batch: int, threads: int, swa_full: bool,
                     batch_invariant: bool, flash_attn: str, pool_tokens: int | None, pooled: bool):
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
        if self.ranks:  # llama.cpp pools each input and applies the classifier head (llama/embeddings)
            params.pooling_type, params.embeddings = llama.LLAMA_POOLING_TYPE_RANK, True
        elif self.model.pooling not in (None, "none"):  # (a model that says none is left so: llama.cpp warns)
            # Embedding rows per token, pooled by the engine over a prompt's chunks (llama/embeddings).
            params.pooling_type = llama.LLAMA_POOLING_TYPE_NONE
        # One stream per slot: attention never scans another slot's cells. One pool: cells are
        # shared (and a slot may take what others leave), and a step's sequences attend over the
        # used cells with the others masked.
        params.kv_unified = pooled
        params.type_k, params.type_v = (KV_TYPES[name] for name in self.cache_types)
        params.n_threads = threads
        params.n_threads_batch = threads
        self.context_params = params
        with capturing_llama_log() as log:
            ctx = llama.llama_init_from_model(self.model.handle, params)
        if not ctx:
            cause = f": {log.errors[0]}" if log.errors else ""
            size = f"a pool of {pool_tokens}" if pool_tokens else f"{num_slots} x {slot_ctx}"
            raise BackendError(f"llama.cpp could not create a context of {size} tokens{cause}")
        self.flash_attention = flash_attention_used(log.lines)
        self.adapter_sets.bind(ctx)
        return ctx

    def relayout(self, pooled: bool, shares: dict[int, tuple[int, int]]) -> None:
        """Hold the slots in one pool (pooled) or in a window each from now on: every slot's KV
        is moved into a new context of the same size. `shares` (slot -> (source slot, length)):
        into a pool, the slot takes the source's cells for its first `length` positions instead
        of bringing copies (the engine's ledger counts them once)."""
        if pooled == self.pooled:
            return
        states = moved_states(self.slot_kv, self.num_slots, shares if pooled else {})
        self.graph_sampling.unbind()
        llama.llama_free(self._ctx)
        self._ctx = None
        self._ctx = self._new_context(*self._context_args, pooled=pooled)
        self.pooled = pooled
        self.slot_kv.rebind(self._ctx, pooled)
        self.graph_sampling.rebind(self._ctx)
        self.embedding_output.rebind()
        put_back(self.slot_kv, states)

    def close(self) -> None:
        if self.media is not None:
            self.media.close()
        if self._ctx:
            self.graph_sampling.close()
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._owns_model:
            self.model.close()

    def decode(self, entries: list[BatchEntry]) -> np.ndarray:
        """The step's llama_decode; the logits rows of the entries that want output, in entry
        order, as a (rows, n_vocab) array valid until the next decode. A row whose slot has a
        sampler chain holds no logits when no row beside it needed them (its token is in
        graph_sampling.sampled_tokens). Media chunks go first, each decoded from its embeddings."""
        if self.media is None or not any(is_placeholder(entry.tokens[0]) for entry in entries):
            return self._decode_entries(entries)
        rows = self.media.decode_step(self._ctx, entries, self._decode_entries, self.slot_kv)
        self.last_decode_seconds += self.media.last_seconds
        return rows

    def _decode_entries(self, entries: list[BatchEntry]) -> np.ndarray:
        """decode() of entries that are tokens.

        In a pool, prompt chunks beside decoding tokens go in a llama_decode of their own, as
        llama.cpp's split does between KV windows: in one micro-batch the chunk's rows share
        flash attention's tiles with the other sequences' rows, so few blocks of cells are
        masked for the whole tile and skipped (SmolLM2, 3 decoding tokens beside a 96-token
        chunk: 457 against 360 ms as two calls, 290 with windows)."""
        self.last_embeddings = {}
        if not entries:  # a step of media chunks alone
            self.last_decode_seconds = 0.0
            return np.empty((0, self.n_vocab), dtype=np.float32)
        chunks = [entry for entry in entries if entry.is_prompt_chunk] if self.pooled else []
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
                self.slot_kv.cut_back(entry.slot, entry.start_pos)
            raise
        self.last_decode_seconds += seconds
        if chunk_rows is None:
            return token_rows
        return rows_in_entry_order(entries, chunk_rows, token_rows)

    def _decode_once(self, entries: list[BatchEntry]) -> np.ndarray | None:
        """One llama_decode; the output rows as a view into llama.cpp's logits (None: none)."""
        if not self._ctx:  # a relayout freed the context and could not make the next one
            raise BackendError("the llama.cpp context is gone: it could not be made again in the other KV layout")
        num_outputs = self._batch.fill(entries)
        embeds = self.embedding_output.prepare(self._ctx, self._batch)
        started = time.perf_counter()
        code = llama.llama_decode(self._ctx, self._batch.batch)
        self.last_decode_seconds = time.perf_counter() - started
        self.slot_kv.decoded()
        if code == _DECODE_NO_KV_SLOT:
            raise NoKvSlot("llama_decode found no KV slot for the batch")
        if code != 0:
            raise BackendError(f"llama_decode failed with code {code}")
        if embeds:
            self.last_embeddings.update(self.embedding_output.rows(self._ctx, self._batch))
        if num_outputs == 0:
            return None
        pointer = llama.llama_get_logits(self._ctx)
        if embeds:
            return self.embedding_output.wanted_logits(pointer, self._batch, self.n_vocab)
        return np.ctypeslib.as_array(pointer, shape=(num_outputs, self.n_vocab))


grammar_tokenizers = GrammarTokenizers(lambda path: LlamaModel(path, vocab_only=True))

# --- where things run --------------------------------------------------------------------------

def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build has a GPU backend (CUDA, Metal, Vulkan, ...)."""
    return bool(llama.llama_supports_gpu_offload())


def _libggml() -> str | None:
    """The path of the ggml library llama_cpp loaded (None: not found)."""
    try:
        from llama_cpp import _ggml as ggml_module

        return ggml_module.libggml._name
    except (ImportError, AttributeError):
        return None


# The devices and the build, read through ggml's registry on llama.cpp's library (devices.py).
_platform = Platform(llama, lambda: _init_llama_once(), _libggml)
backends, devices, device_descriptions = _platform.backends, _platform.devices, _platform.device_descriptions
llama_build = _platform.build


def free_memory_for_kv(model: LlamaModel) -> int | None:
    """Bytes free where the model's KV goes: the GPUs that hold its layers (their free memory,
    together), else host memory."""
    return _platform.free_memory(model.layer_devices)
