"""bench/hostpath.py in quick mode (a tiny vocabulary, 2 slots, a few steps): every phase is
reported with sane numbers, the zero-cost engine's output is what its logits say and the same
on every run, llama.cpp's chain samples the same rows, and the served run streams every token."""

from __future__ import annotations

import dataclasses

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import hostpath  # noqa: E402 - bench/ is a folder of scripts, not a package

VOCAB = 1024
STEPS = 4


def expected_greedy_text(case: hostpath.Case, index: int) -> str:
    """What request `index` (in slot `index`) must write greedily: decode number k gives slot
    j the backend's row (k + j) mod the number of distinct rows, and the argmax is the token."""
    tables = hostpath.vocabulary(case.vocab)
    rows = tables.rows
    tokens = [int(rows[(step + index) % len(rows)].argmax()) for step in range(case.steps + 1)]
    return b"".join(tables.pieces[token] for token in tokens).decode("utf-8")


@pytest.mark.parametrize("sampling", hostpath.SAMPLINGS)
def test_every_phase_is_reported_and_the_phases_add_up_to_the_step(sampling):
    case = hostpath.Case(slots=2, vocab=VOCAB, sampling=sampling, steps=STEPS)
    report = hostpath.measure(case, compare_steps=1)
    run = report.run
    assert run.num_steps == STEPS, "one measured step per decoded token, the prefill step left out"
    assert list(run.phase_ms) == list(hostpath.PHASES)
    measured = [phase for phase in hostpath.PHASES if phase != "other"]
    assert all(run.phase_ms[phase] > 0 for phase in measured if phase != "read"), run.phase_ms
    assert run.phase_ms["other"] >= 0 and run.phase_ms["read"] == 0, "plain prompts: no reader"
    assert sum(run.phase_ms[phase] for phase in measured) <= run.total_ms
    assert sum(run.phase_ms.values()) == pytest.approx(run.total_ms)
    assert run.total_ms < 1000, "a step of 2 rows over 1,024 tokens takes far less than a second"
    assert 0 < run.tokens_per_second < float("inf")
    assert report.read_floor_ms > 0 and report.chain.fill_ms > 0 and report.chain.apply_ms > 0
    assert [len(step) for step in report.chain.tokens] == [case.slots]


def test_greedy_output_is_what_the_logits_say_and_the_same_on_every_run():
    case = hostpath.Case(slots=2, vocab=VOCAB, sampling="greedy", steps=6)
    first, second = hostpath.run_engine(case), hostpath.run_engine(case)
    assert first.texts == second.texts
    assert first.texts == [expected_greedy_text(case, index) for index in range(case.slots)]
    assert first.texts[0] != first.texts[1], "each slot reads its own rows"


def test_seeded_sampling_is_reproducible_and_not_greedy():
    case = hostpath.Case(slots=2, vocab=VOCAB, sampling="sampled", steps=16)
    first, second = hostpath.run_engine(case), hostpath.run_engine(case)
    assert first.texts == second.texts
    assert first.texts != [expected_greedy_text(case, index) for index in range(case.slots)]


def test_llama_cpp_greedy_chain_picks_each_rows_argmax():
    case = hostpath.Case(slots=2, vocab=VOCAB, sampling="greedy", steps=STEPS)
    chain = hostpath.llama_chain_ms(case, repeats=2)
    backend = case.backend()
    assert chain.tokens == [backend.step_logits(step, case.slots).argmax(axis=1).tolist() for step in range(2)]


def test_llama_cpp_sampled_chain_draws_among_the_strong_candidates():
    case = hostpath.Case(slots=2, vocab=VOCAB, sampling="sampled", steps=STEPS)
    chain = hostpath.llama_chain_ms(case, repeats=3)
    backend = case.backend()
    for step, tokens in enumerate(chain.tokens):
        rows = backend.step_logits(step, case.slots)
        top = np.argsort(rows, axis=1)[:, -hostpath.TOP_K:]
        assert all(token in top[row] for row, token in enumerate(tokens))


def test_the_zero_cost_backend_never_ends_a_request_early_and_detokenizes_real_pieces():
    backend = hostpath.ZeroCostBackend(num_slots=2, vocab=VOCAB, window=64, n_batch=128)
    rows = backend.step_logits(0, 2)
    assert (rows.argmin(axis=1) == backend.eos).all()
    assert backend.is_end_of_generation(backend.eos) and backend.token_bytes(backend.eos) == b""
    assert backend.token_bytes(65) == b"A"
    assert any(len(backend.token_bytes(token).decode("utf-8")) < len(backend.token_bytes(token))
               for token in range(hostpath.NUM_BYTE_TOKENS, VOCAB)), "some pieces are not ASCII"
    assert np.shares_memory(backend.step_logits(3, 2), backend.step_logits(3, 2)), "rows are views, not copies"


@pytest.mark.parametrize("stream_interval", [0.0, 0.02])
def test_served_quick_run_streams_every_token(stream_interval):
    """Every token reaches the clients (run_served raises otherwise), every step or joined."""
    case = hostpath.Case(slots=2, vocab=VOCAB, sampling="greedy", steps=STEPS)
    with hostpath.client_process() as clients:
        served = hostpath.run_served(case, stream_interval, clients)
    assert served.engine_tokens_per_second > 0 and served.server_tokens_per_second > 0
    assert served.ratio == served.server_tokens_per_second / served.engine_tokens_per_second
    assert "| 20 ms |" in hostpath.served_table([dataclasses.replace(served, stream_interval_s=0.02)])


def test_quick_command_prints_one_row_per_case(capsys):
    assert hostpath.main(["--quick"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert all(phase in table[0] for phase in hostpath.PHASES)
    assert [line.split("|")[3].strip() for line in table[2:]] == list(hostpath.SAMPLINGS)


def test_bad_arguments_are_refused_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        hostpath.parse_args(["--sampling", "beam"])
    assert "beam" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        hostpath.parse_args(["--slots", "0"])
    assert "--slots" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        hostpath.parse_args(["--stream-interval", "-0.1"])
    assert "--stream-interval" in capsys.readouterr().err


def test_a_familys_reader_reads_the_chats_and_off_it_reads_nothing():
    """--readers FAMILY submits chats whose prompt opens the family's reasoning: their outputs
    are read (here once each, at their end, as nothing asks the pieces); FAMILY:off the same
    chats, not read."""
    on = hostpath.run_engine(hostpath.Case(slots=2, vocab=VOCAB, sampling="greedy", steps=STEPS, reader="qwen3-xml"))
    off = hostpath.run_engine(hostpath.Case(slots=2, vocab=VOCAB, sampling="greedy", steps=STEPS, reader="qwen3-xml",
                                            reads=False))
    assert on.phase_ms["read"] > 0 and off.phase_ms["read"] == 0
    assert on.case.reader_label == "qwen3-xml" and off.case.reader_label == "qwen3-xml:off"
