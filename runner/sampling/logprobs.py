"""Log probabilities of output tokens, as OpenAI reports them: the log-softmax of the row the
model produced, before biases, penalties, constraint masks and temperature."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .topk import by_row_groups, top_k_sorted


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a position."""

    token_id: int
    token_bytes: bytes  # what the token stands for; special tokens are empty
    logprob: float

    @property
    def text(self) -> str:
        """The token as text; bytes of a character split across tokens show as \\xNN."""
        return self.token_bytes.decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class TokenLogprob:
    """An output token's log probability, and the top alternatives when they were asked for."""

    token_id: int
    token_bytes: bytes
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()

    @property
    def text(self) -> str:
        return self.token_bytes.decode("utf-8", "backslashreplace")


def log_normalizer(row: np.ndarray) -> float:
    """log(sum(exp(row))), computed without overflow."""
    values = row.astype(np.float64)
    peak = values.max()
    return float(peak + np.log(np.exp(values - peak).sum()))


def token_logprob(raw_row: np.ndarray, token: int, num_top: int,
                  token_bytes: Callable[[int], bytes]) -> TokenLogprob:
    """The log probability of `token` in the unmodified logits row, and the num_top most
    likely tokens of that row, most likely first."""
    normalizer = log_normalizer(raw_row)
    top: tuple[TopLogprob, ...] = ()
    if num_top:
        ids, values = top_k_sorted(raw_row[None, :], min(num_top, raw_row.shape[0]))
        top = _top_entries(ids[0], values[0], normalizer, token_bytes)
    return TokenLogprob(token, token_bytes(token), float(raw_row[token]) - normalizer, top)


def prompt_logprobs(rows: np.ndarray, targets: list[int], num_top: int,
                    token_bytes: Callable[[int], bytes]) -> list[TokenLogprob]:
    """The log probability of each target token in the row before it (a scored prompt: row i
    is the logits after the prompt's token i, targets[i] its token i + 1), with the num_top
    most likely tokens of each row; one pass over the rows, as token_logprob computes one."""
    rows = rows[:len(targets)]
    if not len(targets):
        return []
    [normalizers] = by_row_groups(lambda part: (_log_normalizers(part),), rows)
    chosen = rows[np.arange(len(targets)), targets].astype(np.float64) - normalizers
    tops: list[tuple[TopLogprob, ...]] = [()] * len(targets)
    if num_top:
        ids, top_values = top_k_sorted(rows, min(num_top, rows.shape[1]))
        tops = [_top_entries(row_ids, row_values, normalizer, token_bytes)
                for row_ids, row_values, normalizer in zip(ids, top_values, normalizers.tolist())]
    return [TokenLogprob(token, token_bytes(token), float(logprob), top)
            for token, logprob, top in zip(targets, chosen.tolist(), tops)]


def _log_normalizers(rows: np.ndarray) -> np.ndarray:
    """log(sum(exp(row))) of each row: the exponentials in the rows' float32 (a third of
    float64's time over a 49k vocabulary), summed in float64 (within 1e-8 of log_normalizer)."""
    peaks = np.fmax.reduce(rows, axis=1)
    return peaks.astype(np.float64) + np.log(np.exp(rows - peaks[:, None]).sum(axis=1, dtype=np.float64))


def _top_entries(ids: np.ndarray, values: np.ndarray, normalizer: float,
                 token_bytes: Callable[[int], bytes]) -> tuple[TopLogprob, ...]:
    """One row's most likely tokens (ids and raw values, most likely first) as log probabilities."""
    return tuple(TopLogprob(int(i), token_bytes(int(i)), float(v) - normalizer)
                 for i, v in zip(ids.tolist(), values.tolist()))
