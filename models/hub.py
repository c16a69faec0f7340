"""GGUF models from Hugging Face, through huggingface_hub and its cache.

Two spellings name one:

- `hf:OWNER/REPO/FILE.gguf`: that file (FILE may sit in a folder of the repository);
- `hf:OWNER/REPO` or `hf:OWNER/REPO:QUANT` (llama.cpp's `-hf OWNER/REPO[:QUANT]`): the repository's
  GGUF model of that quantization (case-insensitive); without QUANT, Q4_K_M, else Q8_0, else the
  repository's only GGUF model. Projectors and importance matrices (mmproj, imatrix, ...) are
  not models; a model split in parts (NAME-00001-of-00003.gguf) is one model, all its parts
  downloaded and the first one loaded.

Files live in huggingface_hub's cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub) and are downloaded there unless $HF_HUB_OFFLINE is set, with $HF_TOKEN
for private or gated repositories. Offline, or when Hugging Face cannot be reached, the
repository's files are what the cache holds of its main revision. The environment is read at
each call (huggingface_hub reads it once, at import).

Every failure is a ModelError of one line that names the repository and the reason.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError

PREFIX = "hf:"
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's choice when -hf names no quantization
REVISION = "main"
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # llama.cpp's list of side files
_SPLIT_PART = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TRUE = {"1", "ON", "YES", "TRUE"}  # what huggingface_hub counts as a set flag


@dataclass(frozen=True)
class HubRef:
    """What an hf: name asks for: a repository, and a file in it or a quantization (or neither)."""

    repo: str
    file: str | None = None
    quant: str | None = None

    def __str__(self) -> str:
        if self.file:
            return f"{PREFIX}{self.repo}/{self.file}"
        return f"{PREFIX}{self.repo}" + (f":{self.quant}" if self.quant else "")


@dataclass(frozen=True)
class HubModel:
    """A model file in the Hugging Face cache, ready to load."""

    path: Path  # the file's place in a snapshot folder (a link to its blob), the first part of a split model
    repo: str
    file: str  # its path in the repository
    projector: Path | None = None  # the repository's projector for it (mmproj), as llama.cpp's -hf fetches it

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.repo}/{self.file}"


@dataclass(frozen=True)
class CachedGguf:
    """A GGUF file the Hugging Face cache holds (of a repository's main revision)."""

    repo: str
    file: str
    path: Path
    size_bytes: int

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.repo}/{self.file}"


def is_hub_name(text: str) -> bool:
    return text.startswith(PREFIX)


def parse(text: str) -> HubRef:
    """hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf; a ModelError says what a name should be."""
    body = text[len(PREFIX):] if is_hub_name(text) else text
    owner, _, rest = body.partition("/")
    name, _, file = rest.partition("/")
    quant = None
    if not file and ":" in name:
        name, _, quant = name.partition(":")
    repo = f"{owner}/{name}"
    if not _REPO_ID.match(repo) or (file and not file.lower().endswith(".gguf")) or quant == "" or \
            (quant is not None and not re.fullmatch(r"[\w.-]+", quant)):
        raise ModelError(f"{text!r} is not a Hugging Face model: give hf:OWNER/REPO[:QUANT] or "
                         f"hf:OWNER/REPO/FILE.gguf (with -hf: OWNER/REPO[:QUANT])")
    return HubRef(repo, file or None, quant)


def cache_dir() -> Path:
    """huggingface_hub's cache folder, as its environment variables say now."""
    configured = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if configured:
        return Path(os.path.expandvars(configured)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def is_offline() -> bool:
    """$HF_HUB_OFFLINE (or $TRANSFORMERS_OFFLINE), as huggingface_hub reads it."""
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.upper() in _TRUE


# --- choosing a file ---------------------------------------------------------------------------

def is_model_file(path: str) -> bool:
    """A GGUF model, not one of the side files llama.cpp skips (projectors, imatrix, drafts)."""
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(marker in name for marker in _NOT_MODELS)


def _model_key(path: str) -> str:
    """The model a file belongs to: a split model's parts share their stem."""
    match = _SPLIT_PART.match(path)
    return f"{match['stem']}-of-{match['count']}" if match else path


def _models(files: list[str]) -> dict[str, list[str]]:
    """The repository's GGUF models, each with its files in part order (one file unless split)."""
    grouped: dict[str, list[str]] = {}
    for path in sorted(files):
        if is_model_file(path):
            grouped.setdefault(_model_key(path), []).append(path)
    return grouped


def _has_quant(path: str, quant: str) -> bool:
    """Whether the file is of that quantization: named in it between separators, so that Q4_K
    is not Q4_K_M nor IQ4_K (case-insensitive, as llama.cpp's tag)."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?=[.-])", path, re.IGNORECASE) is not None


def choose(ref: HubRef, files: list[str]) -> list[str]:
    """The file(s) of the model `ref` asks for among a repository's files: a split model's parts
    in order, its first part first. A ModelError names the repository and what is wrong."""
    models = _models(files)
    if not models:
        raise ModelError(f"{PREFIX}{ref.repo} has no GGUF model files" + _listing(files))
    if ref.file:
        for parts in models.values():
            if ref.file in parts:
                return parts
        raise ModelError(f"{PREFIX}{ref.repo} has no GGUF model file {ref.file}" + _listing(models))
    for quant in [ref.quant] if ref.quant else DEFAULT_QUANTS:
        matching = [parts for parts in models.values() if _has_quant(parts[0], quant)]
        if len(matching) == 1:
            return matching[0]
        if len(matching) > 1:
            names = ", ".join(parts[0] for parts in matching)
            raise ModelError(f"{PREFIX}{ref.repo}:{quant} is ambiguous: {len(matching)} GGUF models match ({names}); "
                             f"name one with hf:{ref.repo}/FILE.gguf")
    if ref.quant:
        raise ModelError(f"{PREFIX}{ref.repo} has no GGUF model of quantization {ref.quant}" + _listing(models))
    if len(models) == 1:
        return next(iter(models.values()))
    raise ModelError(f"{PREFIX}{ref.repo} has {len(models)} GGUF models and none is {' or '.join(DEFAULT_QUANTS)}: "
                     f"name one with -hf {ref.repo}:QUANT or hf:{ref.repo}/FILE.gguf" + _listing(models))


def _listing(files) -> str:
    names = [parts[0] for parts in files.values()] if isinstance(files, dict) else \
        [path for path in files if path.lower().endswith(".gguf")]
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return f" (it has {shown})" if names else ""


# --- the cache and the hub ---------------------------------------------------------------------

def _cached_repo_files(repo: str) -> list[str] | None:
    """The files the cache holds of the repository's main revision; None when it holds none."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache_dir())
    except CacheNotFound:
        return None
    for cached in info.repos:
        if cached.repo_type == "model" and cached.repo_id == repo:
            for revision in cached.revisions:
                if REVISION in revision.refs:
                    return [file.file_path.relative_to(revision.snapshot_path).as_posix() for file in revision.files]
    return None


def _remote_repo_files(repo: str) -> list[str]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        return HfApi().list_repo_files(repo, revision=REVISION)
    except GatedRepoError:
        raise ModelError(f"{PREFIX}{repo} is gated: accept its terms on Hugging Face and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ModelError(f"{PREFIX}{repo}: no such repository on Hugging Face (or it is private: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelError(f"{PREFIX}{repo} has no {REVISION} revision") from None


def _repo_files(repo: str) -> list[str]:
    """The repository's files: from Hugging Face, or offline (or unreachable) from the cache."""
    if not is_offline():
        try:
            return _remote_repo_files(repo)
        except ModelError:
            raise
        except Exception as error:  # noqa: BLE001 - no network, a proxy, a timeout: the cache may still have it
            cached = _cached_repo_files(repo)
            if cached is None:
                raise ModelError(f"{PREFIX}{repo}: Hugging Face could not be reached ({_first_line(error)}) and the "
                                 f"repository is not in the Hugging Face cache {cache_dir()}") from None
            return cached
    cached = _cached_repo_files(repo)
    if cached is None:
        raise ModelError(f"{PREFIX}{repo} is not in the Hugging Face cache {cache_dir()}, and HF_HUB_OFFLINE is set: "
                         f"nothing is downloaded")
    return cached


def _download(repo: str, file: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    offline = is_offline()
    try:
        return Path(hf_hub_download(repo, file, revision=REVISION, cache_dir=cache_dir(), local_files_only=offline))
    except GatedRepoError:
        raise ModelError(f"{PREFIX}{repo} is gated: accept its terms on Hugging Face and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ModelError(f"{PREFIX}{repo}: no such repository on Hugging Face (or it is private: set HF_TOKEN)") from None
    except EntryNotFoundError as error:  # offline and not cached, unreachable and not cached, or not in the repository
        why = ("is not in the Hugging Face cache, and HF_HUB_OFFLINE is set: nothing is downloaded" if offline
               else f"is neither in the Hugging Face cache nor downloadable ({_first_line(error)})")
        raise ModelError(f"{PREFIX}{repo}/{file} {why}") from None
    except OSError as error:  # the network, a full disk
        raise ModelError(f"{PREFIX}{repo}/{file} could not be downloaded: {_first_line(error)}") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def resolve(text: str) -> HubModel:
    """An hf: name -> the model's file in the Hugging Face cache (downloaded unless offline),
    with the repository's projector for it where it has one (choose_projector)."""
    ref = parse(text)
    files = _repo_files(ref.repo)
    parts = choose(ref, files)
    paths = [_download(ref.repo, part) for part in parts]
    projector = choose_projector(parts[0], files)
    return HubModel(paths[0], ref.repo, parts[0], _download(ref.repo, projector) if projector else None)


def choose_projector(model: str, files: list[str]) -> str | None:
    """The projector (an mmproj GGUF) llama.cpp's -hf takes for a model among a repository's
    files: in the model's folder or one above it, the deepest such folder first, then the
    quantization closest to the model's (an f16 projector for a Q8_0 model before an f32)."""
    folder = model.rsplit("/", 1)[0] if "/" in model else ""
    bits = _quant_bits(model)
    found = []
    for path in files:
        place = path.rsplit("/", 1)[0] if "/" in path else ""
        if "mmproj" in path.rsplit("/", 1)[-1] and path.endswith(".gguf") and \
                (not place or folder == place or folder.startswith(place + "/")):
            found.append((-place.count("/") - bool(place), abs(_quant_bits(path) - bits), path))
    return min(found)[2] if found else None


def _quant_bits(path: str) -> int:
    """The bits of a file's quantization as its name says (Q4_K_M: 4, F16: 16; 0: none said)."""
    match = re.search(r"(?<![A-Za-z0-9])(?:I?Q|B?F)(\d+)", path.rsplit("/", 1)[-1], re.IGNORECASE)
    return int(match[1]) if match else 0


def cached_ggufs() -> list[CachedGguf]:
    """Every GGUF model file the Hugging Face cache holds of a model repository's main revision."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache_dir())
    except CacheNotFound:
        return []
    found = []
    for cached in sorted(info.repos, key=lambda repo: repo.repo_id):
        if cached.repo_type != "model":
            continue
        for revision in cached.revisions:
            if REVISION not in revision.refs:
                continue
            for file in revision.files:
                relative = file.file_path.relative_to(revision.snapshot_path).as_posix()
                if is_model_file(relative):
                    found.append(CachedGguf(cached.repo_id, relative, file.file_path, file.size_on_disk))
    return sorted(found, key=lambda gguf: gguf.name)


def remove(text: str) -> list[Path]:
    """Take a model out of the Hugging Face cache: hf:OWNER/REPO/FILE.gguf that file (all its
    parts, for a split model), hf:OWNER/REPO the whole repository. Returns what was removed."""
    ref = parse(text)
    if ref.quant:
        raise ModelError(f"{text}: name the file to remove (hf:{ref.repo}/FILE.gguf) or the repository (hf:{ref.repo})")
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache_dir())
    except CacheNotFound:
        info = None
    repos = [cached for cached in (info.repos if info else ()) if cached.repo_type == "model" and cached.repo_id == ref.repo]
    if not repos:
        raise ModelError(f"{PREFIX}{ref.repo} is not in the Hugging Face cache {cache_dir()}")
    [cached] = repos
    if ref.file is None:
        info.delete_revisions(*(revision.commit_hash for revision in cached.revisions)).execute()
        return [cached.repo_path]
    files = {file.file_path.relative_to(revision.snapshot_path).as_posix(): file
             for revision in cached.revisions for file in revision.files if REVISION in revision.refs}
    parts = choose(ref, list(files))
    kept_blobs = {_blob_entry(file.file_path) for revision in cached.revisions for file in revision.files
                  if REVISION not in revision.refs or file.file_path.relative_to(revision.snapshot_path).as_posix()
                  not in parts}
    removed = []
    for part in parts:
        link = files[part].file_path
        blob = _blob_entry(link)
        link.unlink()
        removed.append(link)
        if blob is not None and blob not in kept_blobs and blob.is_relative_to(cached.repo_path):
            blob.unlink(missing_ok=True)  # the blob entry itself (a file, or a link), never what a link points to
            removed.append(blob)
    return removed


def _blob_entry(snapshot_file: Path) -> Path | None:
    """The blobs/ entry a snapshot's file links to (one link followed, not all); None for a copy."""
    if not snapshot_file.is_symlink():
        return None
    return Path(os.path.normpath(snapshot_file.parent / os.readlink(snapshot_file)))
