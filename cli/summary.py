"""The run summary as a table on the terminal."""

from __future__ import annotations

from typing import Any

from rich.table import Table


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
    not_started = f", {summary['not_started']} not started" if summary["not_started"] else ""
    counts = (f"{summary['succeeded']} ok, {summary['failed']} failed, {summary['cancelled']} cancelled"
              f"{not_started} of {summary['requests']}")
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
        ("prompt tokens computed / reused (from RAM)",
         f"{_fmt(summary['prompt_tokens_computed'])} / {_fmt(summary['prompt_tokens_reused'])}"
         f" ({_fmt(summary['prompt_tokens_from_ram'])})"),
        ("prefix hit rate", _percent(summary["prefix_hit_rate"])),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
