"""The models `multiseq serve` serves: each -m's config and name, those a --models-dir holds,
and the keep-alive duration its flags and Ollama's requests give."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path

import click

from .. import models
from ..config import KV_POOL_AUTO, RunnerConfig
from .job import check_chat_template
from .models_commands import resolve_model
from .options import SERVE_STEP_TOKENS, adapter_file, runner_config


def duration(value: str, option: str) -> float:
    """A keep-alive duration in seconds (inf: never), or a usage error naming the option."""
    from ..server.errors import ApiError
    from ..server.ollama_request import keep_alive_of

    try:
        seconds = keep_alive_of(float(value) if value.lstrip("-").replace(".", "", 1).isdigit() else value)
    except ApiError:
        raise click.UsageError(f"{option} must be seconds or a duration such as 5m or 1h, got {value!r}") from None
    return seconds if seconds is not None else math.inf


class MemorySize(click.ParamType):
    """An amount of memory in bytes: a number with K, M, G or T (powers of 1,024; KiB, GB... too)."""

    name = "size"
    UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", str(value), re.IGNORECASE)
        if found is None or float(found[1]) <= 0:
            self.fail(f"{value!r} is not an amount of memory such as 8G or 6000M", param, ctx)
        return int(float(found[1]) * self.UNITS[found[2].upper()])


def named_adapters(given: tuple[str, ...], taken: tuple[str, ...]) -> tuple[tuple[str, str, float], ...]:
    """--lora-modules NAME=FILE[:SCALE] as (name, path, scale), or a usage error naming the value."""
    adapters = []
    for text in given:
        name, _, rest = text.partition("=")
        if not name or not rest:
            raise click.UsageError(f"--lora-modules {text!r}: give NAME=FILE or NAME=FILE:SCALE")
        if name in taken or name in (each for each, _, _ in adapters):
            raise click.UsageError(f"--lora-modules {text!r}: {name!r} already names a served model")
        adapters.append((name, *adapter_file(rest, text, "--lora-modules")))
    return tuple(adapters)


def served_models(config: RunnerConfig, resolved: models.ResolvedModel | None, alias: str | None,
                  more: tuple[str, ...], folder: Path | None = None,
                  described: Sequence[tuple[str, RunnerConfig]] = ()) -> tuple[list[RunnerConfig], tuple[str, ...]]:
    """The config and name of each model serve was given: the first -m (with the projector
    options; none when only a folder or a models file was given), each further -m with the same
    engine options but its own file (and no projector but one found beside it), those the folder
    holds, then those a models file describes (named, with their own configs); the first is named
    --alias where given. A usage error when two would share a name, or when the folder holds none."""
    configs, names = ([resolved_config(config, resolved)], [resolved.name]) if resolved is not None else ([], [])
    for name in more:
        extra = resolve_model(name)
        configs.append(resolved_config(dataclasses.replace(config, model=name, mmproj=None), extra))
        names.append(extra.name)
    if folder is not None:
        found = folder_models(folder)
        if not found:
            raise click.UsageError(f"--models-dir {folder} holds no GGUF model")
        for name, weights, projector in found:
            configs.append(dataclasses.replace(config, model=str(weights), mmproj=projector and str(projector)))
            names.append(name)
    for name, described_config in described:
        configs.append(described_config)
        names.append(name)
    names[0] = alias or names[0]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:
        raise click.UsageError(f"two models would be served as {repeated!r}: give each -m once (or --alias the first)")
    return configs, tuple(names)


def resolved_config(config: RunnerConfig, resolved: models.ResolvedModel) -> RunnerConfig:
    """The config with its model as the file it resolved to, unless a registry name: a
    Hugging Face model is then not looked up again when the runner loads it (and its
    repository's projector is given, unless one is or --no-mmproj)."""
    if resolved.spec is not None:
        return config
    projector = config.mmproj or (str(resolved.projector) if resolved.projector and config.auto_mmproj else None)
    return dataclasses.replace(config, model=str(resolved.path), mmproj=projector)


SHARD = re.compile(r"-(\d{5})-of-\d{5}\.gguf$", re.IGNORECASE)  # a split GGUF's part: llama.cpp reads the first


def folder_models(folder: Path) -> list[tuple[str, Path, Path | None]]:
    """The models a folder holds, (name, weights, projector), in name order: each GGUF in it
    (the first part of a split one; not a projector, whose name says mmproj) is a model named by
    its file, and each subfolder holding one such model is a model named by the subfolder, its
    projector the mmproj GGUF beside it."""
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            files = sorted(entry.glob("*.gguf"))
            weights = [file for file in files if _is_weights(file)]
            projectors = [file for file in files if _is_projector(file)]
            if len(weights) == 1:
                found.append((entry.name, weights[0], projectors[0] if projectors else None))
        elif _is_weights(entry):
            found.append((entry.name, entry, None))
    return found


def _is_projector(path: Path) -> bool:
    return path.suffix.lower() == ".gguf" and "mmproj" in path.name.lower()


def _is_weights(path: Path) -> bool:
    shard = SHARD.search(path.name)
    return path.suffix.lower() == ".gguf" and not _is_projector(path) and (shard is None or int(shard.group(1)) == 1)


def serve_config(options: dict) -> RunnerConfig:
    """The RunnerConfig of serve's parameters for one model (-m's first, or a models file's)."""
    options = dict(options)
    ctx_size, kv_unified = options["ctx_size"], options["kv_unified"]
    if isinstance(options["model"], tuple):
        options["model"] = options["model"][0]
    options["slot_ctx"], options["kv_pool"] = _kv_sizes(ctx_size, options["slot_ctx"], options["parallel"],
                                                        kv_unified is not False and not options["batch_invariant"])
    options["kv_layout"] = "pool" if kv_unified else "auto"
    if options["step_tokens"] is None:
        options["step_tokens"] = min(max(SERVE_STEP_TOKENS, options["parallel"]), options["n_batch"])
    config = runner_config(options)
    if config.chat_template:
        check_chat_template(config.chat_template)
    return config


def _kv_sizes(ctx_size: int | None, slot_ctx: int | None, parallel: int, unified: bool) -> tuple[int | None, int | str | None]:
    """(slot_ctx, kv_pool) from -c, --slot-ctx and -np: one pool of -c tokens (sized from the
    model and memory without -c) whose sessions --slot-ctx caps; or, with windows, each slot's
    window: --slot-ctx, or llama-server's -c divided among the -np slots."""
    if unified:
        if ctx_size is not None and slot_ctx is not None and slot_ctx > ctx_size:
            raise click.UsageError(f"--slot-ctx {slot_ctx} caps a session above the whole pool (-c {ctx_size})")
        return slot_ctx, ctx_size if ctx_size is not None else KV_POOL_AUTO
    if ctx_size is None:
        return slot_ctx, None
    if slot_ctx is not None:
        raise click.UsageError("with --no-kv-unified, give -c/--ctx-size (the total) or --slot-ctx (per slot), "
                               "not both")
    if ctx_size // parallel < 16:
        raise click.UsageError(f"-c {ctx_size} leaves {ctx_size // parallel} tokens to each of {parallel} slots; "
                               f"give at least {16 * parallel}")
    return ctx_size // parallel, None
