"""The routing rules of `serve --ray` without a cluster: which part of a request is its key, what
the prefix index says each replica holds, and the order the router tries the replicas in, on
recorded prefix sets (agent sessions sharing a system prompt)."""

from __future__ import annotations

import json
import random

import pytest

from multiseq.server.routing import (FILES_AND_BATCHES, NO_KEY, TEXT_BLOCK_CHARS, UNCONFIRMED_TTL_S, Candidate,
                                     LoadBook, PrefixIndex, PrefixMatch, StateHomes, rank_replicas, response_key,
                                     routing_key)

SYSTEM = {"role": "system", "content": "You are an agent. " * 50}
MAX_IMBALANCE = 4


def chat_key(messages: list[dict], **fields):
    return routing_key("POST", "/v1/chat/completions", json.dumps({"messages": messages, **fields}).encode())


def turn(session: int, number: int) -> list[dict]:
    """Session `session`'s conversation as its turn `number` sends it (0: the first)."""
    messages = [SYSTEM]
    for index in range(number + 1):
        messages.append({"role": "user", "content": f"session {session}, question {index}"})
        if index < number:
            messages.append({"role": "assistant", "content": f"answer {index} of session {session}"})
    return messages


def route(index: PrefixIndex, ongoing: dict[str, int], key) -> str:
    """What the router does for one request: rank, take the first, note it."""
    matches = index.match(key)
    candidates = [Candidate(name, ongoing[name], matches.get(name, PrefixMatch()), index.num_conversations(name))
                  for name in ongoing]
    chosen = rank_replicas(candidates, MAX_IMBALANCE)[0]
    index.record(key, chosen)
    return chosen


# --- keys ------------------------------------------------------------------------------------------

def test_a_next_turn_extends_the_key_of_the_turn_before():
    first, second = chat_key(turn(0, 0)), chat_key(turn(0, 1))
    assert second.segments[:len(first.segments)] == first.segments
    assert chat_key(turn(1, 0)).segments[0] == first.segments[0], "sessions share the system prompt's part"
    assert chat_key(turn(1, 0)).segments[1] != first.segments[1]


def test_the_same_message_rebuilt_as_a_new_dict_is_the_same_part():
    reordered = [dict(reversed(list(message.items()))) for message in turn(0, 1)]
    assert chat_key(reordered) == chat_key(turn(0, 1))


def test_tools_come_first_in_the_key_so_other_tools_are_another_conversation():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with_tools = chat_key(turn(0, 0), tools=tools)
    assert with_tools.segments[1:] == chat_key(turn(0, 0)).segments
    assert with_tools.segments[0].startswith("tools:")


def test_anthropic_and_responses_bodies_have_keys_of_their_own_parts():
    messages = routing_key("POST", "/v1/messages", json.dumps(
        {"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode())
    assert [part.split(":")[0] for part in messages.segments] == ["system", "message"]
    responses = routing_key("POST", "/v1/responses", json.dumps({"instructions": "Be brief.", "input": "hi"}).encode())
    assert [part.split(":")[0] for part in responses.segments] == ["instructions", "input"]


def test_a_plain_prompt_is_cut_in_blocks_and_a_longer_one_shares_them():
    prompt = "x" * (2 * TEXT_BLOCK_CHARS + 10)
    short = routing_key("POST", "/v1/completions", json.dumps({"prompt": prompt}).encode())
    longer = routing_key("POST", "/v1/completions", json.dumps({"prompt": prompt + "y" * TEXT_BLOCK_CHARS}).encode())
    assert len(short.segments) == 3 and longer.segments[:2] == short.segments[:2]


def test_state_kept_by_one_server_has_pinned_keys():
    for method, path in (("POST", "/v1/files"), ("GET", "/v1/batches/batch_1"), ("POST", "/v1/batches")):
        assert routing_key(method, path, b"") == routing_key("GET", "/v1/files", b"")
        assert routing_key(method, path, b"").segments == (FILES_AND_BATCHES,)
    assert routing_key("GET", "/v1/responses/resp_1", b"") == response_key("resp_1")
    continued = routing_key("POST", "/v1/responses", json.dumps({"previous_response_id": "resp_1",
                                                                  "input": "and then?"}).encode())
    assert continued.is_pinned and continued.segments[0] == response_key("resp_1").segments[0]


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v1/chat/completions", b"not json"),
    ("POST", "/v1/chat/completions", b"[1, 2]"),
    ("GET", "/v1/models", b""),
    ("POST", "/tokenize", b'{"content": "hi"}'),
])
def test_requests_without_a_conversation_have_no_key(method, path, body):
    assert routing_key(method, path, body) == NO_KEY


# --- the index -------------------------------------------------------------------------------------

def test_the_index_tells_a_continued_conversation_from_a_shared_system_prompt():
    index = PrefixIndex()
    index.record(chat_key(turn(0, 0)), "a")
    continued = index.match(chat_key(turn(0, 1)))["a"]
    assert continued.holds_conversation and continued.num_conversation_chars == continued.num_held_chars
    other_session = index.match(chat_key(turn(1, 0)))["a"]
    assert other_session.num_held_chars > 0 and not other_session.holds_conversation


def test_a_forgotten_replica_holds_nothing_and_eviction_keeps_the_index_bounded():
    index = PrefixIndex(max_nodes=6)
    index.record(chat_key(turn(0, 0)), "a")
    index.record(chat_key(turn(1, 0)), "b")
    index.forget("a")
    assert set(index.match(chat_key(turn(0, 1)))) == {"b"}, "b still holds the system prompt"
    assert index.num_conversations("a") == 0
    for session in range(2, 10):
        index.record(chat_key(turn(session, 0)), "b")
    assert len(index) <= 6


# --- the decision ----------------------------------------------------------------------------------

def test_a_conversation_goes_home_unless_home_is_far_busier():
    held = PrefixMatch(num_held_chars=900, num_conversation_chars=900)
    home, other = Candidate("a", 3, held, 1), Candidate("b", 0, PrefixMatch(), 1)
    assert rank_replicas([other, home], max_imbalance=3) == ["a", "b"]
    busier = Candidate("a", 4, held, 1)
    assert rank_replicas([other, busier], max_imbalance=3) == ["b", "a"], "one past the imbalance: least loaded"


def test_a_new_conversation_goes_to_the_least_loaded_then_to_fewer_conversations():
    shared = PrefixMatch(num_held_chars=800)
    assert rank_replicas([Candidate("a", 2, shared, 0), Candidate("b", 1, PrefixMatch(), 5)], MAX_IMBALANCE)[0] == "b"
    assert rank_replicas([Candidate("a", 0, shared, 3), Candidate("b", 0, PrefixMatch(), 2)], MAX_IMBALANCE)[0] == "b"
    assert rank_replicas([Candidate("a", 0, shared, 2), Candidate("b", 0, PrefixMatch(), 2)], MAX_IMBALANCE)[0] == "a"


def test_agent_sessions_sharing_a_system_prompt_spread_and_each_stays_on_its_replica():
    """8 sessions x 4 turns over 2 replicas, as the agents workload sends them: every session's
    first turn at once, then each session's next turn when its reply is done, in whatever order
    the replies ended (a request counts against its replica until it ends)."""
    index, ongoing = PrefixIndex(), {"a": 0, "b": 0}
    homes: dict[int, list[str]] = {session: [] for session in range(8)}
    for number in range(4):
        for session in random.Random(number).sample(range(8), 8):  # all sent before any ends
            replica = route(index, ongoing, chat_key(turn(session, number)))
            ongoing[replica] += 1
            homes[session].append(replica)
        ongoing = {name: 0 for name in ongoing}
    assert all(len(set(replicas)) == 1 for replicas in homes.values()), homes
    assert sorted(replicas[0] for replicas in homes.values()) == ["a"] * 4 + ["b"] * 4


def test_sessions_that_come_one_after_another_spread_too():
    index, idle = PrefixIndex(), {"a": 0, "b": 0}
    firsts = [route(index, idle, chat_key(turn(session, 0))) for session in range(4)]
    assert sorted(firsts) == ["a", "a", "b", "b"]
    assert [route(index, idle, chat_key(turn(session, 1))) for session in range(4)] == firsts


def test_pinned_state_lives_where_it_was_first_served_until_that_replica_goes():
    homes = StateHomes()
    files = routing_key("POST", "/v1/files", b"")
    assert homes.home_of(files) is None
    homes.note(files, "a")
    homes.note(files, "b")
    assert homes.home_of(routing_key("GET", "/v1/batches", b"")) == "a"
    homes.forget("a")
    assert homes.home_of(files) is None
    homes.note(chat_key(turn(0, 0)), "b")
    assert homes.home_of(chat_key(turn(0, 0))) is None, "a conversation is not pinned state"


def test_the_load_book_counts_a_request_from_its_pick_to_its_end_once():
    now = [0.0]
    book = LoadBook(clock=lambda: now[0])
    book.pick("r1", "a")
    book.pick("r2", "a")
    assert book.num_ongoing("a") == 2, "picked together, counted at once"
    book.pick("r2", "b")  # a refused it
    book.confirm("r2", "b")
    assert (book.num_ongoing("a"), book.num_ongoing("b")) == (1, 1)
    book.finish("r2")
    book.finish("r2")
    assert book.num_ongoing("b") == 0
    now[0] += UNCONFIRMED_TTL_S + 1  # r1 was cancelled while being routed: never taken, never finished
    book.pick("r3", "b")
    assert book.num_ongoing("a") == 0
