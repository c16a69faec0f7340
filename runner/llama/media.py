"""Images (and audio) in a prompt, through llama.cpp's multimodal library (mtmd): a projector
GGUF read beside the model, a prompt cut into text and media chunks, a media chunk encoded into
the embeddings the model takes in place of tokens.

A media chunk stands in the prompt's tokens as placeholder tokens: `num_tokens` copies of one
negative id made from the chunk's content (the projector's and the media's bytes). The engine's
prefix index, its RAM tier and the KV pool compare tokens, so a prefix holding an image is found
and reused as any other, and one image asked several questions is computed once. The backend
decodes a run of placeholders from the chunk's embeddings (MediaDecoder), found by the id in a
registry that holds each chunk while some prompt refers to it.

Imports nothing of llama_cpp: multiseq.llama.backend hands it the library (`llama`, `mtmd`).
"""

from __future__ import annotations

import ctypes
import hashlib
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from ..errors import BackendError, NoKvSlot

# Where a medium stands in a prompt's text: what a chat template renders for an image part, and
# what a prompt string holds. Made anew in each process (as llama-server makes its own), so
# that no text a user sends can stand for media.
MEDIA_MARKER = f"<__multiseq_media_{secrets.token_hex(8)}__>"
MEDIA_PART_TYPES = ("image", "audio")  # a message's content parts that are media ({"type", "data"})

# One placeholder id per media chunk: -(1 + 62 bits of its content's hash), never a real token.
_PLACEHOLDER_BITS = 62
EMBEDDING_CACHE_BYTES = 256 * 2**20  # recent media's embeddings kept after their prompts ended


def is_placeholder(token: int) -> bool:
    return token < 0


def placeholder_of(projector_identity: bytes, media: bytes) -> int:
    digest = hashlib.sha256(projector_identity + hashlib.sha256(media).digest()).digest()
    return -1 - (int.from_bytes(digest[:8], "little") >> (64 - _PLACEHOLDER_BITS))


class MediaChunk:
    """One encoded unit of media in a prompt (an image, a slice of audio): its placeholder id,
    how many tokens and positions it takes (fewer positions with M-RoPE: its tokens stand at
    their row and column), whether the model attends across all of them at once (Gemma 3's
    images), and llama.cpp's chunk, freed with this object.

    Freed by a weakref.finalize, not __del__: Python runs __del__ before it clears the object's
    weak references, so another thread could still find the chunk in the registry (a weak
    dictionary) while it is being freed and decode a freed chunk; finalize runs after."""

    def __init__(self, mtmd: ModuleType, chunk, placeholder: int, num_tokens: int, non_causal: bool,
                 projector: Projector | None = None, num_positions: int | None = None) -> None:
        self._chunk = chunk
        if chunk is not None:
            freeing = weakref.finalize(self, mtmd.mtmd_input_chunk_free, chunk)
            freeing.atexit = False  # (the process's end frees it; the library may be gone by then)
        self.placeholder = placeholder
        self.num_tokens = num_tokens
        self.num_positions = num_tokens if num_positions is None else num_positions
        self.non_causal = non_causal
        self._projector = weakref.ref(projector) if projector is not None else None

    @property
    def chunk(self):
        return self._chunk

    def decodable_within(self, n_batch: int) -> bool:
        """Whether decodes of n_batch tokens can take it: whole, or (read causally, as audio and
        most images are) in pieces; tokens that attend to each other both ways go in one."""
        return self.num_tokens <= n_batch or not self.non_causal

    def ready(self, encode_beside: bool) -> bool:
        """Whether it may be decoded now: (encode_beside False) the step may encode it, or its
        embeddings are at hand; else it is queued for the encoder thread (see Projector.ready),
        never where the step encodes it itself."""
        projector = self._projector() if self._projector is not None else None
        return projector is None or not encode_beside or projector.ready(self)


@dataclass(frozen=True)
class MediaSpan:
    """Where a media chunk stands in a prompt's tokens."""

    start: int
    media: MediaChunk

    @property
    def end(self) -> int:
        return self.start + self.media.num_tokens


@dataclass(frozen=True)
class PromptMedia:
    """Where media stand in one prompt of `length` tokens (spans in order), for the planner and
    the reuse of prefixes."""

    spans: tuple[MediaSpan, ...]
    length: int

    def __bool__(self) -> bool:
        return bool(self.spans)

    def at(self, position: int) -> MediaSpan | None:
        """The span that starts at a prompt position (None: text starts there)."""
        return next((span for span in self.spans if span.start == position), None)

    def text_before(self, position: int) -> int:
        """How many prompt tokens from `position` on are text before the next medium (all the
        rest where none follows)."""
        following = [span.start for span in self.spans if span.start >= position]
        return (following[0] if following else self.length) - position

    def reusable(self, num_cached: int) -> int:
        """A reused prefix's length, cut back to the start of a medium it would end inside."""
        inside = next((span for span in self.spans if span.start < num_cached < span.end), None)
        return inside.start if inside is not None else num_cached


@dataclass(frozen=True)
class MediaPrompt:
    """A prompt with media: its tokens (placeholders where media stand) and the media's spans."""

    tokens: list[int]
    spans: tuple[MediaSpan, ...]


class Projector:
    """A projector GGUF loaded for a model: what it reads, and its prompts cut and encoded."""

    def __init__(self, llama: ModuleType, mtmd: ModuleType, model_handle, path: str, threads: int,
                 use_gpu: bool, flash_attn_type: int) -> None:
        self._mtmd = mtmd
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.flash_attn_type = flash_attn_type  # the model's setting, as llama-server gives it
        params.print_timings = False
        params.warmup = False
        self._ctx = mtmd.mtmd_init_from_file(str(path).encode(), model_handle, params)
        if not self._ctx:
            raise BackendError(f"llama.cpp could not load the projector file {path} for this model")
        self.reads_images = bool(mtmd.mtmd_support_vision(self._ctx))
        self.reads_audio = bool(mtmd.mtmd_support_audio(self._ctx))
        self.uses_mrope = bool(mtmd.mtmd_decode_use_mrope(self._ctx))  # Qwen2-VL and later
        self.n_embd = llama.llama_model_n_embd_inp(model_handle)
        self._identity = _file_identity(Path(path))
        self._lock = threading.Lock()  # the held chunks, the embeddings kept, the queue to encode
        self._encoding = threading.Lock()  # mtmd's context encodes one chunk at a time
        self._held: weakref.WeakValueDictionary[int, MediaChunk] = weakref.WeakValueDictionary()
        self._embeddings: OrderedDict[int, np.ndarray] = OrderedDict()
        self._embedding_bytes = 0
        self._queue: OrderedDict[int, MediaChunk] = OrderedDict()  # media to encode, oldest first
        self._wake = threading.Condition(self._lock)
        self._encoder: threading.Thread | None = None
        self._closing = False
        self.encoded = 0  # media chunks encoded (a chunk found in the cache is not counted)
        self.encode_seconds = 0.0

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        if self._encoder is not None:
            self._encoder.join()
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None

    def ready(self, media: MediaChunk) -> bool:
        """Whether the chunk's embeddings are at hand; if not, it is queued for the encoder
        thread, which encodes while the engine decodes the other sequences: an image's encoding
        takes seconds on a CPU, and done in the step it would stop every stream. (Beside the
        decodes it runs slower, the two sharing the cores: where no stream is watched, the step
        encodes instead.)"""
        with self._lock:
            if media.placeholder in self._embeddings:
                return True
            if media.placeholder not in self._queue and not self._closing:
                self._queue[media.placeholder] = media
                self._wake.notify()
                if self._encoder is None:
                    self._encoder = threading.Thread(target=self._encode_queued, name="multiseq-media-encoder",
                                                     daemon=True)
                    self._encoder.start()
            return False

    def _encode_queued(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                _, media = self._queue.popitem(last=False)
            try:
                self.embeddings(media)
            except BackendError:  # the decode encodes it again, and fails its request with the reason
                pass

    def tokenize(self, texts: list[str], media: list[bytes]) -> MediaPrompt:
        """The tokens of texts with media between them (texts[0], media[0], texts[1], ...), BOS
        as the model adds it, special tokens parsed in the texts; ValueError naming the media
        (by its index) that is not an image or audio this projector reads."""
        assert len(texts) == len(media) + 1
        bitmaps = [self._bitmap(data, index) for index, data in enumerate(media)]
        try:
            return self._tokenized(texts, media, bitmaps)
        finally:
            for bitmap in bitmaps:
                self._mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, data: bytes, index: int):
        mtmd = self._mtmd
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buffer, len(data), False)
        if not bitmap:
            raise ValueError(f"media {index} is not an image or audio that llama.cpp can read ({len(data)} bytes)")
        if mtmd.mtmd_bitmap_is_audio(bitmap) and not self.reads_audio:
            mtmd.mtmd_bitmap_free(bitmap)
            raise ValueError(f"media {index} is audio, and this model's projector reads images only")
        if not mtmd.mtmd_bitmap_is_audio(bitmap) and not self.reads_images:
            mtmd.mtmd_bitmap_free(bitmap)
            raise ValueError(f"media {index} is an image, and this model's projector reads audio only")
        return bitmap

    def _tokenized(self, texts: list[str], media: list[bytes], bitmaps: list) -> MediaPrompt:
        mtmd = self._mtmd
        encoded = [text.encode("utf-8") for text in texts]
        inputs = [mtmd.mtmd_input_text(text, len(text), True, True) for text in encoded]
        parts = []
        for index, text_input in enumerate(inputs):
            parts.append(mtmd.mtmd_input_part(ctypes.pointer(text_input), None))
            if index < len(bitmaps):
                parts.append(mtmd.mtmd_input_part(None, bitmaps[index]))
        pointers = (ctypes.POINTER(mtmd.mtmd_input_part) * len(parts))(*(ctypes.pointer(part) for part in parts))
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            code = mtmd.mtmd_tokenize_from_parts(self._ctx, chunks, pointers, len(parts), True)
            if code != 0:
                raise ValueError(f"llama.cpp could not cut the prompt into text and media (code {code})")
            return self._prompt_of(chunks, [placeholder_of(self._identity, data) for data in media])
        finally:
            mtmd.mtmd_input_chunks_free(chunks)

    def _prompt_of(self, chunks, placeholders: list[int]) -> MediaPrompt:
        mtmd = self._mtmd
        tokens: list[int] = []
        spans: list[MediaSpan] = []
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t()
                text_tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                tokens += text_tokens[:count.value]
                continue
            media = self._held_chunk(chunk, placeholders[len(spans)])
            spans.append(MediaSpan(len(tokens), media))
            tokens += [media.placeholder] * media.num_tokens
        return MediaPrompt(tokens, tuple(spans))

    def _held_chunk(self, chunk, placeholder: int) -> MediaChunk:
        """The media chunk for a placeholder: the one some prompt holds already, else a copy of
        llama.cpp's chunk, registered while a prompt holds it."""
        with self._lock:
            held = self._held.get(placeholder)
            if held is not None:
                return held
            mtmd = self._mtmd
            media = MediaChunk(mtmd, mtmd.mtmd_input_chunk_copy(chunk), placeholder,
                               mtmd.mtmd_input_chunk_get_n_tokens(chunk),
                               bool(mtmd.mtmd_decode_use_non_causal(self._ctx, chunk)), self,
                               mtmd.mtmd_input_chunk_get_n_pos(chunk))
            self._held[placeholder] = media
            return media

    def media_of(self, placeholder: int) -> MediaChunk:
        media = self._held.get(placeholder)
        if media is None:
            raise BackendError("a media chunk was decoded after every prompt holding it ended")
        return media

    def embeddings(self, media: MediaChunk) -> np.ndarray:
        """The chunk's embeddings (num_tokens, n_embd), encoded once and kept while they fit
        EMBEDDING_CACHE_BYTES (the most recently used first). Kept ones are found without
        waiting for an encode under way."""
        found = self._kept(media.placeholder)
        if found is not None:
            return found
        with self._encoding:
            found = self._kept(media.placeholder)  # the encoder thread may have made it meanwhile
            if found is not None:
                return found
            started = time.perf_counter()
            if self._mtmd.mtmd_encode_chunk(self._ctx, media.chunk) != 0:
                raise BackendError("llama.cpp could not encode a media chunk")
            pointer = self._mtmd.mtmd_get_output_embd(self._ctx)
            rows = np.ctypeslib.as_array(pointer, shape=(media.num_tokens, self.n_embd)).copy()
            with self._lock:  # kept before the next encoder looks for it
                self.encode_seconds += time.perf_counter() - started
                self.encoded += 1
                self._keep(media.placeholder, rows)
        return rows

    def _kept(self, placeholder: int) -> np.ndarray | None:
        with self._lock:
            found = self._embeddings.get(placeholder)
            if found is not None:
                self._embeddings.move_to_end(placeholder)
            return found

    def _keep(self, placeholder: int, rows: np.ndarray) -> None:
        self._embeddings[placeholder] = rows
        self._embedding_bytes += rows.nbytes
        while self._embedding_bytes > EMBEDDING_CACHE_BYTES and len(self._embeddings) > 1:
            _, dropped = self._embeddings.popitem(last=False)
            self._embedding_bytes -= dropped.nbytes


def _file_identity(path: Path) -> bytes:
    """What tells one projector file from another: its content's hash."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


class MediaDecoder:
    """The media chunks of a step, each decoded from its embeddings in a llama_decode of its own
    (a batch holds tokens or embeddings, not both), before the step's other entries."""

    def __init__(self, llama: ModuleType, mtmd: ModuleType, projector: Projector, capacity: int) -> None:
        self._llama, self._mtmd, self.projector = llama, mtmd, projector
        self.capacity = capacity
        self._batch = llama.llama_batch_init(capacity, projector.n_embd, 1)
        # With M-RoPE, an embedding's position has 4 parts (time, row, column, unused), given
        # part after part (llama.cpp's decode_embd_batch): positions of 4 x capacity, in place
        # of the batch's own until it is freed.
        self._position_type = type(self._batch.pos)
        self._own_positions = ctypes.cast(self._batch.pos, ctypes.c_void_p).value  # (a field read shares the struct)
        sections = 4 if projector.uses_mrope else 1
        self._positions = np.zeros(sections * capacity, dtype=np.int32)
        self._batch.pos = self._positions.ctypes.data_as(self._position_type)
        self._embeddings = np.ctypeslib.as_array(self._batch.embd, shape=(capacity, projector.n_embd))
        self._num_seq_ids = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(capacity,))
        self._outputs = np.ctypeslib.as_array(self._batch.logits, shape=(capacity,))
        self.last_seconds = 0.0  # the last step's media decodes, llama_decode alone
        self.decoded = 0  # media chunks prefilled (a reused one is not)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.pos = ctypes.cast(ctypes.c_void_p(self._own_positions), self._position_type)
            self._llama.llama_batch_free(self._batch)
            self._batch = None

    def decode_step(self, ctx, entries: list, decode_rest: Callable, kv) -> np.ndarray:
        """Decode the step's media entries (one medium each, never an output row: a prompt with
        media ends with text), then `decode_rest` of the others, whose rows it returns. Where a
        decode fails, the media decoded before it, and any pieces of it, are cut back out of
        their slots' KV (`kv`: multiseq.llama.kv.SlotKv, told of each decode too: it applies the
        queued copies, and keeps where each medium stands in its slot's positions)."""
        media = [entry for entry in entries if is_placeholder(entry.tokens[0])]
        rest = [entry for entry in entries if not is_placeholder(entry.tokens[0])]
        touched = []
        self.last_seconds = 0.0
        try:
            for entry in media:
                touched.append(entry)
                chunk = self._decode(ctx, entry.slot, entry.tokens[0], len(entry.tokens),
                                     kv.positions.position(entry.slot, entry.start_pos))
                kv.decoded()
                kv.positions.placed(entry.slot, entry.start_pos, chunk.num_tokens, chunk.num_positions)
            return decode_rest(rest)
        except (NoKvSlot, BackendError):
            for entry in touched:
                kv.cut_back(entry.slot, entry.start_pos)
            raise

    def _decode(self, ctx, slot: int, placeholder: int, count: int, position: int) -> MediaChunk:
        """One medium's llama_decode, or (one read causally, larger than a decode) one per
        piece of at most `capacity` tokens, as llama.cpp's helper cuts it."""
        media = self.projector.media_of(placeholder)
        if count != media.num_tokens:
            raise BackendError("a media chunk was cut by a prompt chunk")
        if not media.decodable_within(self.capacity):
            raise BackendError(f"a media chunk of {count} tokens does not fit one llama_decode ({self.capacity})")
        embeddings = self.projector.embeddings(media)
        positions = self._positions_of(media, count, position)
        llama = self._llama
        if media.non_causal:  # Gemma 3: an image's tokens attend to each other both ways
            llama.llama_set_causal_attn(ctx, False)
        started = time.perf_counter()
        try:
            for start in range(0, count, self.capacity):
                code = self._decode_piece(ctx, slot, embeddings, positions, start, min(self.capacity, count - start))
                if code != 0:
                    break
        finally:
            if media.non_causal:
                llama.llama_set_causal_attn(ctx, True)
        self.last_seconds += time.perf_counter() - started
        self.decoded += code == 0
        if code == 1:
            raise NoKvSlot("llama_decode found no KV slot for a media chunk")
        if code != 0:
            raise BackendError(f"llama_decode of a media chunk failed with code {code}")
        return media

    def _decode_piece(self, ctx, slot: int, embeddings: np.ndarray, positions: np.ndarray, start: int,
                      count: int) -> int:
        self._embeddings[:count] = embeddings[start:start + count]
        self._positions[:positions.shape[0] * count] = positions[:, start:start + count].reshape(-1)
        self._num_seq_ids[:count] = 1
        for index in range(count):
            self._batch.seq_id[index][0] = slot
        self._outputs[:count] = 0
        self._batch.n_tokens = count
        return self._llama.llama_decode(ctx, self._batch)

    def _positions_of(self, media: MediaChunk, count: int, position: int) -> np.ndarray:
        """The positions of the medium's tokens from `position`, one row per part (1, or 4 with
        M-RoPE: time, row, column, unused, llama.cpp's order): one after another, or with M-RoPE
        an image's at its time position and each token's row and column (llama.cpp's
        mtmd_helper_image_get_decoder_pos), audio's one after another in every part."""
        consecutive = np.arange(position, position + count, dtype=np.int32)
        if not self.projector.uses_mrope:
            return consecutive[None, :]
        mtmd = self._mtmd
        if mtmd.mtmd_input_chunk_get_type(media.chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            return np.repeat(consecutive[None, :], 4, axis=0)
        found = (mtmd.mtmd_decoder_pos * count)()
        mtmd.mtmd_helper_image_get_decoder_pos(mtmd.mtmd_input_chunk_get_tokens_image(media.chunk), position, found)
        parts = np.frombuffer(found, dtype=np.uint32).reshape(count, 4)
        return parts[:, [0, 2, 1, 3]].T.astype(np.int32)  # t, y, x, z
