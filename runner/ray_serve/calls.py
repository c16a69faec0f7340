"""What passes between the parts of multiseq.ray_serve: the HTTP call the gateway hands an Engine
replica (and its routers read), one replica's ask for another's prefix KV, the error that stops
the application from starting, and the names they share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multiseq.server.routing import NO_KEY, RoutingKey

ENGINE = "Engine"  # the Engine deployment's name
# The first message of a replica's answer: who took the call (then the app's ASGI messages).
ACCEPTED = "multiseq.accepted"
# How long a replica asked for a prefix it neither holds nor prefills looks again for the
# request the router sent it with that prefix (on its way, or being rendered and tokenized).
SHARE_GRACE_S = 0.5


class RayServeError(Exception):
    """Ray Serve could not start the application: one line for the user."""


@dataclass(frozen=True)
class HttpCall:
    """An HTTP request as the gateway hands it to an Engine replica (what the router reads)."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    key: RoutingKey = NO_KEY
    replica: str | None = None  # a call for this replica only (health, metrics)
    client: tuple[str, int] | None = None
    # What the router notes as it picks the replica (Ray Serve sends the call's arguments once
    # one is picked): "holders", the replicas sent most of the key, with how many of its
    # characters; the replica that takes the call brings the prompt's prefix KV from one holding more.
    hints: dict[str, Any] = field(default_factory=dict, compare=False)

    def scope(self) -> dict[str, Any]:
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                "method": self.method, "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
                "query_string": self.query_string, "root_path": "", "headers": list(self.headers),
                "client": self.client, "server": None}


@dataclass(frozen=True)
class PrefixAsk:
    """One Engine replica asking another for the KV of the longest prefix of `tokens` it holds,
    if longer than `more_than`; a prefill of it under way there is waited for while it goes
    forward at least every `patience_s` (what computing the prefix itself would take)."""

    tokens: np.ndarray
    more_than: int
    patience_s: float
    replica: str  # the replica asked (the routers send the call there)
    key: RoutingKey = NO_KEY  # none: the routers read a call's key and replica

    def holds_more(self, num_held: int) -> bool:
        return num_held > self.more_than

    def keeps_waiting(self, num_held: int, is_growing: bool, num_coming: int, waited_s: float, stalled_s: float) -> bool:
        """Whether the replica asked looks again rather than answer with what it holds now
        (`num_held` of the tokens; `is_growing`, a prefill under way there will hold more;
        `num_coming`, requests there still being prepared or queued; seconds since the ask, and
        since the prefill last went forward). Never longer than the asker's own cost in all,
        once nothing goes forward: waiting is only worth what it saves."""
        if is_growing:
            return stalled_s < self.patience_s
        if self.holds_more(num_held):
            return False
        # The request the router sent there with this prefix (it counts that replica as holding
        # it from the pick on) may still be on its way, or being prepared, on a busy machine.
        if num_coming:
            return waited_s < max(SHARE_GRACE_S, self.patience_s)
        return waited_s < SHARE_GRACE_S
