"""A finished sequence's Result: its text (or, with tools, what its output parsed into), why it
ended, its token counts and its timings."""

from __future__ import annotations

import time

from ..request import FinishReason, Result, Timings
from .sequence import Sequence, scores_prompt


def result_of(seq: Sequence, parse: bool = True) -> Result:
    """The result of a sequence that is done. With a tool parser the text is the parsed content,
    with the calls and the reasoning beside it; parse=False reports the raw text instead (after
    the parser itself failed)."""
    assert seq.is_done, "only a finished sequence has a result"
    text, reason, tools = seq.text, seq.ending.reason, {}
    if seq.pieces.tool_parser is not None and parse:
        parsed = seq.pieces.parsed()
        text = parsed.content or ""
        tools = {"tool_calls": parsed.tool_calls, "reasoning": parsed.reasoning, "tool_call_error": parsed.error}
        if parsed.tool_calls and reason is FinishReason.STOP:
            reason = FinishReason.TOOL_CALLS
    return Result(
        id=seq.id,
        text=text,
        finish_reason=reason,
        prompt_tokens=len(seq.prompt_tokens) + seq.prompt_tokens_dropped,
        prompt_tokens_cached=seq.num_cached,
        prompt_tokens_from_ram=seq.num_restored,
        completion_tokens=len(seq.output_tokens),
        timings=timings_of(seq),
        error=seq.ending.error,
        truncated=seq.is_truncated,
        prompt_tokens_dropped=seq.prompt_tokens_dropped,
        tokens_shifted_out=seq.tokens_shifted_out,
        logprobs=None if seq.pieces.logprobs is None else tuple(seq.pieces.logprobs),
        end_logprob=seq.end_of_generation_logprob,
        prompt_token_ids=tuple(seq.prompt_tokens) if scores_prompt(seq) else (),
        prompt_token_bytes=tuple(map(seq.sampler.token_bytes, seq.prompt_tokens)) if scores_prompt(seq) else (),
        prompt_logprobs=tuple(seq.prompt_logprobs) if scores_prompt(seq) else None,
        schema_error=seq.schema_error,
        approximated=seq.sampler.approximated,
        stop_string=seq.pieces.assembler.matched_stop,
        reasoning_tokens=0 if seq.sampler.budget is None else seq.sampler.budget.spent,
        draft_tokens=seq.num_drafted,
        draft_tokens_accepted=seq.num_draft_accepted,
        embedding=seq.embedding.vector() if seq.embedding is not None and seq.embedding.is_complete else None,
        **tools,
    )


def timings_of(seq: Sequence) -> Timings:
    end = seq.finished_at if seq.finished_at is not None else time.perf_counter()
    return Timings(
        queue_wait_s=_elapsed(seq.submitted_at, seq.admitted_at),
        ttft_s=_elapsed(seq.submitted_at, seq.first_token_at),
        prefill_tokens_per_s=_rate(seq.num_prefilled - seq.num_cached, seq.admitted_at, seq.prefilled_at),
        decode_tokens_per_s=_rate(len(seq.output_tokens) - 1, seq.first_token_at, seq.finished_at),
        total_s=end - seq.submitted_at,
    )


def _elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _rate(count: int, start: float | None, end: float | None) -> float | None:
    if start is None or end is None or count <= 0 or end <= start:
        return None
    return count / (end - start)
