"""The server page's state over every replica (GET /status and /status/events behind the
gateway): each replica's models, slots and queue, named with their replica; the plots' points
summed where the replicas' samples fall in the same interval; the errors of all, newest last.
"""

from __future__ import annotations

from typing import Any

from multiseq.server.monitor import MAX_ERRORS, SAMPLE_INTERVAL_S


def merge_status(states: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """One page's state from each replica's (None: it did not answer)."""
    answered = {name: state for name, state in sorted(states.items()) if state is not None}
    models = []
    for name, state in sorted(states.items()):
        if state is None:
            models.append({"name": "?", "status": "failed", "replica": name,
                           "failure": f"the replica {name} did not answer"})
            continue
        models += [model | {"replica": name} for model in state["models"]]
    requests_by_api: dict[str, int] = {}
    for state in answered.values():
        for api, count in state["requests_by_api"].items():
            requests_by_api[api] = requests_by_api.get(api, 0) + count
    errors = sorted((error | {"replica": name} for name, state in answered.items() for error in state["errors"]),
                    key=lambda error: error["at"])[-MAX_ERRORS:]
    return {"at": max((state["at"] for state in answered.values()), default=0.0),
            "started_at": min((state["started_at"] for state in answered.values()), default=0.0),
            "api_key_required": any(state["api_key_required"] for state in answered.values()),
            "models": models, "requests_by_api": requests_by_api,
            "history": merge_history([state["history"] for state in answered.values()]), "errors": errors}


def merge_history(histories: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The replicas' points summed by sampling interval: tokens per second added, the time to
    first token averaged over the requests that started."""
    merged: dict[int, dict[str, Any]] = {}
    for history in histories:
        for point in history:
            interval = int(point["at"] // SAMPLE_INTERVAL_S)
            into = merged.setdefault(interval, {"at": point["at"], "tokens_per_s": 0.0, "ttft_sum": 0.0, "requests": 0})
            into["at"] = max(into["at"], point["at"])
            into["tokens_per_s"] += point["tokens_per_s"]
            if point["ttft_s"] is not None:
                into["ttft_sum"] += point["ttft_s"] * point["requests"]
                into["requests"] += point["requests"]
    return [{"at": point["at"], "tokens_per_s": point["tokens_per_s"], "requests": point["requests"],
             "ttft_s": point["ttft_sum"] / point["requests"] if point["requests"] else None}
            for _, point in sorted(merged.items())]
