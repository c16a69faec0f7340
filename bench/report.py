"""Turn a bench/suite.py run into the README's markdown tables.

Usage:
    python bench/suite.py > run.txt
    python bench/report.py run.txt

Reads the last line of the run (the JSON object with every figure) and prints one table per
model and workload, the memory figures, and the issue's speed targets with the measured ratio
next to each. The last line printed is the JSON object of the targets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# (model, workload, ratio name in the run's JSON, the least the ratio must be)
TARGETS = [
    ("gemma3-270m", "short-greedy", "multiseq_np16_vs_llama_server_np16", 1.10),
    ("gemma3-270m", "short-greedy", "multiseq_np16_vs_llama_cpp_python_sequential", 3.3),
    ("gemma3-270m", "short-sampled", "multiseq_np16_vs_llama_server_np16", 1.10),
    ("smollm2-135m", "short-greedy", "multiseq_np16_vs_llama_server_np16", 1.0),
    ("smollm2-135m", "long-greedy", "multiseq_np16_vs_llama_server_np16", 1.10),
    ("gemma3-270m", "long-greedy", "multiseq_np16_vs_llama_server_np16", 1.10),
    ("smollm2-135m", "shared-prefix", "multiseq_np16_vs_llama_server_prompt_cache_np16", 1.5),
    ("smollm2-135m", "shared-prefix", "multiseq_np16_vs_multiseq_no_prefix_cache_np16", 2.5),
    ("gemma3-270m", "shared-prefix", "multiseq_np16_vs_llama_server_prompt_cache_np16", 1.5),
    ("gemma3-270m", "shared-prefix", "multiseq_np16_vs_multiseq_no_prefix_cache_np16", 2.5),
]
OUTSIDE_DECODE_LIMIT = 0.05
MEMORY_GROWTH_LIMIT = 0.05


def _label(figure: dict) -> str:
    system = figure["system"]
    return f"{system} -np {figure['parallel']}" if "parallel" in figure else system


def _ttft(figure: dict) -> str:
    text = f"{figure['ttft_p50_s']:.2f} / {figure['ttft_p95_s']:.2f}"
    if "ttft_from_admission_p50_s" in figure:
        text += f" ({figure['ttft_from_admission_p50_s']:.2f} / {figure['ttft_from_admission_p95_s']:.2f})"
    return text


def workload_table(figures: list[dict]) -> list[str]:
    lines = ["| system | tok/s | wall s | TTFT p50 / p95 s | outside llama_decode | prompt tokens computed |",
             "|---|---:|---:|---:|---:|---:|"]
    for figure in figures:
        if figure["system"] == "llama-batched-bench":
            rows = ", ".join(f"B={row['batch']}: {row['tg_tokens_per_s']:.0f}" for row in figure["rows"])
            lines.append(f"| llama-batched-bench (decode only) | {rows} | | | |")
            continue
        outside = figure.get("outside_decode_share")
        computed = figure.get("prompt_tokens_computed", figure.get("prompt_tokens"))
        lines.append(f"| {_label(figure)} | {figure['tokens_per_s']:.1f} | {figure['wall_s']:.1f} | {_ttft(figure)} | "
                     f"{'' if outside is None else f'{100 * outside:.1f}%'} | "
                     f"{'' if computed is None else f'{computed:,}'} |")
    return lines


def targets(results: dict) -> list[dict]:
    checked = []
    for model, workload, name, least in TARGETS:
        ratio = results.get(model, {}).get(workload, {}).get("ratios", {}).get(name)
        checked.append({"model": model, "workload": workload, "ratio": name, "target": least, "measured": ratio,
                        "met": ratio is not None and ratio >= least})
    for model, workloads in results.items():
        for workload, entry in workloads.items():
            if workload == "memory":
                checked.append({"model": model, "workload": "memory", "ratio": "rss_growth",
                                "target": MEMORY_GROWTH_LIMIT, "measured": entry["rss_growth"],
                                "met": abs(entry["rss_growth"]) <= MEMORY_GROWTH_LIMIT})
                continue
            for figure in entry["figures"]:
                if figure["system"] == "multiseq" and figure["parallel"] == 16:
                    share = figure["outside_decode_share"]
                    checked.append({"model": model, "workload": workload, "ratio": "outside_decode_share",
                                    "target": OUTSIDE_DECODE_LIMIT, "measured": share,
                                    "met": share <= OUTSIDE_DECODE_LIMIT})
    return checked


def main(path: str) -> None:
    report = json.loads(Path(path).read_text().strip().splitlines()[-1])
    results = report["results"]
    for model, workloads in results.items():
        for workload, entry in workloads.items():
            if workload == "memory":
                print(f"**{model}, memory**: {entry['rss_mb_at_checkpoint']:.0f} MB resident at request "
                      f"{entry['checkpoint_request']}, {entry['rss_mb_at_end']:.0f} MB at request "
                      f"{entry['num_requests']} ({100 * entry['rss_growth']:+.2f}%)\n")
                continue
            print(f"**{model}, {workload}**\n")
            print("\n".join(workload_table(entry["figures"])))
            ratios = ", ".join(f"{name} {value:.2f}" for name, value in entry["ratios"].items()
                               if "batched_bench" not in name)
            print(f"\nratios: {ratios}\n")
            matches = ", ".join(f"{peer} {count}" for peer, count in entry.get("greedy_text_matches", {}).items())
            if matches:
                print(f"greedy texts equal to multiseq's: {matches}\n")
    checked = targets(results)
    print("| target | model, workload | needed | measured | met |\n|---|---|---:|---:|---|")
    for item in checked:
        measured = "n/a" if item["measured"] is None else f"{item['measured']:.3f}"
        print(f"| {item['ratio']} | {item['model']}, {item['workload']} | {item['target']} | {measured} | "
              f"{'yes' if item['met'] else 'no'} |")
    print(json.dumps(checked))


if __name__ == "__main__":
    main(sys.argv[1])
