"""The models `multiseq serve` serves: each -m's config and name, and the keep-alive duration
its flags and Ollama's requests give."""

from __future__ import annotations

import dataclasses
import math

import click

from .. import models
from ..config import RunnerConfig
from .models_commands import resolve_model


def duration(value: str, option: str) -> float:
    """A keep-alive duration in seconds (inf: never), or a usage error naming the option."""
    from ..server.errors import ApiError
    from ..server.ollama_request import keep_alive_of

    try:
        seconds = keep_alive_of(float(value) if value.lstrip("-").replace(".", "", 1).isdigit() else value)
    except ApiError:
        raise click.UsageError(f"{option} must be seconds or a duration such as 5m or 1h, got {value!r}") from None
    return seconds if seconds is not None else math.inf


def served_models(config: RunnerConfig, resolved: models.ResolvedModel, alias: str | None,
                   more: tuple[str, ...]) -> tuple[list[RunnerConfig], tuple[str, ...]]:
    """The config and name of each model serve was given: the first (with --alias and the
    projector options), then each further -m with the same engine options but its own file
    (and no projector but one found beside it); a usage error when two would share a name."""
    configs, names = [resolved_config(config, resolved)], [alias or resolved.name]
    for name in more:
        extra = resolve_model(name)
        configs.append(resolved_config(dataclasses.replace(config, model=name, mmproj=None), extra))
        names.append(extra.name)
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
