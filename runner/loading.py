"""Opening a model by name: the registry, Hugging Face or a path, resolved to a GGUF file (the
models package's business) and loaded by the backend (llama.cpp's). The backend itself only
binds llama.cpp and knows nothing of names."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from . import models
from .config import DEFAULT_SLOT_CTX, KV_POOL_AUTO, RANK, RunnerConfig
from .llama.backend import LlamaBackend, LlamaModel, free_memory_for_kv, grammar_tokenizers
from .llama.kv_sizing import default_pool, free_host_memory


def open_model(name_or_path: str | os.PathLike | None = None, chat_template: str | None = None,
               repack_weights: bool = True, **placement) -> LlamaModel:
    """A registry model by name (fetched into the user's cache on first use; None: the default
    model), a Hugging Face model (hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf) or a .gguf
    file by path, loaded. `placement` is n_gpu_layers, main_gpu, split_mode and tensor_split, as
    RunnerConfig has them. Raises ModelError or BackendError."""
    resolved = models.resolve(name_or_path)
    model = LlamaModel(str(resolved.path), chat_template, resolved.chat_template_fallback,
                       repack_weights=repack_weights, **placement)
    model.found_projector = str(resolved.projector) if resolved.projector else None
    return model


def _kv_report(model: LlamaModel, path) -> dict:
    """What the model's KV takes, and the pool `multiseq serve` would make for it here (with
    its default slots, the model's weights taken from the memory free now)."""
    from .config import RunnerConfig, default_of
    from .llama.kv_sizing import default_pool, free_host_memory

    trained, parallel = model.n_ctx_train, default_of(RunnerConfig, "parallel")
    per_token = {types: model.kv_bytes_per_token((types, types)) for types in ("f16", "q8_0")}
    report = {"trained_context": trained, "bytes_per_token": per_token}
    free = free_host_memory()
    if trained and per_token["f16"]:
        free = None if free is None else max(0, free - os.path.getsize(path))
        pool = default_pool(trained, parallel, per_token["f16"], free)
        report["serve_pool"] = {"tokens": pool.tokens, "bytes": pool.num_bytes, "bounded_by": pool.bounded_by,
                                "slots": parallel, "agent_sessions": pool.agent_sessions,
                                "session_tokens": pool.session_tokens}
    return report


def tool_family_report(name_or_path: str | os.PathLike | None = None, chat_template: str | None = None,
                       tool_format: str | None = None) -> dict:
    """How a model's output is read, from its vocabulary and chat template alone (no weights
    loaded): the tool-call and reasoning family detected from its template, and which of the
    family's markers are control tokens of its vocabulary (kept as text for the parser)."""
    from .tools.support import ToolSupport

    resolved = models.resolve(name_or_path)
    model = LlamaModel(str(resolved.path), chat_template, resolved.chat_template_fallback, vocab_only=True)
    try:
        support = ToolSupport(model.chat_template_source, tool_format)
        family = support.described()
        return {"model": str(resolved.path),
                "chat_template": model.chat_template.description if model.chat_template else None,
                "tool_format": family["name"], "detected": family["detected"], "description": family["description"],
                "reasoning": family["reasoning"],
                "marker_tokens": sorted(marker.decode() for marker in support.marker_tokens(model).values()),
                "kv": _kv_report(model, resolved.path), "pooling": model.pooling}
    finally:
        model.close()


def backend_on(model, config: RunnerConfig, owns_model: bool) -> LlamaBackend:
    """A context on a loaded model, sized and threaded as the config says."""
    cache_types = (config.cache_type_k, config.cache_type_v)
    pool, session_ctx = config.kv_pool, config.session_ctx
    if pool == KV_POOL_AUTO:
        trained = model.n_ctx_train or DEFAULT_SLOT_CTX
        per_token = model.kv_bytes_per_token(cache_types)
        sized = default_pool(trained, config.parallel, per_token or 0, free_memory_for_kv(model) if per_token else None)
        pool = sized.tokens
        session_ctx = min(config.slot_ctx or sized.session_tokens, pool)
    return LlamaBackend(model, config.parallel, session_ctx, config.n_batch, config.threads, owns_model=owns_model,
                        batch_invariant=config.batch_invariant, flash_attn=config.flash_attn.value,
                        cache_types=cache_types, pool_tokens=pool,
                        windows_while_they_fit=pool is not None and config.kv_layout == "auto" and config.parallel > 1,
                        ranks=(config.pooling or model.pooling) == RANK,
                        adapters=[(str(path), float(scale)) for path, scale in config.lora],
                        named_adapters=[(str(path), float(scale)) for _, path, scale in config.lora_modules])


def prepare_constraints_of(config: RunnerConfig) -> None:
    """Build llguidance's tokenizer for the config's model file before the model loads (kept
    for the process: multiseq.llama.text's GrammarTokenizers), so that its load does not build it
    with the GIL held while other models stream. Nothing for a reranker or a model that is not
    a local file yet; a vocabulary llguidance cannot read is left for the load to report."""
    if config.pooling == RANK or not os.path.isfile(str(config.model)):
        return
    try:
        grammar_tokenizers.of(str(config.model))
    except ValueError:
        pass


def constraints_prepared_of(config: RunnerConfig) -> bool:
    """Whether prepare_constraints_of has nothing (more) to do for the config's model."""
    return config.pooling == RANK or not os.path.isfile(str(config.model)) or \
        grammar_tokenizers.has(str(config.model))


# What a loaded context holds besides its weights, KV and the logits of a step: llama.cpp's
# compute buffers and the runner's own (13-14 MiB measured on Gemma 3 270M, 3-4 MiB on SmolLM2,
# at 4,096 and 32,768 pool tokens), with room to spare.
CONTEXT_OVERHEAD_BYTES = 32 * 2**20
# llguidance's tokenizer with the vocabulary-only model under it, kept for the process once
# built: 145 MiB measured for Gemma 3's 262,144 tokens (580 bytes a token), 37 MiB for
# SmolLM2's 49,152 (790).
KEPT_BYTES_PER_VOCABULARY_TOKEN = 800


def memory_of(config: RunnerConfig, room_bytes: int | None = None) -> tuple[int, int, RunnerConfig]:
    """(loaded, kept, config): the host memory a model takes while loaded with this config, and
    what it keeps for the process once loaded (its constraints' tokenizer), from its GGUF's
    metadata alone (no weights read), and the config to load it with. Loaded: its weights,
    projector and LoRA adapters (their files' sizes), its KV pool, its RAM tier at its bound (--cache-ram), the
    logits of one step and CONTEXT_OVERHEAD_BYTES. A pool sized by default (auto) is sized here,
    within `room_bytes` (the memory it may take; None: what the host has free), and the config
    returned names it, so that the load makes that pool and not one sized from the memory free
    then."""
    resolved = models.resolve(config.model)
    model = LlamaModel(str(resolved.path), vocab_only=True)
    try:
        config = _pool_sized(model, config, room_bytes, os.path.getsize(resolved.path))
        per_token = model.kv_bytes_per_token((config.cache_type_k, config.cache_type_v)) or 0
        pool = config.kv_pool if isinstance(config.kv_pool, int) else config.session_ctx * config.parallel
        projector = config.mmproj or (str(resolved.projector) if resolved.projector and config.auto_mmproj else None)
        step_logits = model.n_vocab * 4 * max(config.step_tokens or 0, config.parallel)
        adapters = [path for path, _ in config.lora] + [path for _, path, _ in config.lora_modules]
        total = os.path.getsize(resolved.path) + (os.path.getsize(projector) if projector else 0) + pool * per_token + \
            sum(os.path.getsize(path) for path in adapters) + \
            (config.cache_ram_mib * 2**20 if config.prefix_cache else 0) + step_logits + CONTEXT_OVERHEAD_BYTES
        kept = 0 if (config.pooling or model.pooling) == RANK else model.n_vocab * KEPT_BYTES_PER_VOCABULARY_TOKEN
        return total, kept, config
    finally:
        model.close()


def _pool_sized(model: LlamaModel, config: RunnerConfig, room_bytes: int | None, weight_bytes: int) -> RunnerConfig:
    """The config with an auto pool sized as backend_on would size it, but within room_bytes."""
    per_token = model.kv_bytes_per_token((config.cache_type_k, config.cache_type_v))
    if config.kv_pool != KV_POOL_AUTO or not per_token:
        return config
    free = free_host_memory()  # what backend_on reads once the weights are in
    free = None if free is None else max(0, free - weight_bytes)
    if room_bytes is not None:
        ram_tier = config.cache_ram_mib * 2**20 if config.prefix_cache else 0
        within = max(0, room_bytes - weight_bytes - ram_tier - CONTEXT_OVERHEAD_BYTES)
        free = within if free is None else min(free, within)
    sized = default_pool(model.n_ctx_train or DEFAULT_SLOT_CTX, config.parallel, per_token, free)
    return dataclasses.replace(config, kv_pool=sized.tokens,
                               slot_ctx=min(config.slot_ctx or sized.session_tokens, sized.tokens))


def model_placement(config: RunnerConfig) -> dict[str, Any]:
    """The config's model parameters for llama.cpp: where the layers go."""
    return dict(n_gpu_layers=config.n_gpu_layers, main_gpu=config.main_gpu, split_mode=config.split_mode.value,
                tensor_split=config.tensor_split)


def open_backend(config: RunnerConfig) -> LlamaBackend:
    """The config's model opened (with its projector) and a context on it, which owns it."""
    model = open_model(config.model, config.chat_template, repack_weights=not config.batch_invariant,
                       **model_placement(config))
    try:
        projector = config.mmproj or (model.found_projector if config.auto_mmproj else None)
        if projector:
            model.load_projector(projector, config.threads, "off" if config.batch_invariant else config.flash_attn.value)
        return backend_on(model, config, owns_model=True)
    except BaseException:
        model.close()
        raise
