"""What `multiseq models list` and `multiseq info` show: the models on this machine (the
registry's, fetched or not, and the GGUF models of the Hugging Face cache), and what llama.cpp
was built with and sees. Plain values first (for --json), then rich tables."""

from __future__ import annotations

import dataclasses
import platform
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .. import models
from ..llama.devices import extra_layouts_are_safe


@dataclass(frozen=True)
class ModelEntry:
    """One model this machine has, or can fetch (a registry model not fetched yet)."""

    name: str
    source: str  # "registry" or "huggingface"
    size_bytes: int  # on disk when downloaded; the registry's size otherwise
    downloaded: bool
    path: str | None  # where it is, when downloaded
    description: str = ""
    is_default: bool = False  # the model -m defaults to


def model_entries() -> list[ModelEntry]:
    """The registry's models, then every GGUF model in the Hugging Face cache."""
    entries = []
    for spec in models.MODELS.values():
        path = models.local_path(spec)
        downloaded = path.exists()
        entries.append(ModelEntry(spec.name, "registry", path.stat().st_size if downloaded else spec.size_bytes,
                                  downloaded, str(path) if downloaded else None, spec.description,
                                  spec.name == models.DEFAULT_MODEL))
    for cached in models.hub.cached_ggufs():
        entries.append(ModelEntry(cached.name, "huggingface", cached.size_bytes, True, str(cached.path)))
    return entries


def folders() -> dict[str, Any]:
    return {"models_dir": str(models.models_dir()), "hf_hub_cache": str(models.hub.cache_dir()),
            "hf_hub_offline": models.hub.is_offline()}


def size_text(num_bytes: int) -> str:
    if num_bytes >= 10**9:
        return f"{num_bytes / 10**9:.1f} GB"
    return f"{num_bytes / 10**6:.0f} MB"


def models_table(entries: list[ModelEntry]) -> Table:
    table = Table("name", "size", "downloaded", "where", "description", box=None, pad_edge=False)
    for entry in entries:
        table.add_row(entry.name + (" (default)" if entry.is_default else ""), size_text(entry.size_bytes),
                      "yes" if entry.downloaded else "no",
                      entry.path or "(fetched on first use)", entry.description)
    return table


def folders_lines(where: dict[str, Any]) -> Text:
    offline = " (HF_HUB_OFFLINE: nothing is downloaded)" if where["hf_hub_offline"] else ""
    return Text(f"registry models: {where['models_dir']}\nHugging Face cache: {where['hf_hub_cache']}{offline}")


def output_console() -> Console:
    """Standard output; when it is not a terminal, wide enough that no line wraps (for grep)."""
    console = Console()
    return console if console.is_terminal else Console(width=10_000)


# --- multiseq info ------------------------------------------------------------------------------

def system_report() -> dict[str, Any]:
    """multiseq's version, the Python and machine under it, llama.cpp's build and devices, and
    the model folders with what they hold."""
    from ..llama.backend import llama_build  # loads llama.cpp's library, not a model

    try:
        multiseq_version = version("multiseq")
    except PackageNotFoundError:
        multiseq_version = "unknown"
    return {
        "multiseq": multiseq_version,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "executable": sys.executable,
        "llama_cpp": dataclasses.asdict(llama_build()),
        **folders(),
        "models": [dataclasses.asdict(entry) for entry in model_entries()],
    }


def render_report(report: dict[str, Any]) -> Group:
    build = report["llama_cpp"]
    offload = "yes" if build["gpu_offload"] else "no (CPU only: -ngl has no effect)"
    head = Table.grid(padding=(0, 2))
    for label, value in (
            ("multiseq", f"{report['multiseq']} (Python {report['python']}, {report['platform']})"),
            ("llama-cpp-python", f"{build['llama_cpp_python']}"),
            ("GPU offload", offload),
            ("backends", ", ".join(build["backends"]) or "(unknown)"),
            ("CPU features", " ".join(build["cpu_features"]) or "(none reported)"),
            ("CPU weight layouts", weight_layouts_text(build["cpu_weight_layouts"])),
            ("system info", build["system_info"]),
            ("mmap / mlock", f"{'yes' if build['supports_mmap'] else 'no'} / {'yes' if build['supports_mlock'] else 'no'}"),
    ):
        head.add_row(Text(label, style="bold"), Text(value))
    devices = Table("device", "kind", "description", "memory free / total", box=None, pad_edge=False)
    for device in build["devices"]:
        devices.add_row(device["name"], device["kind"], device["description"],
                        f"{device['memory_free_bytes'] / 2**30:.1f} / {device['memory_total_bytes'] / 2**30:.1f} GiB")
    entries = [ModelEntry(**entry) for entry in report["models"]]
    parts = [head, Text(""), devices, Text(""), folders_lines(report), models_table(entries)]
    if "model_format" in report:
        parts += [Text(""), model_format_lines(report["model_format"])]
    return Group(*parts)


def weight_layouts_text(layouts: list[str]) -> str:
    """The CPU's weight layouts, and whether models use them (not where AMX's are among them)."""
    if not layouts:
        return "(none)"
    if not extra_layouts_are_safe(layouts):
        return f"{', '.join(layouts)}: not used (this build's AMX kernels stop the process; README, 'Two commands')"
    return ", ".join(layouts)


def kv_lines(kv: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The model's KV: its trained context, bytes a token, and the pool `serve` makes for it."""
    if not kv:
        return []
    per_token = ", ".join(f"{size / 1024:.1f} KiB {types}" for types, size in kv["bytes_per_token"].items() if size)
    lines = [("trained context", f"{kv['trained_context']:,} tokens" if kv["trained_context"] else "(not given)"),
             ("KV per token", per_token or "(not given)")]
    pool = kv.get("serve_pool")
    if pool:
        lines.append(("serve's KV pool", f"{pool['tokens']:,} tokens of f16 ({pool['bytes'] / 2**30:.1f} GiB, bounded "
                      f"by {pool['bounded_by']}) for {pool['slots']} slots: {pool['agent_sessions']} agent sessions "
                      f"of Claude Code's first prompt, more where they share it; a session up to "
                      f"{pool['session_tokens']:,} tokens"))
        window = pool["tokens"] // pool["slots"]
        lines.append(("serve's KV layout", f"a window of {window:,} per slot while every session fits one (attention "
                      f"reads a sequence's own cells only), one pool from the step a session needs more; "
                      f"--kv-unified: one pool always, --no-kv-unified: windows always"))
    return lines


def pooling_text(pooling: str | None) -> str:
    """How the model's embeddings pool (/v1/embeddings, /embedding, batch-run's input lines)."""
    if pooling == "rank":
        return ("a reranker (the GGUF says rank): it scores documents through /v1/rerank; --pooling mean, cls or "
                "last uses it for embeddings instead")
    if pooling:
        return f"pooled by {pooling}, as the GGUF says (--pooling changes it)"
    return "pooled by mean: the GGUF names no pooling (--pooling mean, cls, last or none changes it)"


def model_format_lines(model_format: dict[str, Any]) -> Table:
    """How a model's output is read: its chat template and the tool-call family detected."""
    grid = Table.grid(padding=(0, 2))
    reasoning = model_format["reasoning"]
    for label, value in (
            ("model", model_format["model"]),
            ("chat template", model_format["chat_template"] or "(none: llama.cpp's default)"),
            ("tool-call format", f"{model_format['tool_format']}: {model_format['description']}"),
            ("reasoning", " ... ".join(reasoning) if reasoning else "(none)"),
            ("markers kept", " ".join(model_format["marker_tokens"]) or "(none are control tokens)"),
            *kv_lines(model_format.get("kv")),
            ("embeddings", pooling_text(model_format.get("pooling"))),
    ):
        grid.add_row(Text(label, style="bold"), Text(value))
    return grid
