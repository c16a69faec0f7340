"""The run summary: counts, wall time, throughput, TTFT percentiles, prefill and decode rates."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.table import Table

from ..runner import Result, RunStats


def percentile(values: list[float], percent: float) -> float | None:
    return float(np.percentile(values, percent)) if values else None


def summarize(results: list[Result], num_invalid: int, stats: RunStats, wall_s: float) -> dict[str, Any]:
    """Everything the summary table shows, as plain JSON-ready values."""
    ttfts = [r.timings.ttft_s for r in results if r.timings.ttft_s is not None]
    generated = sum(r.completion_tokens for r in results)
    return {
        "requests": len(results) + num_invalid,
        "succeeded": sum(r.ok for r in results),
        "failed": sum(r.finish_reason.value == "error" for r in results) + num_invalid,
        "cancelled": sum(r.finish_reason.value == "cancelled" for r in results),
        "truncated": sum(r.truncated for r in results),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "generated_tokens": generated,
        "wall_s": wall_s,
        "tokens_per_s": generated / wall_s if wall_s > 0 else None,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "prefill_tokens_per_s": stats.prefill_tokens_per_s,
        "avg_seqs_per_decode_step": stats.avg_seqs_per_decode_step,
        "outside_decode_share": stats.outside_decode_share,
        "prompt_tokens_computed": stats.prompt_tokens,
        "prompt_tokens_reused": stats.prompt_tokens_reused,
        "prefix_hit_rate": stats.prefix_hit_rate,
    }


def _fmt(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def render_summary(summary: dict[str, Any]) -> Table:
    table = Table(title="multiseq run", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    counts = (f"{summary['succeeded']} ok, {summary['failed']} failed, {summary['cancelled']} cancelled"
              f" of {summary['requests']}")
    rows = [
        ("requests", counts),
        ("truncated (slid or shifted)", _fmt(summary["truncated"])),
        ("prompt / generated tokens", f"{_fmt(summary['prompt_tokens'])} / {_fmt(summary['generated_tokens'])}"),
        ("wall time", _fmt(summary["wall_s"], " s", 2)),
        ("throughput (generated)", _fmt(summary["tokens_per_s"], " tok/s")),
        ("time to first token p50 / p95",
         f"{_fmt(summary['ttft_p50_s'], ' s', 2)} / {_fmt(summary['ttft_p95_s'], ' s', 2)}"),
        ("decode rate", _fmt(summary["decode_tokens_per_s"], " tok/s")),
        ("prefill rate", _fmt(summary["prefill_tokens_per_s"], " tok/s")),
        ("avg sequences per decode step", _fmt(summary["avg_seqs_per_decode_step"], "", 2)),
        ("prompt tokens computed / reused",
         f"{_fmt(summary['prompt_tokens_computed'])} / {_fmt(summary['prompt_tokens_reused'])}"),
        ("prefix hit rate", _percent(summary["prefix_hit_rate"])),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
