"""The `multiseq` command: batch-run a prompts file, serve the model over HTTP, manage the models."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from .. import models
from ..config import OverflowPolicy, RunnerConfig, SamplingParams, default_of
from ..llama.kv_sizing import AGENT_SESSION_TOKENS
from ..errors import BackendError
from ..loop.runner import Runner
from . import info
from .models_commands import models_group, resolve_model, tool_family_report
from .interrupts import EXIT_INTERRUPTED, Interrupts
# Only the server's defaults at import: the app itself (Starlette, uvicorn, the Batch API's
# store) is imported by `serve`, so that batch-run starts without it.
from ..server.limits import (DEFAULT_KEEP_ALIVE_SECONDS, DEFAULT_MAX_BATCH_LINES, DEFAULT_MAX_BODY_BYTES,
                             DEFAULT_MAX_QUEUE, DEFAULT_MAX_UPLOAD_BYTES, DEFAULT_PREPARE_TIMEOUT_SECONDS,
                             DEFAULT_SEND_TIMEOUT_SECONDS, MAX_STREAM_INTERVAL_SECONDS)
from ..server.routing import ROUTINGS
from ..models.folders import DATA_DIR_VARIABLE
from .dashboard import ServerDashboard
from .images import DEFAULT_IMAGE_PROMPT, image_prompts_file
from .job import BatchJob, OpenedRunner
from .presets import preset_models, served_names
from .served import MemorySize, duration, named_adapters, resolved_config, serve_config, served_models
from .options import (SERVE_STEP_TOKENS, StreamInterval, engine_options, overflow_option, runner_config,
                      sampling_defaults, sampling_options)
from ..formats.reader import PromptFormat, TextMode

if TYPE_CHECKING:  # the HTTP app is imported only by `serve` (batch-run starts faster without it)
    from ..server import ServerSettings

stderr = Console(stderr=True)
LOOPBACK = "127.0.0.1"
LOCAL_HOSTS = (LOOPBACK, "localhost", "::1")
DEFAULT_PORT = 8080  # llama-server's
API_KEY_VARIABLE = "MULTISEQ_API_KEY"


@click.group()
@click.version_option(package_name="multiseq")
def cli() -> None:
    """multiseq: run many prompts at once over one llama.cpp context, or serve them over HTTP."""


cli.add_command(models_group)


# --- info ------------------------------------------------------------------------------------

@cli.command("info")
@click.argument("model", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of tables.")
def info_command(model: str | None, as_json: bool) -> None:
    """What multiseq runs on: its version, llama.cpp's build (backends, GPU offload, CPU
    features), the devices llama.cpp sees, and the model folders with what they hold. Given a
    MODEL (a name, hf:OWNER/REPO or a .gguf path), also how its output is read: the tool-call
    and reasoning format detected from its chat template (its vocabulary alone is loaded)."""
    report = info.system_report()
    if model is not None:
        report["model_format"] = tool_family_report(model)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    info.output_console().print(info.render_report(report))


# --- batch-run -----------------------------------------------------------------------------

class _BatchRunCommand(click.Command):
    """batch-run, which takes a prompts file or --images DIR: exactly one, checked as its
    arguments are parsed (as click checks a required argument)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        if (ctx.params.get("prompts_file") is None) == (ctx.params.get("images_dir") is None):
            raise click.UsageError("give a PROMPTS_FILE, or --images DIR (not both)", ctx)
        return rest


@cli.command("batch-run", cls=_BatchRunCommand)
@click.argument("prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False)
@click.option("--images", "images_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Instead of a prompts file: ask --prompt about every image in this folder (and below), a "
                   "result per file, its path as the id (--resume takes up where a run stopped). Needs --mmproj.")
@click.option("--prompt", "image_prompt", default=DEFAULT_IMAGE_PROMPT, show_default=True,
              help="With --images: what is asked about each image.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Results file (JSON lines). Default: standard output.")
@click.option("--format", "prompt_format", type=click.Choice([f.value for f in PromptFormat]),
              help="Input format; detected from the file when not given.")
@click.option("--text-mode", type=click.Choice([m.value for m in TextMode]), default="chat", show_default=True,
              help="Plain-text lines as chat messages, or as raw text to continue.")
@engine_options()
@overflow_option(default_of(RunnerConfig, "overflow"))
@sampling_options(default_of(SamplingParams, "max_tokens"), "Tokens to generate.")
@click.option("--order", type=click.Choice(["finish", "input"]), default="finish", show_default=True,
              help="Write results as they finish, or in input order.")
@click.option("--errors", "errors_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write failed lines here instead of with the results (as OpenAI's error file).")
@click.option("--resume", is_flag=True, help="Skip ids already finished in --output; run the rest and append.")
@click.option("--strict", is_flag=True, help="Stop before running if any line is bad.")
@click.option("--stats-json", type=click.Path(dir_okay=False, path_type=Path), help="Write the run summary as JSON.")
@click.option("--dashboard/--no-dashboard", default=None,
              help="Live view of the slots. Default: on when standard error is a terminal.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Spread the rows over Ray actors, each a runner with -np slots and -t threads: on a local "
                   "Ray started on this machine, or on the cluster at ADDRESS. Needs multiseq[ray].")
@click.option("--workers", type=click.IntRange(1), help="Ray actors (with --ray). Default: 1.")
@click.option("--worker-gpus", type=click.FloatRange(0), help="GPUs Ray gives each worker (with --ray; Ray hides "
              "the GPUs from a worker that asks for none, so give 1 with -ngl). Default: 0.")
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp warnings.")
def batch_run(prompts_file: Path | None, images_dir: Path | None, image_prompt: str, output: Path | None,
              prompt_format: str | None, text_mode: str, order: str, errors_file: Path | None, resume: bool,
              strict: bool, stats_json: Path | None, dashboard: bool | None, ray_address: str | None,
              workers: int | None, worker_gpus: float | None, verbose: bool, **options) -> None:
    """Run every prompt in PROMPTS_FILE and write one result per line.

    PROMPTS_FILE is JSON lines ({"id"?, "prompt" | "messages", ...}), plain text (one prompt
    per line) or an OpenAI Batch API input file, of any size: it is read as the run goes; or,
    with --images DIR, the images of a folder, each asked --prompt. Results
    follow the same format (OpenAI Batch output for OpenAI input); --errors FILE puts the failed
    lines in FILE (rewritten on each run, --resume included). A summary goes to standard error.
    Exit code: 0 when every item succeeded, 1 when some failed or were cancelled, 2 for a usage
    or input error (nothing ran), 3 when results could not be written (the run stopped), 130
    when interrupted."""
    logging.getLogger("multiseq.llama").setLevel(logging.WARNING if verbose else logging.ERROR)
    defaults = sampling_defaults(options)
    config = runner_config(options)
    media_root = None
    if images_dir is not None:
        if not config.mmproj:
            raise click.UsageError("--images needs the model's projector: --mmproj FILE")
        prompts_file, media_root = image_prompts_file(images_dir, image_prompt), images_dir
    open_runner = _open_runner
    if ray_address is not None:
        if dashboard:
            raise click.UsageError("--dashboard shows the slots of one runner; with --ray a progress bar shows the run")
        dashboard = False
        open_runner = _ray_runner_opener(None if ray_address == "local" else ray_address, workers or 1,
                                         worker_gpus or 0)
    elif workers is not None or worker_gpus is not None:
        raise click.UsageError(f"{'--workers' if workers is not None else '--worker-gpus'} needs --ray")
    job = BatchJob(prompts_file, output, PromptFormat(prompt_format) if prompt_format else None, TextMode(text_mode),
                   defaults, config, order == "input", resume, strict, stats_json, dashboard, open_runner,
                   errors_file, media_root)
    with Interrupts() as interrupts:
        try:
            code = job.run(interrupts)
        except KeyboardInterrupt:  # before the run started: nothing to save
            stderr.print("[yellow]interrupted before anything ran[/]")
            code = EXIT_INTERRUPTED
    if code:
        sys.exit(code)


# --- serve -------------------------------------------------------------------------------------

@cli.command("serve")
@engine_options(slot_ctx_help="Most tokens one request holds (prompt + generation): a cap in the shared KV pool "
                              "(default: the model's trained context, or the whole pool when -c is given); with "
                              "--no-kv-unified, each slot's window (default 2048, or -c / -np).",
                step_tokens_help=f"Token budget of a step: every decoding token, then prompt chunks up to it, so "
                                 f"that a long prompt never stalls the streams. [default: {SERVE_STEP_TOKENS}, or "
                                 f"-np if more]", many_models=True)
@click.option("-c", "--ctx-size", type=click.IntRange(16),
              help="KV tokens in all, as llama-server counts them: one pool the slots share, where a session may "
                   "grow to the whole pool (with --no-kv-unified, each of the -np slots gets ctx-size / np). "
                   "[default: the model's trained context x -np, within half the memory free]")
@click.option("--kv-unified/--no-kv-unified", default=None,
              help="Force one KV pool the slots share (a common prompt prefix held once, a long session beside "
                   "short ones), or a fixed window per slot. [default: the pool's cells held in a window per slot "
                   "while every session fits one (attention reads a sequence's own cells only), one pool from "
                   "the step a session needs more] --batch-invariant needs windows.")
@overflow_option(OverflowPolicy.REJECT)
@sampling_options(None, "max_tokens of requests that give none. [default: until the slot's window is full]")
@click.option("--host", default=LOOPBACK, show_default=True,
              help="Address to listen on (0.0.0.0: every interface; then give an --api-key).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: a free one).")
@click.option("--api-key", envvar=API_KEY_VARIABLE, help=f"Require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') "
              f"on every route but /health (also read from {API_KEY_VARIABLE}).")
@click.option("--metrics-public", is_flag=True, help="With --api-key, leave /metrics open (Prometheus scrapers).")
@click.option("--webui/--no-webui", default=True, show_default=True, help="Serve the page at / (every slot, live, and "
              "a chat box); GET /status stays either way.")
@click.option("--allowed-hosts", help="Host header names besides the bound address and localhost, comma-separated "
              "(*: any; *.lan: a domain). Others get 421, which stops DNS rebinding. [default: any when bound to "
              "0.0.0.0, with a warning]")
@click.option("--cors-origins", help="Web origins whose pages may call the API, comma-separated (*: any): CORS "
              "headers are sent and preflights answered for them. Requests from other origins get 403.")
@click.option("--strict-fields", is_flag=True, help="Refuse unknown Chat Completions and Completions fields with a "
              "400 naming the field, instead of ignoring them (named in the x-multiseq-ignored-fields header).")
@click.option("--alias", help="The model id clients send and /v1/models lists. [default: the model's name]")
@click.option("--lora-modules", "lora_modules", metavar="NAME=FILE[:SCALE]", multiple=True,
              help="Serve a LoRA adapter of the first model as a model of its own named NAME (vLLM's flag; again for "
                   "more): its requests run on the first model's slots, the steps taking the adapters in turn.")
@click.option("--models-dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Serve the models this folder holds (beside any -m): each GGUF file, named by its file (the "
                   "first part of a split one), and each subfolder's model with the mmproj projector beside it, named "
                   "by the subfolder.")
@click.option("--models-preset", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Serve the models an INI file describes, llama-server's preset shape: a [NAME] section each, "
                   "its keys serve's options without dashes (model, c, np, cache-type-k, pooling, alias...). See "
                   "docs/server.md.")
@click.option("--models-max", type=click.IntRange(0), default=0, show_default=True,
              help="With several -m: models loaded at once (0: every one). The first ones load at start, the others "
                   "at their first request, the least recently used idle one unloaded to make room.")
@click.option("--models-memory", type=MemorySize(), metavar="SIZE",
              help="With several models: the most memory the server may hold with its models loaded (8G, 6000M), "
                   "each model's share computed from its GGUF before it loads (weights, KV, --cache-ram); the least "
                   "recently used idle one is unloaded to make room.")
@click.option("--models-keep-alive", metavar="DURATION", default="-1", show_default=True,
              help="With several -m: a model idle this long is unloaded, and loaded again at its next request "
                   "(seconds, or 5m, 1h; -1: never). A request's keep_alive (Ollama's) wins. The first model stays.")
@click.option("--max-queue", default=DEFAULT_MAX_QUEUE, show_default=True, type=click.IntRange(1),
              help="Requests that may wait for a slot; beyond that, 503 with Retry-After.")
@click.option("--max-body-mb", default=DEFAULT_MAX_BODY_BYTES / 2**20, show_default=True,
              type=click.FloatRange(0, min_open=True), help="Largest request body; a larger one gets 413.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              help=f"Where the Files and Batch APIs keep uploads, batches and their results, across restarts "
                   f"(also {DATA_DIR_VARIABLE}). [default: the user's data folder for multiseq]")
@click.option("--slot-save-path", type=click.Path(file_okay=False, path_type=Path),
              help="A folder for llama-server's POST /slots/{id}?action=save|restore: a slot's KV kept in a file and "
                   "given back, across restarts.")
@click.option("--max-upload-mb", default=DEFAULT_MAX_UPLOAD_BYTES / 2**20, show_default=True,
              type=click.FloatRange(0, min_open=True), help="Largest file POST /v1/files takes; a larger one gets 413.")
@click.option("--max-batch-lines", default=DEFAULT_MAX_BATCH_LINES, show_default=True, type=click.IntRange(1),
              help="Most requests one batch may hold; a batch with more fails validation.")
@click.option("--prepare-timeout", default=DEFAULT_PREPARE_TIMEOUT_SECONDS, show_default=True,
              type=click.FloatRange(0, min_open=True), help="Seconds a request's preparation (its prompt rendered, "
              "its schema or tools' grammar compiled) may take; past it, 400 (503 when it waited for a thread).")
@click.option("--send-timeout", default=DEFAULT_SEND_TIMEOUT_SECONDS, show_default=True,
              type=click.FloatRange(0, min_open=True), help="Seconds a stream's client may read nothing before "
              "its connection is dropped and its request cancelled.")
@click.option("--keep-alive", default=DEFAULT_KEEP_ALIVE_SECONDS, show_default=True,
              type=click.FloatRange(0, min_open=True), help="Seconds between the ': keep-alive' comments a stream "
              "sends while it has nothing else to send (waiting for a slot), so proxies keep it open.")
@click.option("--stream-interval", default="auto", show_default=True,
              type=StreamInterval(MAX_STREAM_INTERVAL_SECONDS), help="Seconds between a stream's chunks at least "
              "(0: one per step); each chunk carries the text of the steps since the last one: fewer writes, more "
              "tokens/s, that much later a token. auto: in proportion to the streams being fed, so a few streams "
              "get every step and many streams on a fast model (a GPU) share the server's time.")
@click.option("--dashboard/--no-dashboard", default=None,
              help="Live view of the slots instead of access logs. Default: on when standard error is a terminal.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Serve --replicas copies of this server on Ray Serve, behind one endpoint at --host:--port (Ray "
                   "Serve's proxy): on a local Ray started on this machine, or on the cluster at ADDRESS (auto: "
                   "the one `ray start` began here). Needs multiseq[ray].")
@click.option("--replicas", type=click.IntRange(1), help="Servers on the Ray cluster (with --ray), each with -np "
              "slots and -t threads, asking Ray for -t CPUs. Default: 1.")
@click.option("--routing", type=click.Choice(ROUTINGS), help="With --ray: prefix sends each conversation to the "
              "replica holding it (unless that one has -np requests more than the least busy); ray is Ray Serve's "
              "own choice (power of two choices, by queue length). [default: prefix]")
@click.option("--share-prefixes/--no-share-prefixes", default=None, help="With --ray and prefix routing: a replica "
              "given a prompt whose start another replica holds brings that KV over, into its host memory "
              "(--cache-ram), instead of computing it again; a prefill of it under way there is waited for. "
              "[default: on]")
@click.option("--worker-gpus", type=click.FloatRange(0), help="GPUs Ray gives each replica (with --ray; Ray hides "
              "the GPUs from a replica that asks for none, so give 1 with -ngl). Default: 0.")
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp warnings.")
def serve(ctx_size: int | None, kv_unified: bool | None, host: str, port: int, api_key: str | None, metrics_public: bool,
          webui: bool,
          allowed_hosts: str | None, cors_origins: str | None, strict_fields: bool, alias: str | None, max_queue: int,
          max_body_mb: float, data_dir: Path | None, slot_save_path: Path | None, max_upload_mb: float,
          max_batch_lines: int,
          prepare_timeout: float, send_timeout: float, keep_alive: float, stream_interval: float | None,
          lora_modules: tuple[str, ...], models_dir: Path | None, models_preset: Path | None, models_max: int,
          models_memory: int | None, models_keep_alive: str,
          dashboard: bool | None, ray_address: str | None, replicas: int | None, routing: str | None,
          share_prefixes: bool | None, worker_gpus: float | None, verbose: bool, **options) -> None:
    """Serve the model over an OpenAI-compatible HTTP API, batching concurrent clients.

    POST /v1/chat/completions and /v1/completions (streamed or not), GET /v1/models, /health
    (503 while the model loads) and /metrics (Prometheus); the Files and Batch APIs
    (/v1/files, /v1/batches), whose batches fill the slots interactive requests leave free and
    resume after a restart. Ctrl-C or SIGTERM stops it: running streams end with an error
    event and [DONE], requests that come meanwhile get 503, and an idle server (or one still
    loading its model) exits at once. With --ray, --replicas such servers run on Ray Serve behind
    one endpoint, each conversation sent to the replica that holds it."""
    from ..server.door import WILDCARD_ADDRESSES, allowed_hosts_for, parse_list
    from ..server.serve import serve as serve_app
    from ..server.state import ServerSettings
    from ..server.store import StoreError

    _check_ray_options(ray_address, replicas, routing, share_prefixes, worker_gpus, dashboard)
    context = click.get_current_context()
    presets = preset_models(models_preset, serve, context) if models_preset is not None else []
    model_names, options["model"] = options["model"], options["model"][0]
    several = len(model_names) > 1 or models_dir is not None or bool(presets)
    if several and ray_address is not None and (models_max or models_memory or models_keep_alive != "-1"):
        raise click.UsageError("with --ray every model loads on each replica: --models-max, --models-memory and "
                               "--models-keep-alive do not apply")
    if several and models_max == 1:
        raise click.UsageError("--models-max 1 leaves no room for a second model: the first one stays loaded (the "
                               "Batch API, /metrics and the dashboard are its); give 2 or more, or 0 for all")
    config = serve_config({**options, "ctx_size": ctx_size, "kv_unified": kv_unified})
    settings_defaults = sampling_defaults(options)
    # A folder or a models file alone serves its models (without -m, the default model is not served beside them).
    given_elsewhere = (models_dir is not None or bool(presets)) and not options.get("hf_repo") and \
        context.get_parameter_source("model") is click.core.ParameterSource.DEFAULT
    resolved = None if given_elsewhere else resolve_model(config.model)
    described = [(preset.name, resolved_config(serve_config(preset.options), resolve_model(preset.options["model"][0])))
                 for preset in presets]
    configs, names = served_models(config, resolved, alias, model_names[1:], models_dir, described)
    model_aliases, deferred_models = served_names(presets, names)
    configs[0] = dataclasses.replace(configs[0], lora_modules=named_adapters(lora_modules, names))
    settings = ServerSettings(model_name=names[0], more_models=names[1:], models_max=models_max,
                              model_aliases=model_aliases, deferred_models=deferred_models,
                              adapter_models=tuple((name, names[0]) for name, _, _ in configs[0].lora_modules),
                              models_memory_bytes=models_memory,
                              model_keep_alive_s=duration(models_keep_alive, "--models-keep-alive"),
                              api_key=api_key or None, max_queue=max_queue,
                              max_body_bytes=int(max_body_mb * 2**20), defaults=settings_defaults,
                              overflow=config.overflow, data_dir=data_dir or models.data_dir(),
                              slot_save_path=slot_save_path,
                              max_upload_bytes=int(max_upload_mb * 2**20), max_batch_lines=max_batch_lines,
                              metrics_public=metrics_public, strict_fields=strict_fields, webui=webui,
                              allowed_hosts=allowed_hosts_for(host, parse_list(allowed_hosts)),
                              cors_origins=parse_list(cors_origins), prepare_timeout_s=prepare_timeout,
                              send_timeout_s=send_timeout, keep_alive_s=keep_alive,
                              stream_interval_s=stream_interval)
    show_dashboard = dashboard if dashboard is not None else stderr.is_terminal
    _configure_server_logs(verbose, access_log=not show_dashboard)
    if host not in LOCAL_HOSTS and not settings.api_key:
        stderr.print(f"[yellow]warning: listening on {host} without --api-key: anyone who can reach this port can "
                     f"use the model[/]", soft_wrap=True)
    if not parse_list(allowed_hosts) and host in WILDCARD_ADDRESSES:
        stderr.print(f"[yellow]warning: listening on {host} without --allowed-hosts: any Host header is accepted, so "
                     f"a web page may reach this server through DNS rebinding; name this machine's hosts with "
                     f"--allowed-hosts[/]", soft_wrap=True)
    if ray_address is not None:
        _serve_on_ray(configs, settings, None if ray_address == "local" else ray_address, replicas or 1,
                      routing or "prefix", worker_gpus or 0, host, port, share_prefixes is not False)
        return
    address = f"http://{host}:{port}"
    view = ServerDashboard(stderr) if show_dashboard else None
    state = None  # the server's, once it listens: the dashboard reads its models and its requests per API

    def listening(server) -> None:
        nonlocal address, state
        address = f"http://{host}:{server.port}"
        state = server.state
        served = ", ".join((settings.model_name, *settings.more_models))
        stderr.print(f"[bold]multiseq[/] {served}: {config.parallel} slots, {_kv_types(config)} KV, "
                     f"{config.threads} threads; OpenAI API at {address}/v1 (loading)", soft_wrap=True)
        stderr.print(f"files and batches kept in {settings.data_dir}", soft_wrap=True, highlight=False)

    def ready(runner: Runner) -> None:
        where = f" on {runner.device}" if runner.device else ""
        page = f", its page at {address}/" if settings.webui else ""
        stderr.print(f"ready: {settings.model_name} loaded{where}; {describe_kv(runner)}; serving {address}/v1{page}",
                     soft_wrap=True)
        if view is not None:
            view.show(runner, address, state.metrics.requests_by_api, lambda: list(state.models)[1:])

    try:
        failure = serve_app(configs, settings, host, port, access_log=not show_dashboard,
                            on_listening=listening, on_ready=ready)
    except OSError as error:  # the address is taken, or not ours to bind
        raise click.ClickException(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    finally:
        if view is not None:
            view.stop()
    if failure is not None:
        raise click.ClickException(failure)
    stderr.print("multiseq serve stopped")


def _check_ray_options(ray_address: str | None, replicas: int | None, routing: str | None,
                       share_prefixes: bool | None, worker_gpus: float | None, dashboard: bool | None) -> None:
    if ray_address is None:
        given = [name for name, value in (("--replicas", replicas), ("--routing", routing),
                                          ("--share-prefixes" if share_prefixes else "--no-share-prefixes",
                                           share_prefixes), ("--worker-gpus", worker_gpus))
                 if value is not None]
        if given:
            raise click.UsageError(f"{given[0]} needs --ray")
    elif dashboard:
        raise click.UsageError("--dashboard shows the slots of one server; with --ray each replica has its own "
                               "(see /metrics)")


def _serve_on_ray(configs: list[RunnerConfig], settings: ServerSettings, address: str | None, replicas: int,
                  routing: str, gpus: float, host: str, port: int, share_prefixes: bool) -> None:
    """`serve --ray`: the replicas on Ray Serve until Ctrl-C or SIGTERM. Each replica loads the
    models on its own node (fetching them there if needed)."""
    config, served = configs[0], ", ".join((settings.model_name, *settings.more_models))
    try:
        from .. import ray as multiseq_ray
        from .. import ray_serve
    except ImportError as error:
        raise click.ClickException(str(error)) from None
    port = port or _free_port(host)  # Ray Serve's proxy takes no port 0

    def ready(address: str) -> None:
        stderr.print(f"ready: {served} on {replicas} Ray Serve replicas ({config.parallel} slots x "
                     f"{config.session_ctx} tokens, {config.threads} threads each; routing {routing}), serving "
                     f"{address}/v1", soft_wrap=True)

    stderr.print(f"[bold]multiseq[/] {served}: starting {replicas} replicas on Ray Serve (the model is "
                 f"loading)", soft_wrap=True)
    try:
        ray_serve.run(configs, settings, replicas, address, host, port, routing, gpus, on_ready=ready,
                      share_prefixes=share_prefixes)
    except (multiseq_ray.RayError, ray_serve.RayServeError) as error:
        raise click.ClickException(str(error)) from None
    stderr.print("multiseq serve stopped")


def _free_port(host: str) -> int:
    from ..server.serve import open_socket

    with open_socket(host, 0) as probe:
        return probe.getsockname()[1]


def _kv_types(config: RunnerConfig) -> str:
    """The KV cache's element types as -ctk/-ctv name them: one name when K and V agree."""
    return config.cache_type_k if config.cache_type_k == config.cache_type_v else \
        f"{config.cache_type_k}/{config.cache_type_v}"


def describe_kv(runner: Runner) -> str:
    """The KV the runner holds, in words: a pool (its tokens, type, bytes, agent sessions) and
    the cap of a session, or the slots' windows."""
    config, backend = runner.config, runner.backend
    kv_types = _kv_types(config)
    pool = getattr(backend, "pool_size", None)
    if not pool:
        return f"{config.parallel} slots x {runner.window:,} tokens of {kv_types} KV"
    per_token = backend.model.kv_bytes_per_token((config.cache_type_k, config.cache_type_v))
    size = f", {pool * per_token / 2**30:.1f} GiB" if per_token else ""
    return (f"a KV pool of {pool:,} tokens ({kv_types}{size}: {pool // AGENT_SESSION_TOKENS} agent sessions of Claude "
            f"Code's first prompt, {AGENT_SESSION_TOKENS:,} tokens, more where they share it) for {config.parallel} "
            f"slots, a session up to {runner.window:,} tokens; {describe_layout(backend)}")


def describe_layout(backend) -> str:
    """How llama.cpp holds the pool, and why (RunnerConfig.kv_layout)."""
    window = getattr(backend, "layout_window", None)
    if window:
        return (f"held in a window of {window:,} per slot while every session fits one (attention then reads a "
                f"sequence's own cells only), in one pool from the step one needs more (the default; --kv-unified: "
                f"one pool always)")
    return "held in one pool (--kv-unified; the default holds it in a window per slot while every session fits one)"


def _configure_server_logs(verbose: bool, access_log: bool) -> None:
    """Plain lines on stderr: the server's own, uvicorn's, and its access log unless the
    dashboard owns the terminal."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("multiseq.llama").setLevel(logging.WARNING if verbose else logging.ERROR)
    logging.getLogger("uvicorn.error").setLevel(logging.INFO if access_log else logging.WARNING)
    logging.getLogger("uvicorn.access").setLevel(logging.INFO if access_log else logging.WARNING)


def _open_runner(config: RunnerConfig) -> OpenedRunner:
    """The real runner: the model fetched if needed (with progress), loaded, and a context on it."""
    resolved = resolve_model(config.model)
    try:
        return OpenedRunner(Runner(resolved_config(config, resolved)), resolved.name)
    except (BackendError, models.ModelError) as error:
        raise click.ClickException(str(error)) from None


def _ray_runner_opener(address: str | None, workers: int, gpus: float = 0):
    """Opens the runners of a --ray run: Ray joined (or started), then `workers` actors that
    each load the model (fetching it on their node if needed), each given `gpus` GPUs."""
    def open_ray_runner(config: RunnerConfig) -> OpenedRunner:
        try:
            from .. import ray as multiseq_ray
        except ImportError as error:
            raise click.ClickException(str(error)) from None
        try:
            multiseq_ray.connect(address)
            multiseq_ray.check_cpus(workers, config.threads, gpus)
            pool = multiseq_ray.RayRunnerPool(config, workers, gpus=gpus)
        except multiseq_ray.RayError as error:
            raise click.ClickException(str(error)) from None
        return OpenedRunner(pool, pool.model_name, ray_workers=workers)
    return open_ray_runner


if __name__ == "__main__":
    cli()
