"""llama-server's slot routes: GET /slots (each slot's state, from the runner's latest snapshot:
it never waits for a step) and POST /slots/{id}?action=save|restore|erase, which keep a slot's
KV in a file of --slot-save-path and give it back, across restarts.

A file is written as the disk tier writes its own (multiseq.kv.disk: a partial name, synced,
renamed, a CRC-32 checked on read) under the runner's states key, so a file of another model or
other KV settings is refused, never restored. An action on a slot that holds a request waits
until the slot is free, as llama-server defers it. ?model= picks one of several models.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from ..kv.disk import DamagedState, load_state_file, save_state_file
from ..loop.engine import states_key
from ..loop.runner import Runner
from .bodies import read_json
from .errors import INVALID_REQUEST, NOT_FOUND, SERVER_ERROR, ApiError
from .models import ready

ACTIONS = ("save", "restore", "erase")
_FILENAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
_BUSY_POLL_S = 0.05
_BUSY_LIMIT_S = 300.0  # a slot busy this long: 503, try again


async def list_slots(request: HttpRequest) -> Response:
    """GET /slots: each slot as llama-server lists it (?fail_on_no_slot: a 503 when none is idle)."""
    runner = _runner(request)
    snapshot = runner.latest_snapshot
    listed = [_slot_json(slot, runner.config.spec_type != "none") for slot in snapshot.slots]
    if request.query_params.get("fail_on_no_slot") and not any(slot.request_id is None for slot in snapshot.slots):
        raise ApiError(503, "no slot available", SERVER_ERROR, code="unavailable_error")
    return JSONResponse(listed)


async def slot_action(request: HttpRequest) -> Response:
    """POST /slots/{id}?action=save|restore|erase, llama-server's shapes."""
    state = request.app.state.server
    runner = _runner(request)
    action = request.query_params.get("action")
    if action not in ACTIONS:
        raise ApiError(400, f"Invalid action: give action={'|'.join(ACTIONS)}", INVALID_REQUEST, param="action")
    slot = _slot_index(request.path_params["id_slot"], runner.config.parallel)
    if action == "erase":
        return JSONResponse({"id_slot": slot, "n_erased": await _when_idle(
            state, runner, lambda: runner.engine.placement.erase_slot(slot))})
    folder = state.settings.slot_save_path
    if folder is None:
        raise ApiError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                       "not_supported_error")
    body = await read_json(request, state.settings.max_body_bytes)
    path = folder / _filename(body.get("filename"))
    if action == "save":
        return JSONResponse(await _save(state, runner, slot, path))
    return JSONResponse(await _restore(state, runner, slot, path))


async def _save(state, runner: Runner, slot: int, path: Path) -> dict:
    started = time.perf_counter()
    tokens, slot_state = await _when_idle(state, runner, lambda: runner.engine.placement.saved_slot(slot))
    if slot_state is None:
        raise ApiError(400, f"slot {slot} keeps nothing to save", INVALID_REQUEST)
    key = await state.offload.io(states_key, runner.config, runner.backend)
    try:
        written = await state.offload.io(save_state_file, path, key, tokens, slot_state)
    except OSError as error:  # a full disk, a folder that cannot be made: said without the server's folders
        raise ApiError(500, f"Unable to save slot {slot}: {error.strerror or 'the file could not be written'}",
                       SERVER_ERROR) from None
    return {"id_slot": slot, "filename": path.name, "n_saved": len(tokens), "n_written": written,
            "timings": {"save_ms": (time.perf_counter() - started) * 1000}}


async def _restore(state, runner: Runner, slot: int, path: Path) -> dict:
    started = time.perf_counter()
    key = await state.offload.io(states_key, runner.config, runner.backend)
    try:
        tokens, slot_state = await state.offload.io(load_state_file, path, key)
    except FileNotFoundError:
        raise ApiError(404, f"no saved slot file named {path.name!r}", NOT_FOUND, param="filename") from None
    except (OSError, DamagedState) as error:
        raise ApiError(400, f"Unable to restore slot: {path.name} is not a state this model can read "
                            f"({error})", INVALID_REQUEST, param="filename") from None
    restored = await _when_idle(state, runner, lambda: runner.engine.placement.restore_slot(
        slot, tokens, slot_state, time.perf_counter()))
    if not restored:
        raise ApiError(400, f"Unable to restore slot: its {len(tokens)} tokens do not fit slot {slot}",
                       INVALID_REQUEST)
    return {"id_slot": slot, "filename": path.name, "n_restored": len(tokens), "n_read": path.stat().st_size,
            "timings": {"restore_ms": (time.perf_counter() - started) * 1000}}


async def _when_idle(state, runner: Runner, work):
    """Run `work` on the engine's owner between two steps, again while it says the slot is busy
    (None)."""
    deadline = time.monotonic() + _BUSY_LIMIT_S
    while (done := await state.offload.io(runner.between_steps, work)) is None:
        if time.monotonic() > deadline:
            raise ApiError(503, "the slot is still processing a request; try again later", SERVER_ERROR)
        await asyncio.sleep(_BUSY_POLL_S)
    return done


def _runner(request: HttpRequest) -> Runner:
    return ready(request.app.state.server.models.pick(request.query_params.get("model")))


def _slot_index(text: str, num_slots: int) -> int:
    if not text.isdigit() or int(text) >= num_slots:
        raise ApiError(400, f"Invalid slot ID: this server has slots 0 to {num_slots - 1}", INVALID_REQUEST,
                       param="id_slot")
    return int(text)


def _filename(name) -> str:
    """A file name alone (llama-server's rule: no folder, nothing hidden)."""
    if not isinstance(name, str) or not _FILENAME.fullmatch(name) or ".." in name:
        raise ApiError(400, "Invalid filename: give 'filename', a name of letters, digits, '.', '_' and '-' "
                            "(no folder)", INVALID_REQUEST, param="filename")
    return name


def _slot_json(slot, speculative: bool) -> dict:
    listed = {"id": slot.slot, "n_ctx": slot.window, "speculative": speculative,
              "is_processing": slot.request_id is not None}
    if slot.request_id is not None:
        listed |= {"id_task": slot.request_id, "phase": slot.phase, "n_prompt_tokens": slot.prompt_tokens,
                   "n_prompt_tokens_cache": slot.cached_tokens,
                   "n_prompt_tokens_processed": slot.prompt_tokens - slot.cached_tokens,
                   "next_token": [{"has_next_token": slot.phase != "idle", "has_new_line": "\n" in slot.text_tail,
                                   "n_remain": -1, "n_decoded": slot.generated_tokens}]}
    else:
        listed["n_prompt_tokens_cache"] = slot.cached_tokens  # what its KV keeps for later prompts
    return listed
