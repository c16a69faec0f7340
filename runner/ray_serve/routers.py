"""The request routers of multiseq.ray_serve's Engine deployment: `PrefixAffinityRouter` (each
conversation to the replica that holds it, unless that one is far busier; `--routing prefix`)
and `LeastBusyRouter` (Ray Serve's power of two choices; `--routing ray`). Both send a call to
one named replica, and pinned state to its home, and keep a directory of the replicas in this
process for the gateway.

Ray Serve ships this module to the router by value (a copy of its globals): it holds the routers
and what they use, and names the rest by reference.
"""

from __future__ import annotations

import random
import threading
from typing import Any

# Ray Serve's default router, not exported by ray.serve.request_router (Ray LLM's prefix router
# builds on it from here too).
from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from multiseq.ray_serve.calls import HttpCall
from multiseq.server.routing import (NO_KEY, NO_MATCH, Candidate, LoadBook, PrefixIndex, PrefixMatch, RoutingKey,
                                     StateHomes, rank_replicas)

# The replicas named as holders of a request's key, for prefix KV sharing between replicas.
MAX_HOLDERS_NAMED = 3
# The routers of this process, by (application, deployment): the gateway asks them which
# replicas there are (a deployment handle's router lives in the process that holds the handle).
_ROUTERS: dict[tuple[str, str], "_ReplicaDirectory"] = {}


def _call_of(pending_request: PendingRequest | None) -> HttpCall | None:
    """The HttpCall a pending request carries. (Told by its fields, not by its class: Ray Serve
    ships a router's module to the router by value, and a class it names may be a copy.)"""
    if pending_request is None or not pending_request.args:
        return None
    call = pending_request.args[0]
    return call if hasattr(call, "key") and hasattr(call, "replica") else None


class _ReplicaDirectory:
    """What both routers add to their policy: the replicas known here (for the gateway), calls
    for one named replica, and the homes of pinned state (the Files and Batch APIs' data, stored
    responses), which every request naming it goes to. The router's own loop and the gateway's
    share this state: one lock."""

    def _register(self) -> None:
        # Ray Serve ships a router's module by value (a copy of its globals): the directory the
        # gateway reads is the imported module's.
        import multiseq.ray_serve.routers as imported

        self._lock = threading.Lock()
        self.homes = StateHomes()
        imported._ROUTERS[(self._deployment_id.app_name, self._deployment_id.name)] = self

    def replica_names(self) -> list[str]:
        return sorted(replica_id.unique_id for replica_id in list(self.curr_replicas))

    def note(self, key: RoutingKey, replica: str) -> None:
        """`replica` now holds the state under `key` (a stored response): calls naming it go there."""
        with self._lock:
            self.homes.note(key, replica)

    def _fixed_choice(self, candidates: list[RunningReplica],
                      pending_request: PendingRequest | None) -> list[list[RunningReplica]] | None:
        """The replica a call must go to, if it must: the one it names, or its state's home."""
        call = _call_of(pending_request)
        if call is None:
            return None
        with self._lock:
            wanted = call.replica if call.replica is not None else self.homes.home_of(call.key)
        chosen = [replica for replica in candidates if replica.replica_id.unique_id == wanted]
        if call.replica is None and not chosen:
            return None
        pending_request.routing_context.should_backoff = True  # the only choice: wait before asking it again
        return [chosen]

    def _note_routed(self, call: HttpCall | None, replica: str) -> None:
        if call is not None and call.replica is None:
            self.note(call.key, replica)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = set(self.replica_names()) - {replica.replica_id.unique_id for replica in replicas}
        super().update_replicas(replicas)
        for name in gone:
            self._forget(name)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id.unique_id)

    def _forget(self, name: str) -> None:
        with self._lock:
            self.homes.forget(name)


class LeastBusyRouter(_ReplicaDirectory, PowerOfTwoChoicesRequestRouter):
    """Ray Serve's default router (power of two choices), for `--routing ray`; pinned state
    still goes to its home. A replica chosen goes to the request it was chosen for (Ray's base
    rule), not to the oldest one waiting (its FIFO mixin's), which would send a call meant for
    one replica to another."""

    _fulfill_next_pending_request = RequestRouter._fulfill_next_pending_request

    def initialize_state(self, **kwargs: Any) -> None:
        self._register()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        fixed = self._fixed_choice(candidate_replicas, pending_request)
        if fixed is not None:
            return fixed
        return await super().choose_replicas(candidate_replicas, pending_request)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._note_routed(_call_of(pending_request), replica_id.unique_id)


def _most_held(matches: dict[str, PrefixMatch]) -> tuple[tuple[str, int], ...]:
    """The replicas holding most of a key, with how many of its characters, most first."""
    ranked = sorted(matches.items(), key=lambda item: -item[1].num_held_chars)
    return tuple((name, match.num_held_chars) for name, match in ranked[:MAX_HOLDERS_NAMED])


class PrefixAffinityRouter(_ReplicaDirectory, RequestRouter):
    """Each request to the replica holding the conversation it continues, unless that replica
    has more than `max_imbalance` requests beyond the least busy one (`rank_replicas`). Its
    in-flight counts are its own (exact while the gateway runs as one replica: every request of
    the deployment then passes this router)."""

    def initialize_state(self, max_imbalance: int = 4, max_nodes: int | None = None) -> None:
        self._register()
        self.max_imbalance = max_imbalance
        self.index = PrefixIndex(max_nodes) if max_nodes else PrefixIndex()
        self.load = LoadBook()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        fixed = self._fixed_choice(candidate_replicas, pending_request)
        if fixed is not None:
            return fixed
        call = _call_of(pending_request)
        key = call.key if call is not None else NO_KEY
        shuffled = random.sample(candidate_replicas, len(candidate_replicas))  # equal ones: any order
        by_name = {replica.replica_id.unique_id: replica for replica in shuffled}
        with self._lock:
            matches = self.index.match(key) if not key.is_empty else {}
            candidates = [Candidate(name, self.load.num_ongoing(name), matches.get(name, NO_MATCH),
                                    self.index.num_conversations(name)) for name in by_name]
            ranked = rank_replicas(candidates, self.max_imbalance)
            if pending_request is not None and ranked:
                self.load.pick(pending_request.metadata.internal_request_id, ranked[0])
            if call is not None and ranked and not key.is_empty and not key.is_pinned:
                call.hints["holders"] = _most_held(matches)
                # Noted now, not once the replica took it: requests that arrive together are
                # routed before any is sent, and each must see where the others went.
                self.index.record(key, ranked[0])
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # every replica is offered: wait before again
        return [[by_name[name]] for name in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        name = replica_id.unique_id
        call = _call_of(pending_request)
        self._note_routed(call, name)
        with self._lock:
            self.load.confirm(pending_request.metadata.internal_request_id, name)
            if call is not None and call.replica is None and not call.key.is_empty and not call.key.is_pinned:
                self.index.record(call.key, name)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        with self._lock:
            self.load.finish(internal_request_id)

    def _forget(self, name: str) -> None:
        super()._forget(name)
        with self._lock:
            self.load.forget(name)
            self.index.forget(name)


def router_of(engine) -> _ReplicaDirectory | None:
    """The router of a deployment handle held in this process (None until its first call)."""
    return _ROUTERS.get((engine.app_name, engine.deployment_name))
