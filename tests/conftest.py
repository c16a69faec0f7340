"""Shared fixtures: runners on the fake backend (the scheduler's rules, in milliseconds), real
models loaded once per session, and a model folder of their own for the tests that need none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

import pytest
from click.testing import CliRunner

# Every output reader checks its stream against the whole text after each piece (the model
# families' claims about their formats: runner/tools/reader.py), here and in the servers the
# tests start; set before multiseq is imported.
os.environ.setdefault("MULTISEQ_VERIFY_READER", "1")

from fakes import FakeBackend
from helpers import TEST_SEED, TEST_THREADS, SteppedEngine, cores_per_worker, serving

# The servers, batch-runs and examples the tests start in other processes use this worker's
# share of the cores too (the default of -t and RunnerConfig.threads).
os.environ["MULTISEQ_THREADS"] = str(TEST_THREADS)
from multiseq import Engine, Runner, RunnerConfig, SamplingParams
from multiseq.cli.interrupts import Interrupts
from multiseq.cli.job import BatchJob, OpenedRunner
from multiseq.cli.main import cli
from multiseq.formats.reader import TextMode
from multiseq.loading import backend_on, open_model

pytest_plugins = ["pytester"]

THREADS = TEST_THREADS  # MULTISEQ_TEST_THREADS, or every core
SEED = TEST_SEED  # MULTISEQ_TEST_SEED, or 0
RUNNER_THREAD = "multiseq-runner"  # the name of a Runner's worker thread


def pytest_report_header(config):
    """The seed and thread count of this run, to run a failure again as it was (the threads are
    each worker's under pytest-xdist, whose workers are not started yet when this is written)."""
    workers = config.getoption("numprocesses", None) or 0
    threads = THREADS if workers <= 1 or "MULTISEQ_TEST_THREADS" in os.environ else cores_per_worker(workers)
    return (f"multiseq: MULTISEQ_TEST_SEED={SEED} MULTISEQ_TEST_THREADS={threads} "
            f"(the runners' seed and threads; set both to reproduce this run)")


RAY_CLUSTER_CPUS = 3  # two workers or replicas of one thread, and one CPU to spare


MAX_WORKERS = 4  # past a few, every worker's own models and servers cost more than they save


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, up to MAX_WORKERS (each runs llama.cpp on its share)."""
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    """The tests on the shared local Ray cluster run last and together: it starts once
    (seconds) and its idle processes never run beside the other tests."""
    on_ray = [item for item in items if "ray_cluster" in getattr(item, "fixturenames", ())]
    items[:] = [item for item in items if item not in on_ray] + on_ray


# The modules whose tests use the shared Ray cluster (the scheduler below sees node ids, not
# fixtures): under pytest-xdist they run on one worker, so that the cluster starts once.
RAY_TESTS = ("tests/test_ray.py::", "tests/test_ray_serve.py::", "tests/test_docs.py::test_ray_examples_run")


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's load scheduling, the Ray tests one unit of work. (Its own xdist_group
    marks take no effect under pytest 9: they suffix a node id attribute pytest no longer reads.)"""
    from xdist.scheduler import LoadGroupScheduling

    class RayTestsTogether(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "ray-cluster" if nodeid.startswith(RAY_TESTS) else nodeid

    return RayTestsTogether(config, log)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray on loopback with RAY_CLUSTER_CPUS CPUs for every test that needs a
    cluster; its address, which drivers in other processes connect to."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'multiseq[ray]')")
    ray.init(num_cpus=RAY_CLUSTER_CPUS, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def isolated_models_dir(request, tmp_path_factory, monkeypatch):
    """Tests that do not run real models get an empty model folder of their own, so they can
    neither read nor write the user's."""
    if request.node.get_closest_marker("model") is None:
        monkeypatch.setenv("MULTISEQ_MODELS_DIR", str(tmp_path_factory.mktemp("models")))


@pytest.fixture(autouse=True)
def offline_hub_cache(tmp_path_factory, monkeypatch):
    """Every test gets an empty Hugging Face cache of its own and offline mode: none reads the
    user's cache, and none can reach the network (tests that need a hub cache build one)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf-hub")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def isolated_data_dir(tmp_path_factory, monkeypatch):
    """Every test (and every `multiseq serve` it starts) keeps the Files and Batch APIs' data in
    a folder of its own, never in the user's."""
    monkeypatch.setenv("MULTISEQ_DATA_DIR", str(tmp_path_factory.mktemp("data")))


@pytest.fixture
def hub_cache() -> Path:
    """This test's (empty) Hugging Face cache folder: helpers.add_hub_repo fills it."""
    return Path(os.environ["HF_HUB_CACHE"])


# --- the fake backend ------------------------------------------------------------------------

def fake_config(backend: FakeBackend, **config) -> RunnerConfig:
    """A config matching the fake's slots, window and batch size, `config` on top."""
    return RunnerConfig(**{**dict(parallel=backend.num_slots, slot_ctx=backend.window, n_batch=backend.n_batch,
                                  threads=THREADS, seed=SEED), **config})


@pytest.fixture
def make_runner():
    """make_runner(backend, autostart=True, **config): a Runner on a FakeBackend, its config
    matching the fake's slots, window and batch size. Every runner it made is closed with the
    test (closing is idempotent, so a test may close its own), and no runner thread started
    during the test is left running."""
    before = set(threading.enumerate())
    with ExitStack() as runners:
        def make(backend: FakeBackend, autostart: bool = True, **config) -> Runner:
            runner = Runner(fake_config(backend, **config), backend=backend, autostart=autostart)
            runners.callback(runner.close)
            return runner

        yield make
    left = [thread for thread in threading.enumerate() if thread.name == RUNNER_THREAD and thread not in before]
    assert not left, f"runner threads outlive the test: {left}"


@pytest.fixture
def stepped_engine():
    """stepped_engine(backend, **config): an Engine on a FakeBackend that the test steps on its
    own thread (helpers.SteppedEngine), its config as make_runner's."""
    def make(backend: FakeBackend, **config) -> SteppedEngine:
        return SteppedEngine(Engine(fake_config(backend, **config), backend))

    return make


# --- real models -----------------------------------------------------------------------------

def _session_model(request, pytestconfig, name: str):
    """The registry model `name`, loaded once: the plugin's multiseq_model when it is that one."""
    if pytestconfig.getoption("--multiseq-model") == name:
        return request.getfixturevalue("multiseq_model")
    model = open_model(name)
    request.addfinalizer(model.close)
    return model


@pytest.fixture(scope="session")
def smollm(request, pytestconfig):
    return _session_model(request, pytestconfig, "smollm2-135m")


@pytest.fixture(scope="session")
def gemma(request, pytestconfig):
    return _session_model(request, pytestconfig, "gemma3-270m")


@pytest.fixture(scope="session")
def unpacked_model():
    """unpacked_model(name): a registry model loaded once without weight repacking, for
    batch-invariant runners."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            loaded[name] = open_model(name, repack_weights=False)
        return loaded[name]

    yield load
    for model in loaded.values():
        model.close()


def real_config(model, parallel: int, slot_ctx: int, n_batch: int, **config) -> RunnerConfig:
    """A config for a new context on a loaded model, `config` on top."""
    return RunnerConfig(**{**dict(model=model.path, parallel=parallel, slot_ctx=slot_ctx, n_batch=n_batch,
                                  threads=THREADS, seed=SEED), **config})


@pytest.fixture
def real_runner():
    """real_runner(model, parallel, slot_ctx=512, n_batch=512, autostart=True, **config): a
    Runner over a new context on an already loaded model (closed with the test)."""
    runners = []

    def make(model, parallel: int, slot_ctx: int = 512, n_batch: int = 512, autostart: bool = True,
             **config) -> Runner:
        runner = Runner.on_model(model, real_config(model, parallel, slot_ctx, n_batch, **config), autostart=autostart)
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.close()


@pytest.fixture
def stepped_real_engine():
    """stepped_real_engine(model, parallel, slot_ctx=512, n_batch=512, **config): an Engine over
    a new context on an already loaded model, stepped by the test (its context freed with it)."""
    with ExitStack() as contexts:
        def make(model, parallel: int, slot_ctx: int = 512, n_batch: int = 512, **config) -> SteppedEngine:
            runner_config = real_config(model, parallel, slot_ctx, n_batch, **config)
            backend = backend_on(model, runner_config, owns_model=False)
            contexts.callback(backend.close)
            return SteppedEngine(Engine(runner_config, backend))

        yield make


def _assert_slots_hold_only_kept_prefixes(runner) -> None:
    """Every slot is free, and its KV is exactly the prompt prefix the runner keeps in it for
    later requests (nothing generated, nothing of a cancelled or failed request beyond that);
    without the prefix cache, every slot is empty."""
    scheduler, backend = runner.engine.scheduler, runner.backend
    for slot in range(runner.config.parallel):
        kept = len(scheduler.slots[slot].kept)
        assert scheduler.slots[slot].is_free, f"slot {slot} is still busy"
        positions = (backend.slot_pos_min(slot), backend.slot_pos_max(slot))
        assert positions == ((0, kept - 1) if kept else (-1, -1)), f"slot {slot} holds {positions}, keeps {kept}"


@pytest.fixture
def assert_slots_hold_only_kept_prefixes():
    """assert_slots_hold_only_kept_prefixes(runner), for runners on real models."""
    return _assert_slots_hold_only_kept_prefixes


# --- the command line ------------------------------------------------------------------------

@pytest.fixture
def run_cli():
    """run_cli(*args): invoke `multiseq` in-process with click's CliRunner."""
    def invoke(*args: str):
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    return invoke


@pytest.fixture
def start_cli():
    """start_cli(*args, **popen): `multiseq` in its own process (for signals and terminals)."""
    processes = []

    def start(*args: str, **popen) -> subprocess.Popen:
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.PIPE)
        popen.setdefault("text", True)
        process = subprocess.Popen([sys.executable, "-m", "multiseq.cli.main", *args], **popen)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def read_jsonl():
    """read_jsonl(path): the JSON objects of a results file, one per line."""
    return read_lines


@pytest.fixture
def fake_job(make_runner):
    """fake_job(prompts, output, backend=None, interrupts=None, **options) -> exit code: the
    batch-run command's steps (checks, scan, resume, run, summary) on a FakeBackend runner.
    Options are BatchJob's fields (keep_input_order, resume, strict, text_mode, ...)."""
    def run(prompts: Path, output: Path | None, backend: FakeBackend | None = None,
            interrupts: Interrupts | None = None, **options) -> int:
        fake = backend if backend is not None else FakeBackend(num_slots=4, window=64, n_batch=64)
        settings = dict(prompt_format=None, text_mode=TextMode.COMPLETION, defaults=SamplingParams(max_tokens=2),
                        config=RunnerConfig(), keep_input_order=False, resume=False, strict=False, stats_json=None,
                        dashboard=False, open_runner=lambda config: OpenedRunner(make_runner(fake), "fake"))
        settings.update(options)
        job = BatchJob(prompts, output, **settings)
        return job.run(interrupts if interrupts is not None else Interrupts())

    return run


# --- the server ------------------------------------------------------------------------------

@pytest.fixture
def serve_app():
    """serve_app(app) -> base URL: the app served until the test ends."""
    with ExitStack() as stack:
        yield lambda app: stack.enter_context(serving(app))

