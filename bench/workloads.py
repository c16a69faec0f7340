"""The benchmark workloads: the same prompts and settings for every system measured.

Prompts are built deterministically from word lists, so every run and every system sees the
same text. Every request generates exactly `max_tokens` tokens (EOS ignored), so systems are
compared on the same amount of work.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_TASKS = [
    "Write a short story about", "Explain to a child", "List five facts about", "Describe the history of",
    "Give three arguments for and against", "Write a poem about", "Summarize what is known about",
    "Compose a letter to a friend about",
]
_TOPICS = [
    "the ocean", "volcanoes", "the moon landing", "honey bees", "the printing press", "black holes",
    "a lighthouse keeper", "ancient Rome", "electric cars", "the water cycle", "chess", "mountain goats",
    "the first computers", "rain forests", "jazz music", "a lost umbrella",
]
_SENTENCE_PARTS = (
    ["The committee", "A young engineer", "The old library", "Every morning the baker", "The river",
     "Our small team", "The museum guide", "A curious cat", "The weather report", "The new bridge"],
    ["noticed", "described", "questioned", "rebuilt", "celebrated", "measured", "ignored", "explained",
     "painted", "followed"],
    ["the quiet harbor", "a list of forgotten recipes", "the northern hills", "an unusual signal",
     "the annual festival", "a broken clock", "the long winter", "a map of the city", "the village school",
     "a set of old letters"],
    ["before sunrise.", "with great care.", "for the third time.", "without any help.", "in the rain.",
     "during the meeting.", "after a long debate.", "while everyone watched.", "as the bells rang.",
     "near the station."],
)


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[str]
    max_tokens: int
    sampling: dict = field(default_factory=dict)  # temperature, top_k, top_p, min_p, seed

    @property
    def is_greedy(self) -> bool:
        return self.sampling.get("temperature", 0) == 0


def short_prompts(count: int) -> list[str]:
    """Distinct one-line instructions of roughly 8 to 16 tokens."""
    return [f"{_TASKS[index % len(_TASKS)]} {_TOPICS[(index * 7 + index // len(_TASKS)) % len(_TOPICS)]}."
            for index in range(count)]


def long_prompts(count: int, seed: int = 0) -> list[str]:
    """Distinct paragraphs of 22 to 45 sentences, about 200 to 400 tokens on these models,
    ending with an instruction."""
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        sentences = [" ".join(rng.choice(part) for part in _SENTENCE_PARTS) for _ in range(rng.randint(22, 45))]
        prompts.append(f"Notes, part {index + 1}: " + " ".join(sentences) + "\nSummarize these notes:")
    return prompts


GREEDY = {"temperature": 0.0}
# min_p is set to 0 so that no system's own default (llama-server's is 0.05) changes the filter.
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.0, "seed": 1234}


def standard_workloads(num_prompts: int = 64) -> dict[str, Workload]:
    return {
        workload.name: workload
        for workload in (
            Workload("short-greedy", short_prompts(num_prompts), 128, GREEDY),
            Workload("short-sampled", short_prompts(num_prompts), 128, SAMPLED),
            Workload("long-greedy", long_prompts(num_prompts), 64, GREEDY),
        )
    }
