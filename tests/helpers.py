"""Plain helpers shared by test modules, so that no test module imports another."""

from __future__ import annotations

import hashlib
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


def run_until_done(engine, max_steps: int = 2000) -> dict:
    """Step a thread-free Engine until nothing is left; its results by id, in the order they
    finished."""
    results = {}
    for _ in range(max_steps):
        if not engine.has_work:
            return results
        for result in engine.step().finished:
            results[result.id] = result
    raise AssertionError(f"still working after {max_steps} steps")
