"""Plain helpers shared by test modules, so that no test module imports another."""

from __future__ import annotations

import hashlib
import http.client
import itertools
import json
import os
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for_lines(path: Path, count: int, process: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until `path` has `count` lines; fail at once if `process` (which writes it) ends
    first, and after `timeout` seconds if it never gets there."""
    deadline = time.monotonic() + timeout
    while count_lines(path) < count:
        assert process.poll() is None, process.stderr.read() if process.stderr else process.returncode
        assert time.monotonic() < deadline, f"{path} never reached {count} lines"
        time.sleep(0.02)


def read_until(process: subprocess.Popen, pattern: str, timeout: float = 60.0) -> list[str]:
    """Lines of the process's stderr up to the one holding `pattern` (bounded wait). Read by
    blocking readline on a thread: two lines often come in one read, and a select on the pipe
    would not see the second, already in the reader's buffer."""
    lines: list[str] = []

    def read() -> None:
        for line in process.stderr:
            lines.append(line)
            if pattern in line:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not (lines and pattern in lines[-1]):
        raise AssertionError(f"{pattern!r} never came; stderr so far:\n{''.join(lines)}")
    return lines


@contextmanager
def serving(app):
    """Serve an ASGI app with uvicorn on a free loopback port, from a thread; yields the base
    URL once the socket listens, and stops the server (and waits for it) afterwards."""
    from multiseq.server.serve import make_server

    server = make_server(app, "127.0.0.1", 0, access_log=False)
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()
    if not server.listening.wait(30):
        raise RuntimeError("the test server did not start")
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()
        thread.join(30)
        app.state.server.close()  # the batch worker, if any, before the test closes the runner


def post_json(base: str, path: str, body: dict, timeout: float = 30) -> tuple[int, str]:
    """POST a JSON body to a served app: the status and the response's text."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read().decode()
    connection.close()
    return response.status, data


def wait_until(condition, timeout: float = 10.0, what: str = "the condition") -> None:
    """Wait (bounded) for something another thread or process makes true."""
    deadline = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        deadline.wait(0.01)
    raise AssertionError(f"{what} was not reached within {timeout} s")


HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_hub_repo(cache: Path, repo: str, files: dict[str, bytes | Path], commit: str = HUB_COMMIT) -> Path:
    """A model repository in huggingface_hub's cache layout: refs/main names the commit, each
    file of snapshots/COMMIT/ is a relative link to its blob in blobs/ (a blob is the bytes, or a
    link to a real file). Returns the snapshot folder."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snapshot = repo_dir / "snapshots" / commit
    for name, content in files.items():
        blobs = repo_dir / "blobs"
        blobs.mkdir(exist_ok=True)
        digest = hashlib.sha256(name.encode() + (content if isinstance(content, bytes) else str(content).encode()))
        blob = blobs / digest.hexdigest()
        if isinstance(content, Path):
            blob.symlink_to(content)
        else:
            blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


class SteppedEngine:
    """An Engine stepped by the test's own thread, as a Runner's worker steps it (take what
    was posted, plan, execute, update, hand out), for tests of the engine's rules step by step.
    Its requests' results, by id."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.results: dict = {}
        self._numbers = itertools.count()

    def submit(self, request, streams: bool = False) -> str:
        """Queue a request (as the worker queues a prepared one); its id."""
        request_id = request.id or f"req-{next(self._numbers)}"
        self.engine.add(self.engine.new_sequence(request, request_id, streams=streams))
        return request_id

    def step(self) -> bool:
        """One step; False when nothing could be decoded (as Runner's worker turn says)."""
        plan = self.engine.schedule()
        if plan:
            self.engine.update(self.engine.execute(plan))
        self._take_output()
        return bool(plan)

    def steps(self, count: int) -> None:
        for _ in range(count):
            self.step()

    def run(self, max_steps: int = 5000) -> None:
        """Step until nothing could be decoded."""
        for _ in range(max_steps):
            if not self.step():
                return
        raise AssertionError(f"still decoding after {max_steps} steps")

    def result(self, request_id: str):
        self._take_output()
        return self.results[request_id]

    def _take_output(self) -> None:
        for result in self.engine.take_output().finished:
            self.results[result.id] = result


def run_until_done(engine, max_steps: int = 2000, after_each_step=None) -> dict:
    """Step a thread-free Engine until nothing is left; its results by id, in the order they
    finished. after_each_step(), when given, runs after every step (a check of the state)."""
    results = {}
    for _ in range(max_steps):
        if not engine.has_work:
            return results
        for result in engine.step().finished:
            results[result.id] = result
        if after_each_step is not None:
            after_each_step()
    raise AssertionError(f"still working after {max_steps} steps")


# --- the seed and thread count of a run --------------------------------------------------------

def _env_int(name: str, default: int, minimum: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {number}")
    return number


def cores_per_worker(workers: int) -> int:
    """A test process's share of the cores: all of them, or under pytest-xdist an even split
    between its workers (llama.cpp's threads spin on their cores while a step runs, so two
    workers with every core each would take turns at a spin's pace)."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


# MULTISEQ_TEST_SEED: the runners' seed, and the offset of every sampling seed that only has to
# give some draw (sampling_seed); MULTISEQ_TEST_THREADS: the real runners' threads. pytest's
# header prints both, so that a failure can be run again as it was.
TEST_SEED = _env_int("MULTISEQ_TEST_SEED", 0, 0)
TEST_THREADS = _env_int("MULTISEQ_TEST_THREADS",
                        cores_per_worker(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))), 1)


def sampling_seed(base: int) -> int:
    """A request's sampling seed where any draw will do (the test forces what it needs of the
    output, or checks it): `base` under MULTISEQ_TEST_SEED=0, another draw under each other
    value. Distinct bases stay distinct."""
    return base + 1000 * TEST_SEED


# --- whether a build's numbers depend on the shape of a batch ----------------------------------

_PROBE_PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
                  "The three primary colors are", "Water boils at", "A haiku about the sea:", "1, 1, 2, 3, 5, 8,",
                  "Dear Sir or Madam,"]
_batch_dependence: dict[tuple, str | None] = {}


def batch_dependence(model, threads: int = TEST_THREADS, **backend_options) -> str | None:
    """None when this build of llama.cpp, on this machine, gives a sequence the same logits bit
    for bit whatever shares its batch and however its prompt is cut: its prompt decoded alone,
    beside seven other prompts, in two chunks or token by token; its next token decoded alone,
    beside two or seven other slots, or beside another slot's prompt chunk; the same prompt in
    every slot of a batch. Otherwise a sentence saying what changed the logits, and by how
    much. Tests that compare default-mode greedy texts of runs shaped differently (another
    --parallel, a cancelled neighbour, a reused prefix) rest on this: the runner does not
    promise it (docs/how-it-works.md, batch invariance), and a GPU, or a CPU whose kernels
    take tokens in groups, breaks it. Probed once per model, thread count and options."""
    import numpy as np

    from multiseq.llama.backend import LlamaBackend
    from multiseq.llama.batch import BatchEntry

    key = (str(model.path), model.repack_weights, threads, tuple(sorted(backend_options.items())))
    if key in _batch_dependence:
        return _batch_dependence[key]
    prompts = [model.tokenize(prompt) for prompt in _PROBE_PROMPTS]
    prompt, token = prompts[0], prompts[1][-1]
    backend = LlamaBackend(model, len(prompts), 256, 512, threads, **backend_options)

    def rows(*steps: list) -> list:
        """The logits rows of each step's decode, from empty slots."""
        for slot in range(len(prompts)):
            backend.clear_slot(slot)
        return [np.array(backend.decode(entries)) for entries in steps]

    def prefilled(slots) -> list:
        """Each slot's prompt decoded alone, a step each."""
        return [[BatchEntry(slot, prompts[slot], 0, False)] for slot in slots]

    def next_token(slots) -> list:
        return [BatchEntry(slot, [token], len(prompts[slot]), True) for slot in slots]

    try:
        [prompt_alone], [next_alone] = rows([BatchEntry(0, prompt, 0, True)], next_token([0]))
        cut = len(prompt) // 2
        beside = [BatchEntry(0, prompt, 0, True)] + [BatchEntry(slot, prompts[slot], 0, False) for slot in range(1, 8)]
        shapes = {
            "the prompt beside seven others": (rows(beside)[0][0], prompt_alone),
            "the prompt in two chunks": (rows([BatchEntry(0, prompt[:cut], 0, False)],
                                              [BatchEntry(0, prompt[cut:], cut, True)])[1][0], prompt_alone),
            "the prompt token by token": (rows(*([BatchEntry(0, [piece], position, position == len(prompt) - 1)]
                                                 for position, piece in enumerate(prompt)))[-1][0], prompt_alone),
            "a decoded token beside another slot's prompt chunk": (rows(*prefilled([0]), [
                *next_token([0]), BatchEntry(1, prompts[1], 0, False)])[1][0], next_alone),
        }
        for others in (2, 7):
            steps = rows(*prefilled(range(others + 1)), next_token(range(others + 1)))
            shapes[f"a decoded token beside {others} other slots"] = (steps[-1][0], next_alone)
        same = rows([BatchEntry(slot, prompt, 0, True) for slot in range(len(prompts))])[0]
        for slot in range(1, len(prompts)):
            shapes[f"the same prompt in slot {slot} of a full batch"] = (same[slot], same[0])
    finally:
        backend.close()
    changed = [f"{name} (logits differ by up to {np.abs(row - reference).max():.3g})"
               for name, (row, reference) in shapes.items() if not np.array_equal(row, reference)]
    _batch_dependence[key] = f"a sequence's logits change with {'; '.join(changed)}" if changed else None
    return _batch_dependence[key]


def assert_same_greedy_texts(got: list[str], expected: list[str], model, what: str, **backend_options) -> None:
    """got == expected: greedy texts of runs whose batches were shaped differently, on a
    default-mode runner over `model`. Where they differ and this build's numbers depend on the
    batch's shape (batch_dependence), equal texts were never promised (a near tie may go either
    way): the test is skipped, saying that its premise did not hold and where the texts part.
    Where the numbers do not depend on it, a difference fails the test."""
    if got == expected:
        return
    dependence = batch_dependence(model, **backend_options)
    parted = next(index for index, (one, other) in enumerate(zip(got, expected)) if one != other) \
        if len(got) == len(expected) else None
    where = "" if parted is None else f" (text {parted}: {got[parted]!r} against {expected[parted]!r})"
    if dependence is not None:
        import pytest

        pytest.skip(f"premise did not hold: {what} needs a sequence's numbers not to depend on the batch's shape, "
                    f"but on this machine {dependence}; the greedy texts part{where}")
    assert got == expected, f"{what}: the greedy texts part{where}, though this build's logits do not depend on " \
                            f"the batch's shape"


class TemplateModel:
    """What chat rendering reads of a model: its Jinja chat template, and its BOS and EOS texts
    (the tokenizer adds neither), rendered as LlamaModel.render_chat renders a Jinja template."""

    def __init__(self, source: str, bos: str = "<s>", eos: str = "</s>") -> None:
        from multiseq.llama.chat_template import JinjaRenderer

        self.chat_template_source = source
        self.renderer = JinjaRenderer(source, "the model's chat template", bos, eos, add_bos=False)

    def render_chat(self, messages, tools=None, options=None, **shaping) -> str:
        from multiseq.errors import BackendError

        try:
            return self.renderer.render(messages, tools, options, **shaping)
        except ValueError as error:
            raise BackendError(str(error)) from None
