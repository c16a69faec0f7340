"""Configuration of the runner and of each request's sampling, validated when built.

These dataclasses are the one source of defaults: the command line reads its defaults from
them (`default_of`), so the library and `multiseq batch-run` behave the same when not told
otherwise.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# llama.cpp's defaults, so that a request without settings samples as llama-server would.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05
DEFAULT_REPEAT_LAST_N = 64


class OverflowPolicy(str, Enum):
    """What happens to a prompt longer than its slot's window."""

    SLIDE = "slide"  # keep the first n_keep tokens and the newest tail, drop the middle
    REJECT = "reject"  # end the request with an error naming both sizes


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def default_of(cls: type, name: str) -> Any:
    """The default of one field of a config dataclass (for the command line's options)."""
    for item in dataclasses.fields(cls):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            return item.default_factory()
    raise KeyError(f"{cls.__name__} has no field {name!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request generates. temperature 0 means greedy (argmax).

    The filters run in llama.cpp's order: repeat penalty, top-k, top-p, min-p, then
    temperature, then a draw from the seeded generator of that request.
    """

    max_tokens: int = 256
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K  # 0 disables top-k
    top_p: float = DEFAULT_TOP_P  # 1.0 disables top-p
    min_p: float = DEFAULT_MIN_P  # 0.0 disables min-p
    repeat_penalty: float = 1.0  # 1.0 disables the penalty
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    seed: int | None = None  # None: derived from the runner's seed and the request's id
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        _require(_is_int(self.max_tokens) and self.max_tokens >= 1,
                 f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _require(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature!r}")
        _require(_is_int(self.top_k) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}")
        _require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        _require(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}")
        _require(self.repeat_penalty > 0, f"repeat_penalty must be > 0, got {self.repeat_penalty!r}")
        _require(_is_int(self.repeat_last_n) and self.repeat_last_n >= 0,
                 f"repeat_last_n must be an integer >= 0, got {self.repeat_last_n!r}")
        _require(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**64),
                 f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        _require(all(isinstance(s, str) and s for s in self.stop), f"stop strings must be non-empty strings, got {self.stop!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1

    @property
    def uses_repeat_penalty(self) -> bool:
        return self.repeat_penalty != 1.0 and self.repeat_last_n > 0


@dataclass(frozen=True)
class RunnerConfig:
    """The runner: one llama.cpp context with `parallel` slots of `slot_ctx` tokens each.

    `slot_ctx` is the per-slot cap the runner enforces; llama.cpp may allocate a little more
    (it rounds each slot's window up to a multiple of 256), and that excess is never used.
    """

    model: str | None = None  # registry name or path to a .gguf; None: the default model
    parallel: int = 8
    slot_ctx: int = 2048
    n_batch: int = 512  # most tokens in one llama_decode call
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    n_keep: int = 0  # prompt tokens always kept when sliding (the BOS token is kept besides)
    n_discard: int = 0  # tokens dropped per generation shift; 0: half of what follows n_keep
    overflow: OverflowPolicy = OverflowPolicy.SLIDE
    seed: int | None = None  # base seed for requests without one; None: fresh entropy
    # Overrides the model's template: a llama.cpp built-in template name, Jinja template text,
    # or the path of a Jinja template file (rendered with jinja2; see chat_template.py).
    chat_template: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "overflow", OverflowPolicy(self.overflow))
        _require(_is_int(self.parallel) and self.parallel >= 1, f"parallel must be >= 1, got {self.parallel!r}")
        _require(_is_int(self.slot_ctx) and self.slot_ctx >= 16, f"slot_ctx must be >= 16 tokens, got {self.slot_ctx!r}")
        _require(_is_int(self.n_batch) and self.n_batch >= self.parallel,
                 f"n_batch ({self.n_batch}) must be at least parallel ({self.parallel}) so every slot can decode each step")
        _require(_is_int(self.threads) and self.threads >= 1, f"threads must be >= 1, got {self.threads!r}")
        _require(_is_int(self.n_keep) and 0 <= self.n_keep < self.slot_ctx // 2,
                 f"n_keep must be in [0, slot_ctx/2) = [0, {self.slot_ctx // 2}), got {self.n_keep!r}")
        _require(_is_int(self.n_discard) and self.n_discard >= 0, f"n_discard must be >= 0, got {self.n_discard!r}")
