"""Opening a model by name: the registry, Hugging Face or a path, resolved to a GGUF file (the
models package's business) and loaded by the backend (llama.cpp's). The backend itself only
binds llama.cpp and knows nothing of names."""

from __future__ import annotations

import os
from typing import Any

from . import models
from .config import DEFAULT_SLOT_CTX, KV_POOL_AUTO, RANK, RunnerConfig
from .llama.backend import LlamaBackend, LlamaModel, free_memory_for_kv, grammar_tokenizers
from .llama.kv_sizing import default_pool


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
                        ranks=(config.pooling or model.pooling) == RANK)


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
