"""The live view of a batch run: a pure render(snapshot) and the displays that drive it.

render() turns a RunnerSnapshot (plain values from the engine) and the run's progress into a
rich renderable, with no state and no I/O, so it can be tested on a made-up snapshot. The
displays (dashboard, single progress bar, nothing) are what batch-run ticks while it waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..formats.batchrun import TICK_SECONDS
from ..loop.runner import Runner
from ..loop.stats import RunnerSnapshot, SlotSnapshot

REFRESH_SECONDS = TICK_SECONDS  # a batch run ticks the display this often
_PHASE_STYLES = {"prefill": "yellow", "decode": "green", "idle": "dim"}
_CONTEXT_BAR_WIDTH = 12


@dataclass(frozen=True)
class RunProgress:
    total: int  # items in the file (this run)
    written: int  # result lines written so far
    elapsed_s: float


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _eta(progress: RunProgress) -> str:
    if progress.written == 0 or progress.written >= progress.total:
        return "–" if progress.written == 0 else "0s"
    seconds = progress.elapsed_s / progress.written * (progress.total - progress.written)
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _slot_row(slot: SlotSnapshot) -> list:
    phase = Text(slot.phase, style=_PHASE_STYLES.get(slot.phase, ""))
    if slot.request_id is None:  # an idle slot may keep the last prompt's prefix for reuse
        kept = f"{slot.cached_tokens} kept" if slot.cached_tokens else ""
        return [str(slot.slot), "", phase, "", "", "", kept, "", "", ""]
    context = Table.grid(padding=(0, 1))
    context.add_row(ProgressBar(total=slot.window, completed=slot.context_used, width=_CONTEXT_BAR_WIDTH),
                    f"{slot.context_used}/{slot.window}")
    tail = Text(slot.text_tail.replace("\n", " ⏎ ")[-48:], no_wrap=True, overflow="ellipsis")
    generated = str(slot.generated_tokens)
    if slot.draft_tokens:  # speculative decoding: how many of them came from drafts, of those verified
        generated += f" ({slot.draft_tokens_accepted}/{slot.draft_tokens} drafted)"
    return [str(slot.slot), slot.request_id, phase, str(slot.prompt_tokens), str(slot.cached_tokens or ""),
            generated, context,
            _rate(slot.tokens_per_s), tail, Text("slid", style="magenta") if slot.is_slid else ""]


def _slots_table(snapshot: RunnerSnapshot) -> Table:
    slots = Table(title="slots", title_justify="left", expand=True)
    for name, justify in (("#", "right"), ("id", "left"), ("phase", "left"), ("prompt", "right"),
                          ("reused", "right"), ("gen", "right"), ("context", "left"), ("tok/s", "right"),
                          ("text", "left"), ("", "left")):
        slots.add_column(name, justify=justify, no_wrap=True, ratio=3 if name == "text" else None,
                         min_width=7 if name == "id" else None)
    for slot in snapshot.slots:
        slots.add_row(*_slot_row(slot))
    return slots


def _queue_line(snapshot: RunnerSnapshot) -> Table:
    queue = Table.grid(padding=(0, 2))
    queue.add_row(
        f"waiting [bold]{snapshot.num_waiting}[/]", f"running [bold]{snapshot.num_running}[/]",
        f"done [bold green]{snapshot.num_succeeded}[/]", f"failed [bold red]{snapshot.num_failed}[/]",
        f"cancelled [bold yellow]{snapshot.num_cancelled}[/]")
    return queue


def _throughput_line(snapshot: RunnerSnapshot) -> Table:
    stats = snapshot.stats
    throughput = Table.grid(padding=(0, 2))
    throughput.add_row(
        f"now [bold]{_rate(snapshot.recent_tokens_per_s)}[/] tok/s",
        f"run [bold]{_rate(stats.aggregate_tokens_per_s)}[/] tok/s",
        f"seqs/step [bold]{_rate(stats.avg_seqs_per_decode_step)}[/]",
        f"prefill [bold]{_rate(stats.prefill_tokens_per_s)}[/] tok/s",
        f"decode [bold]{_rate(stats.decode_tokens_per_s)}[/] tok/s",
        f"prefix hits [bold]{_share(stats.prefix_hit_rate)}[/]",
        f"prompt reused [bold]{_share(stats.prompt_reuse_share)}[/]")
    return throughput


def _ram_cache_line(snapshot: RunnerSnapshot) -> Table | Text:
    """The RAM tier of the prefix cache: how full, and how often it saved a prefill."""
    cache = snapshot.host_cache
    if cache is None or cache.limit_bytes == 0:
        return Text("RAM cache off")
    line = Table.grid(padding=(0, 2))
    line.add_row(
        f"RAM cache [bold]{cache.num_bytes / 2**20:.0f}[/] / {cache.limit_bytes / 2**20:.0f} MiB",
        f"entries [bold]{cache.num_entries}[/]", f"saved [bold]{cache.num_saved}[/]",
        f"restored [bold]{cache.num_restored}[/] ({cache.tokens_restored} tokens)",
        f"evicted [bold]{cache.num_evicted}[/]")
    return line


def _pool_line(snapshot: RunnerSnapshot) -> Table | Text:
    """The KV pool the slots share: how full, what sharing saves, what left it for room."""
    pool = snapshot.pool
    if pool is None:
        return Text("")
    line = Table.grid(padding=(0, 2))
    line.add_row(f"KV pool [bold]{pool.cells_used:,}[/] / {pool.size:,} cells",
                 f"held [bold]{pool.tokens_held:,}[/] tokens", f"shared [bold]{pool.tokens_shared:,}[/]",
                 f"moved out [bold]{pool.num_evicted}[/]", f"parked [bold]{pool.num_parked}[/]")
    return line


def render(snapshot: RunnerSnapshot, progress: RunProgress) -> Group:
    """The dashboard for one moment of a run: slots, queue and progress, throughput."""
    bar = Table.grid(padding=(0, 2))
    bar.add_row(ProgressBar(total=max(progress.total, 1), completed=progress.written, width=40),
                f"{progress.written}/{progress.total}", f"ETA {_eta(progress)}", f"elapsed {progress.elapsed_s:.0f}s")
    return Group(_slots_table(snapshot), _queue_line(snapshot), bar, _throughput_line(snapshot),
                 _pool_line(snapshot), _ram_cache_line(snapshot))


def _api_line(requests_by_api: Mapping[str, int]) -> Table | Text:
    """Requests accepted by each API (chat, completions, responses, messages), busiest first:
    which clients the server is serving."""
    if not requests_by_api:
        return Text("requests by API: none yet")
    line = Table.grid(padding=(0, 2))
    line.add_row("requests by API",
                 *(f"{api} [bold]{count:,}[/]" for api, count in
                   sorted(requests_by_api.items(), key=lambda entry: (-entry[1], entry[0]))))
    return line


def render_server(snapshot: RunnerSnapshot, address: str, device: str | None = None,
                  requests_by_api: Mapping[str, int] | None = None,
                  others: Sequence[tuple[str, str, RunnerSnapshot | None]] = ()) -> Group:
    """The dashboard of `multiseq serve`: where it listens and where the model runs, slots,
    queue, throughput, the other models' (name, state, snapshot while loaded), and the requests
    each API has taken."""
    where = f", model on {device}" if device else ""
    return Group(Text(f"serving on {address}{where}", style="bold"), _slots_table(snapshot), _queue_line(snapshot),
                 _throughput_line(snapshot), _pool_line(snapshot), _ram_cache_line(snapshot),
                 *(part for other in others for part in _other_model(*other)), _api_line(requests_by_api or {}))


def _other_model(name: str, status: str, snapshot: RunnerSnapshot | None) -> list:
    """Another model served (several -m): its name and state, and while it is loaded its slots."""
    heading = Text(f"model {name}: {status}", style="bold")
    if snapshot is None:
        return [heading]
    return [heading, _slots_table(snapshot), _queue_line(snapshot), _throughput_line(snapshot)]


class ServerDashboard:
    """The live view of `multiseq serve` on stderr, refreshed from a thread of its own until
    stop(); the runner arrives once the model has loaded, with the server's count of requests
    per API."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._address = ""
        self._runner: Runner | None = None
        self._requests_by_api: Callable[[], Mapping[str, int]] = dict
        self._others: Callable[[], Iterable] = tuple
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="multiseq-dashboard", daemon=True)

    def show(self, runner: Runner, address: str, requests_by_api: Callable[[], Mapping[str, int]] = dict,
             others: Callable[[], Iterable] = tuple) -> None:
        """`others`: the other served models now (each with its name, status and runner, None
        while it is not loaded)."""
        self._runner = runner
        self._address = address
        self._requests_by_api = requests_by_api
        self._others = others
        self._thread.start()

    def _loop(self) -> None:
        with Live(console=self._console, auto_refresh=False, transient=False) as live:
            while not self._stopped.wait(REFRESH_SECONDS):
                others = [(model.name, model.status, None if model.runner is None else model.runner.latest_snapshot)
                          for model in self._others()]
                live.update(render_server(self._runner.latest_snapshot, self._address, self._runner.device,
                                          self._requests_by_api(), others), refresh=True)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()


class _Display:
    """What batch-run does while it waits for results: nothing, by default."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.written = 0
        self.started = time.perf_counter()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        pass

    def note_written(self, count: int = 1) -> None:
        self.written += count

    def tick(self) -> None:
        pass


class DashboardDisplay(_Display):
    """The live dashboard on stderr, refreshed a few times a second."""

    def __init__(self, total: int, runner: Runner, console: Console) -> None:
        super().__init__(total)
        self._runner = runner
        self._live = Live(console=console, auto_refresh=False, transient=False)
        self._last_refresh = 0.0

    def _progress(self) -> RunProgress:
        return RunProgress(self.total, self.written, time.perf_counter() - self.started)

    def __enter__(self):
        self._live.__enter__()
        self.tick()
        return self

    def __exit__(self, *exc_info) -> None:
        self._live.update(render(self._runner.snapshot(), self._progress()), refresh=True)
        self._live.__exit__(*exc_info)

    def tick(self) -> None:
        now = time.perf_counter()
        if now - self._last_refresh >= REFRESH_SECONDS:
            self._last_refresh = now
            self._live.update(render(self._runner.snapshot(), self._progress()), refresh=True)


class ProgressDisplay(_Display):
    """A single progress bar on stderr, for a terminal without the dashboard."""

    def __init__(self, total: int, console: Console) -> None:
        super().__init__(total)
        self._progress = Progress(TextColumn("multiseq"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                  console=console, transient=False)
        self._task = self._progress.add_task("run", total=total)

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._progress.__exit__(*exc_info)

    def note_written(self, count: int = 1) -> None:
        super().note_written(count)
        self._progress.advance(self._task, count)


def open_display(total: int, runner: Runner, console: Console, dashboard: bool | None) -> _Display:
    """The dashboard when asked (default: when stderr is a terminal), else a progress bar on
    a terminal, else nothing."""
    on_terminal = console.is_terminal
    if dashboard if dashboard is not None else on_terminal:
        return DashboardDisplay(total, runner, console)
    return ProgressDisplay(total, console) if on_terminal else _Display(total)
