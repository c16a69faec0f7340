"""CanIToolCall's conformance corpus (canitoolcall 0.1.1: 469 recorded outputs of 9 families)
through multiseq's output reader, the entry point the server parses with
(multiseq.tools.output_parser), one test per fixture: the whole text, and the text streamed in
pieces (at the family's markers and at seeded random points) whose deltas must add up to the
same parse. bench/toolcall_conformance.py is the adapter and prints the per-family table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("canitoolcall")
from canitoolcall.fixtures import load_families  # noqa: E402
from canitoolcall.pytest_plugin import assert_conforms, assert_equivalent  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import toolcall_conformance as conformance  # noqa: E402 - bench/ is a folder of scripts, not a package

FAMILIES = load_families()

# Fixtures no correct reader passes, each with the reason (strict: one that starts passing fails
# here, so the list stays true).
KNOWN_FAILURES: dict[str, str] = {}


def test_conformance(canitoolcall_fixture):
    fixture = canitoolcall_fixture
    if fixture.id in KNOWN_FAILURES:
        pytest.xfail(KNOWN_FAILURES[fixture.id])
    replay = conformance.replay_of(fixture, FAMILIES)
    assert replay is not None, f"multiseq has no family for {fixture.family}"
    corpus = FAMILIES.get(fixture.family)
    whole = conformance.whole(replay, fixture)
    assert_conforms(fixture, whole, soft=True, family=corpus)
    for strategy, pieces in conformance.stream_splits(fixture, corpus).items():
        streamed = conformance.read(replay, pieces)
        assert_conforms(fixture, streamed, soft=True, family=corpus)
        try:
            assert_equivalent(whole, streamed)
        except AssertionError as error:
            raise AssertionError(f"streamed as {strategy}: {error}") from None
