"""A models file with per-model settings, in llama-server's preset shape (`serve --models-preset
FILE`): an INI file whose sections are models, served under the section's name, and whose keys
are serve's own options without their dashes (`c = 4096`, `ctx-size = 4096`, `np = 4`,
`cache-type-k = q8_0`, `pooling = rank`, `mmproj = ...`, `prefix-cache = false`). A `[*]`
section gives every model of the file its settings; a model's own section overrides them, and an
option given on the command line overrides both (llama-server's order). A section names its
file with `model` (a path, a registry name, hf:OWNER/REPO); without it, the section's name is the
model. Keys of the file alone: `alias` (more names, comma-separated), `load-on-startup`
(false: loaded at the model's first request); llama-server's `stop-timeout` and
`dedup-cache-models` are read and have nothing to do here (no child processes, no hub listing).
Options of the whole server (the port, the key, --models-max...) belong on the command line: a
file that sets one is refused, naming the key."""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

GLOBAL_SECTION = "*"
FILE_SECTION = "\0file"
NO_EFFECT_KEYS = ("stop-timeout", "dedup-cache-models")
SERVER_WIDE = ("host", "port", "api_key", "metrics_public", "webui", "allowed_hosts", "cors_origins", "strict_fields",
               "max_queue", "max_body_mb", "data_dir", "max_upload_mb", "max_batch_lines", "prepare_timeout",
               "send_timeout", "keep_alive", "stream_interval", "models_dir", "models_preset", "models_max",
               "models_memory", "models_keep_alive", "dashboard", "ray_address", "replicas", "routing", "share_prefixes",
               "worker_gpus", "verbose", "alias", "hf_repo", "lora_modules")
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class PresetModel:
    name: str
    options: dict[str, Any]  # serve's parameters for this model: the command line's, with the file's over them
    aliases: tuple[str, ...] = ()
    load_on_startup: bool = True


def preset_models(path: Path, command: click.Command, context: click.Context) -> list[PresetModel]:
    """The models the file describes, in its order, each with serve's parameters (those of
    `context`, the command line's, with the file's where the command line left the default)."""
    parser = configparser.ConfigParser(interpolation=None, default_section="\0none",
                                       inline_comment_prefixes=(";", "#"))  # after a space, as llama-server's
    parser.optionxform = str  # keys as written: their case is checked against the options'
    try:  # what comes before the first section (llama-server's `version = 1`) is the file's own
        parser.read_string(f"[{FILE_SECTION}]\n" + Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, configparser.Error) as error:
        raise click.UsageError(f"--models-preset {path}: cannot be read: {error}") from None
    shared = dict(parser[GLOBAL_SECTION]) if parser.has_section(GLOBAL_SECTION) else {}
    found = [_preset_model(path, name, {**shared, **parser[name]}, command, context)
             for name in parser.sections() if name not in (GLOBAL_SECTION, FILE_SECTION)]
    if not found:
        raise click.UsageError(f"--models-preset {path} describes no model (a [NAME] section with model = FILE)")
    return found


def _preset_model(path: Path, name: str, keys: dict[str, str], command: click.Command,
                  context: click.Context) -> PresetModel:
    where = f"--models-preset {path} [{name}]"
    aliases = tuple(alias.strip() for alias in keys.pop("alias", "").split(",") if alias.strip())
    load_on_startup = _boolean(keys.pop("load-on-startup", "true"), f"{where} load-on-startup")
    for key in NO_EFFECT_KEYS:
        keys.pop(key, None)
    if "hf-repo" in keys:  # llama-server's way to name a Hugging Face model
        keys["model"] = "hf:" + keys.pop("hf-repo").removeprefix("hf:")
    keys.setdefault("model", name)
    arguments = [argument for key, value in keys.items() for argument in _as_arguments(command, key, value, where)]
    try:
        given = command.make_context(command.name, arguments, parent=context.parent)
    except click.ClickException as error:
        raise click.UsageError(f"{where}: {error.format_message()}") from None
    options = dict(context.params)
    for parameter, value in given.params.items():
        if given.get_parameter_source(parameter) is click.core.ParameterSource.COMMANDLINE and \
                context.get_parameter_source(parameter) is not click.core.ParameterSource.COMMANDLINE:
            options[parameter] = value
    options["model"] = given.params["model"]  # the file's model is the section's, whatever -m says
    options["hf_repo"] = None
    return PresetModel(name, options, aliases, load_on_startup)


def _as_arguments(command: click.Command, key: str, value: str, where: str) -> list[str]:
    """serve's arguments that `key = value` stands for, or a usage error naming the key."""
    for parameter in command.params:
        if not isinstance(parameter, click.Option):
            continue
        spelled = [f"--{key}", f"-{key}"]
        if any(opt in parameter.opts for opt in spelled):
            option, negated = next(opt for opt in spelled if opt in parameter.opts), False
        elif any(opt in parameter.secondary_opts for opt in spelled):
            option, negated = next(opt for opt in spelled if opt in parameter.secondary_opts), True
        else:
            continue
        if parameter.name in SERVER_WIDE:
            raise click.UsageError(f"{where}: {key} applies to the whole server: give it on the command line")
        if not parameter.is_flag:  # a path as a shell would read it: the file is not read by one
            return [option, os.path.expanduser(value) if value.startswith("~") else value]
        on = _boolean(value, f"{where} {key}")
        if parameter.secondary_opts:  # --x/--no-x: the key's value picks one
            chosen = on != negated
            return [parameter.opts[0] if chosen else parameter.secondary_opts[0]]
        return [option] if on else []
    raise click.UsageError(f"{where}: {key!r} is not an option of multiseq serve")


def _boolean(value: str, where: str) -> bool:
    text = value.strip().lower()
    if text not in TRUE + FALSE:
        raise click.UsageError(f"{where}: {value!r} is not true or false")
    return text in TRUE


def served_names(presets: list[PresetModel], names: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The models file's (alias, model) pairs and the models it defers, by the names served
    (`names` ends with the file's models; --alias may have renamed the first); a usage error when
    an alias is taken by another name."""
    own = names[len(names) - len(presets):] if presets else ()
    taken, aliases = set(names), []
    for preset, name in zip(presets, own):
        for alias in preset.aliases:
            if alias in taken:
                raise click.UsageError(f"--models-preset: the alias {alias!r} of [{preset.name}] is already a served "
                                       f"model's name")
            taken.add(alias)
            aliases.append((alias, name))
    return tuple(aliases), tuple(name for preset, name in zip(presets, own) if not preset.load_on_startup)
