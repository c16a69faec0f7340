"""llama.cpp's sampling chain written plainly over the whole vocabulary: what the fast sampler
must match."""

from __future__ import annotations

import numpy as np

from multiseq.config import SamplingParams


def reference_distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """llama.cpp's chain written plainly over the whole vocabulary."""
    order = np.argsort(-logits, kind="stable")
    kept = order[: params.top_k] if params.top_k > 0 else order
    values = logits[kept].astype(np.float64)
    probs = np.exp(values - values.max())
    probs /= probs.sum()
    cumulative = np.cumsum(probs)
    cut = int(np.searchsorted(cumulative, params.top_p)) + 1 if params.top_p < 1 else len(kept)
    kept, values = kept[:cut], values[:cut]
    if params.min_p > 0:
        mask = values >= values[0] + np.log(params.min_p)
        kept, values = kept[mask], values[mask]
    tempered = np.exp((values - values.max()) / params.temperature)
    distribution = np.zeros_like(logits, dtype=np.float64)
    distribution[kept] = tempered / tempered.sum()
    return distribution
