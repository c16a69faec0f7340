"""Which replica a request goes to, when several servers share the work: the one whose cache
holds the conversation the request continues, unless that one is far busier than the others.

Three pure parts, so the rules can be tested on recorded requests without a cluster:

- `routing_key(method, path, body)`: what of a request decides where it runs. A conversation is
  the chain of its parts as the client sent them (the tools, the system prompt, each message
  in order; a plain prompt in blocks of text); state kept by one server (the Files and Batch
  APIs, stored responses) is a key that must always go to the same one (`is_pinned`).
- `PrefixIndex`: what each replica was sent, as a tree of chained hashes of those parts, with
  the points where a whole prompt ended. An agent's next turn is its last prompt, the reply,
  and a new message: it extends a prompt that ended on one replica, whose slots (or host
  cache) still hold it. A system prompt that many sessions share is a branch point, held by
  several replicas and ending no prompt, so it attracts no session.
- `rank_replicas(candidates, ...)`: the order in which to try the replicas: the one holding the
  conversation first, unless its queue is longer than the least loaded one's by more than
  `max_imbalance`; otherwise (and for a new conversation) the least loaded, ties going to the
  replica holding fewer conversations (so sessions sharing a system prompt spread), then to the
  one holding the longest prefix.
- `StateHomes`: where each pinned key's state lives (the replica that first served it).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# A plain prompt is cut in blocks of this many characters: two prompts that share a start share
# their first blocks, and a continued prompt extends its predecessor's whole blocks.
TEXT_BLOCK_CHARS = 256
# Tree nodes kept before the least recently used go (a node per message or block; what the
# replicas' own caches hold is far less).
DEFAULT_MAX_NODES = 200_000
# A replica picked for a request that never reached it (cancelled while being routed) stops
# counting against it after this long.
UNCONFIRMED_TTL_S = 60.0
# Keys of the state one server keeps: every request that reads or changes it goes to the replica
# that made it.
FILES_AND_BATCHES = "multiseq:files-and-batches"
RESPONSE_PREFIX = "multiseq:response:"

_CHAT_PATHS = ("/v1/chat/completions", "/v1/messages")
# How replicas are chosen: by the conversation's prefix (this module), or by Ray Serve's own router.
ROUTINGS = ("prefix", "ray")


@dataclass(frozen=True)
class RoutingKey:
    """The parts of a request that decide its replica, in order (empty: any replica will do)."""

    segments: tuple[str, ...] = ()
    is_pinned: bool = False  # state that lives on one replica: go there whatever its load

    @property
    def is_empty(self) -> bool:
        return not self.segments


NO_KEY = RoutingKey()


def routing_key(method: str, path: str, body: bytes) -> RoutingKey:
    """The routing key of an HTTP request to the OpenAI-compatible (or Anthropic) API. A body
    that is not a JSON object has none: the replica it reaches answers the error."""
    path = path.rstrip("/") or "/"
    if path.startswith(("/v1/files", "/v1/batches")):
        return RoutingKey((FILES_AND_BATCHES,), is_pinned=True)
    if path.startswith("/v1/responses/"):  # GET, DELETE, cancel, input_items of a stored response
        return RoutingKey((RESPONSE_PREFIX + path.split("/")[3],), is_pinned=True)
    if method != "POST" or path not in (*_CHAT_PATHS, "/v1/completions", "/v1/responses"):
        return NO_KEY
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return NO_KEY
    if not isinstance(request, dict):
        return NO_KEY
    if path == "/v1/completions":
        return RoutingKey(_prompt_blocks(request.get("prompt")))
    if path == "/v1/responses":
        return _responses_key(request)
    system = [] if request.get("system") is None else [_part("system", request["system"])]  # Anthropic's
    return RoutingKey(tuple([*_tools_part(request), *system, *_parts("message", request.get("messages"))]))


def response_key(response_id: str) -> RoutingKey:
    """The key under which a stored response is noted: later requests naming it go there."""
    return RoutingKey((RESPONSE_PREFIX + response_id,), is_pinned=True)


def _responses_key(request: dict[str, Any]) -> RoutingKey:
    previous = request.get("previous_response_id")
    head = [RESPONSE_PREFIX + previous] if isinstance(previous, str) else []
    instructions = [] if request.get("instructions") is None else [_part("instructions", request["instructions"])]
    given = request.get("input")
    items = [_part("input", given)] if isinstance(given, str) else _parts("input", given)
    return RoutingKey(tuple([*head, *_tools_part(request), *instructions, *items]), is_pinned=bool(head))


def _tools_part(request: dict[str, Any]) -> list[str]:
    return [_part("tools", request["tools"])] if request.get("tools") else []


def _parts(kind: str, values: Any) -> list[str]:
    return [_part(kind, value) for value in values] if isinstance(values, list) else []


def _part(kind: str, value: Any) -> str:
    """One part as a canonical text (sorted keys: a client that rebuilds its history as new
    dicts sends the same parts)."""
    return kind + ":" + json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _prompt_blocks(prompt: Any) -> tuple[str, ...]:
    """A plain prompt in whole blocks (the last, partial block too: a prompt sent again matches
    itself completely). A list of prompts routes by its first; token ids count as text."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]
    text = prompt if isinstance(prompt, str) else json.dumps(prompt) if isinstance(prompt, list) else ""
    return tuple(text[start:start + TEXT_BLOCK_CHARS] for start in range(0, len(text), TEXT_BLOCK_CHARS))


# --- the index of what each replica holds --------------------------------------------------------

@dataclass
class _Node:
    num_chars: int  # characters of the whole prefix up to and with this part
    holders: set[str] = field(default_factory=set)  # replicas sent a request with this prefix
    ends_on: set[str] = field(default_factory=set)  # replicas where a whole prompt ended here


@dataclass(frozen=True)
class PrefixMatch:
    """What one replica holds of a request's key, in characters of the key's parts."""

    num_held_chars: int = 0  # the longest prefix of the request it was sent
    num_conversation_chars: int = 0  # the longest whole earlier prompt that the request extends

    @property
    def holds_conversation(self) -> bool:
        return self.num_conversation_chars > 0


NO_MATCH = PrefixMatch()


class PrefixIndex:
    """The prompts sent to each replica, as chains of part hashes (a tree: prompts that share a
    start share its nodes). Bounded: the least recently used nodes go first (a node is used
    whenever a request passes through it, so a parent is never older than its children)."""

    def __init__(self, max_nodes: int = DEFAULT_MAX_NODES) -> None:
        if max_nodes < 1:
            raise ValueError("max_nodes must be >= 1")
        self.max_nodes = max_nodes
        self._nodes: OrderedDict[bytes, _Node] = OrderedDict()
        self._conversations: dict[str, int] = {}  # per replica: the prompts that end on it

    def __len__(self) -> int:
        return len(self._nodes)

    def match(self, key: RoutingKey) -> dict[str, PrefixMatch]:
        """Per replica holding any of it, how much of `key` it holds."""
        held: dict[str, int] = {}
        conversation: dict[str, int] = {}
        for digest in _chain(key.segments):
            node = self._nodes.get(digest)
            if node is None:
                break
            self._nodes.move_to_end(digest)
            for replica in node.holders:
                held[replica] = node.num_chars
            for replica in node.ends_on:
                conversation[replica] = node.num_chars
        return {replica: PrefixMatch(chars, conversation.get(replica, 0)) for replica, chars in held.items()}

    def record(self, key: RoutingKey, replica: str) -> None:
        """`replica` was sent a request with this key: it holds every prefix, and the whole key
        ended there."""
        node = None
        num_chars = 0
        for digest, segment in zip(_chain(key.segments), key.segments):
            num_chars += len(segment)
            node = self._nodes.get(digest)
            if node is None:
                node = self._nodes[digest] = _Node(num_chars)
            else:
                self._nodes.move_to_end(digest)
            node.holders.add(replica)
        if node is not None and replica not in node.ends_on:
            node.ends_on.add(replica)
            self._conversations[replica] = self._conversations.get(replica, 0) + 1
        self._evict()

    def num_conversations(self, replica: str) -> int:
        """Prompts that ended on `replica` (and are still in the index)."""
        return self._conversations.get(replica, 0)

    def forget(self, replica: str) -> None:
        """The replica is gone (its cache with it): nothing is routed to it for what it held."""
        for digest in list(self._nodes):
            node = self._nodes[digest]
            node.holders.discard(replica)
            node.ends_on.discard(replica)
            if not node.holders:
                del self._nodes[digest]
        self._conversations.pop(replica, None)

    def _evict(self) -> None:
        while len(self._nodes) > self.max_nodes:
            _, node = self._nodes.popitem(last=False)
            for replica in node.ends_on:
                self._conversations[replica] -= 1


def _chain(segments: tuple[str, ...]):
    """Each part's hash chained to its prefix's: equal digests, equal prefixes."""
    digest = b""
    for segment in segments:
        digest = hashlib.blake2b(digest + segment.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        yield digest


# --- the decision ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """A replica as the router sees it at the moment of choosing."""

    replica: str
    num_ongoing: int  # requests sent to it and not yet finished
    match: PrefixMatch = NO_MATCH
    num_conversations: int = 0  # prompts that ended on it


def rank_replicas(candidates: list[Candidate], max_imbalance: int) -> list[str]:
    """The replicas in the order to try them (the next is tried when one refuses: its queue is
    full). First the one holding the longest conversation this request continues, unless its
    queue exceeds the least loaded one's by more than `max_imbalance`; else the least loaded,
    then the fewest conversations, then the longest prefix held."""
    if not candidates:
        return []
    by_load = sorted(candidates, key=lambda candidate: (candidate.num_ongoing, candidate.num_conversations,
                                                        -candidate.match.num_held_chars))
    holders = [candidate for candidate in candidates if candidate.match.holds_conversation]
    if holders:
        home = max(holders, key=lambda candidate: (candidate.match.num_conversation_chars, -candidate.num_ongoing))
        if home.num_ongoing - by_load[0].num_ongoing <= max_imbalance:
            return [home.replica, *(candidate.replica for candidate in by_load if candidate is not home)]
    return [candidate.replica for candidate in by_load]


@dataclass
class _Assignment:
    replica: str
    is_confirmed: bool
    at: float


class LoadBook:
    """Requests per replica, counted from the moment the router picks a replica for them (so
    requests that arrive together spread, before any replica has taken one) until they end. A
    pick is replaced by the next pick for the same request (its replica refused it), and by the
    replica that took it."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._assignments: dict[str, _Assignment] = {}
        self._counts: dict[str, int] = {}

    def num_ongoing(self, replica: str) -> int:
        return self._counts.get(replica, 0)

    def pick(self, request_id: str, replica: str) -> None:
        self._drop_stale()
        self._move(request_id, replica, is_confirmed=False)

    def confirm(self, request_id: str, replica: str) -> None:
        self._move(request_id, replica, is_confirmed=True)

    def finish(self, request_id: str) -> None:
        assignment = self._assignments.pop(request_id, None)
        if assignment is not None:
            self._count(assignment.replica, -1)

    def forget(self, replica: str) -> None:
        self._counts.pop(replica, None)
        for request_id in [key for key, assignment in self._assignments.items() if assignment.replica == replica]:
            del self._assignments[request_id]

    def _move(self, request_id: str, replica: str, is_confirmed: bool) -> None:
        self.finish(request_id)
        self._assignments[request_id] = _Assignment(replica, is_confirmed, self._clock())
        self._count(replica, +1)

    def _count(self, replica: str, change: int) -> None:
        self._counts[replica] = max(0, self._counts.get(replica, 0) + change)

    def _drop_stale(self) -> None:
        oldest = self._clock() - UNCONFIRMED_TTL_S
        for request_id in [key for key, assignment in self._assignments.items()
                           if not assignment.is_confirmed and assignment.at < oldest]:
            self.finish(request_id)


class StateHomes:
    """Where the state of pinned keys lives (the Files and Batch APIs' data, each stored
    response): the replica that first served it, until that replica is gone. Bounded: the least
    recently used go first."""

    def __init__(self, max_keys: int = DEFAULT_MAX_NODES) -> None:
        self.max_keys = max_keys
        self._homes: OrderedDict[str, str] = OrderedDict()

    def home_of(self, key: RoutingKey) -> str | None:
        if not key.is_pinned:
            return None
        home = self._homes.get(key.segments[0])
        if home is not None:
            self._homes.move_to_end(key.segments[0])
        return home

    def note(self, key: RoutingKey, replica: str) -> None:
        """A pinned key's state is on `replica`, unless it already lives elsewhere."""
        if key.is_pinned and key.segments[0] not in self._homes:
            self._homes[key.segments[0]] = replica
            while len(self._homes) > self.max_keys:
                self._homes.popitem(last=False)

    def forget(self, replica: str) -> None:
        for name in [name for name, home in self._homes.items() if home == replica]:
            del self._homes[name]
