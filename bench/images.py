"""Images against llama-server: the same model (Gemma 3 270M) and projector (random weights, made
here with tests/tiny_projectors.py), the same images, through `multiseq serve --mmproj` and
`llama-server --mmproj` (built from the same sources by bench/peers.py).

    python bench/images.py [same] [same-mrope] [questions] [captions] [streams] [memory] [--threads 2]

- same: 16 images (PNG, JPEG, GIF, BMP, one with alpha; 24 to 300 pixels a side), one question
  each, greedy, one at a time on -np 1 with flash attention off and a full-size sliding-window
  cache on both (the tiny projector: 4 tokens an image): answers and prompt token counts
  compared. Then in process, batch-invariant: the 16 on 16 slots against each alone, and a
  second question on each image (its prefix reused) against the same asked afresh.
- same-mrope: the same on Qwen2-VL's text model and projector (M-RoPE: an image's tokens stand
  at its rows and columns, and take fewer positions than tokens), tiny and random, made here.
- questions: one image, 8 questions sent at once to -np 8 (a projector in a small VLM's shapes:
  SmolVLM-256M's SigLIP tower, 12 layers of 768, 512-pixel images in 16-pixel patches, 64 image
  tokens): wall time on both; multiseq's /metrics say how often the image was encoded and
  prefilled.
- captions: 64 images, one question each, 16 slots, the same projector: images per second on
  both, and multiseq's time encoding.
- streams: 16 text chats streaming 200 tokens each while an image request (the same projector)
  comes every 2 s after the last was answered: the longest gap between two chunks of a stream.
- memory: 500 image requests in process, each image new: the resident memory after each 50.

Prints a line per result and, last, one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests"))
from peers import _free_port, _stop, each_by_clients, ensure_llama_tools, start_server  # noqa: E402
from templates import post  # noqa: E402
from tiny_projectors import image_of, tiny_gemma3_projector  # noqa: E402

MODEL = "gemma3-270m"
TEXT_EMBEDDING = 640  # Gemma 3 270M's width
SMOLVLM_TOWER = dict(image_size=512, patch=16, merge=4, embedding=768, heads=12, feed_forward=3072, layers=12)


def sixteen_images() -> list[bytes]:
    formats = ["PNG", "JPEG", "GIF", "BMP"]
    sizes = [(24, 24), (40, 30), (64, 64), (100, 50), (50, 100), (128, 96), (200, 200), (300, 120)]
    images = [image_of(*sizes[index % len(sizes)], seed=index, image_format=formats[index % 4]) for index in range(15)]
    return images + [image_of(48, 48, seed=99, alpha=True)]


def data_url(image: bytes) -> str:
    kind = {b"\x89P": "png", b"\xff\xd8": "jpeg", b"GI": "gif", b"BM": "bmp"}[image[:2]]
    return f"data:image/{kind};base64,{base64.b64encode(image).decode()}"


def chat(image: bytes, question: str, max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}},
                                                      {"type": "text", "text": question}]}],
            "max_tokens": max_tokens, "temperature": 0, "top_k": 1}


def answer(base: str, body: dict) -> dict:
    reply = post(base, "/v1/chat/completions", body, timeout=1800)  # a queue of images takes minutes
    if "error" in reply:
        return {"error": str(reply["error"])[:200]}
    return {"text": reply["choices"][0]["message"]["content"], "prompt_tokens": reply["usage"]["prompt_tokens"]}


class Servers:
    """llama-server and multiseq serve on the same model and projector, one at a time."""

    def __init__(self, projector: Path, parallel: int, threads: int, workdir: Path, model: str = MODEL) -> None:
        from multiseq import models

        self.model, self.name = models.resolve(model), model
        self.projector, self.parallel, self.threads, self.workdir = projector, parallel, threads, workdir

    def commands(self, port: int) -> dict[str, list[str]]:
        both = ["--mmproj", str(self.projector), "-np", str(self.parallel), "-t", str(self.threads), "-fa", "off"]
        template = self.model.chat_template_fallback
        return {
            "llama-server": [str(ensure_llama_tools().server), "-m", str(self.model.path),
                             *(["--chat-template-file", template] if template else []), *both,
                             "-c", str(2048 * self.parallel), "--swa-full", "--no-webui", "--port", str(port)],
            "multiseq": [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", self.name, *both,
                         "--slot-ctx", "2048", "--port", str(port)],
        }

    def run(self, name: str, work):
        port = _free_port()
        process, base = start_server(self.commands(port)[name], self.workdir / f"{name}.log", port)
        try:
            return work(base)
        finally:
            _stop(process)


def metrics(base: str) -> dict[str, float]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base + "/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    return {line.split()[0]: float(line.split()[1]) for line in lines
            if line.startswith("multiseq_media") or line.startswith("multiseq_prompt_tokens")}


def clients(base: str, bodies: list[dict], count: int) -> tuple[list[dict], float]:
    """`count` clients, each sending the next body as its last is answered (one per body: all
    at once); the answers in body order, and the seconds until the last came."""
    started = time.perf_counter()
    results = each_by_clients(count, bodies, lambda body: answer(base, body))
    return results, time.perf_counter() - started


def on_both(servers: Servers, bodies: list[dict], count: int) -> dict:
    """The bodies sent by `count` clients to llama-server, then to multiseq: each one's seconds
    and first errors, multiseq's media and prompt metrics."""
    found = {}
    for name in ("llama-server", "multiseq"):
        def work(base: str, name=name) -> None:
            results, seconds = clients(base, bodies, count)
            found[name] = {"seconds": round(seconds, 2),
                           "errors": [result["error"] for result in results if "error" in result][:2]}
            if name == "multiseq":
                found[name]["metrics"] = metrics(base)
        servers.run(name, work)
    return found


def same(args, workdir: Path, figures: dict, model: str = MODEL, projector: Path | None = None,
         part: str = "same") -> None:
    projector = projector or tiny_gemma3_projector(workdir / "tiny-mmproj.gguf", TEXT_EMBEDDING)
    images = sixteen_images()
    bodies = [chat(image, "Describe this image.", 16) for image in images]
    servers = Servers(projector, 1, args.threads, workdir, model)
    theirs = servers.run("llama-server", lambda base: [answer(base, body) for body in bodies])
    ours = servers.run("multiseq", lambda base: [answer(base, body) for body in bodies])
    same_text = sum(1 for a, b in zip(theirs, ours) if "text" in a and a == b)
    for index, (a, b) in enumerate(zip(theirs, ours)):
        print(f"image {index:2d}: prompt tokens {a.get('prompt_tokens')}/{b.get('prompt_tokens')} "
              f"{'same' if a == b else 'DIFFERENT'} {json.dumps(b.get('text', b.get('error')))[:50]}", flush=True)
    batched, reused = _in_process(projector, images, model)
    figures[part] = {"images": len(images), "same_as_llama_server": same_text, "batched_equal_alone": batched,
                       "reused_equal_recomputed": reused}
    print(f"same answer as llama-server: {same_text}/16; 16 slots == alone: {batched}/16; reused == afresh: "
          f"{reused}/16", flush=True)


def same_mrope(args, workdir: Path, figures: dict) -> None:
    """`same` on a model with M-RoPE: Qwen2-VL's text model and projector, tiny and random
    (tests/tiny_models.py, the tokenizer of DeepSeek-R1-Distill-Qwen-7B), images at their own
    size (4 to 80 tokens, taking fewer positions than tokens)."""
    from tiny_models import deepseek_qwen_header, tiny_model_with_tokenizer_of
    from tiny_projectors import tiny_qwen2vl_projector

    model = tiny_model_with_tokenizer_of(deepseek_qwen_header(), workdir / "tiny-qwen2vl.gguf", arch="qwen2vl")
    projector = tiny_qwen2vl_projector(workdir / "tiny-qwen2vl-mmproj.gguf", text_embedding=64)
    same(args, workdir, figures, str(model), projector, "same_mrope")


def _in_process(projector: Path, images: list[bytes], model: str = MODEL) -> tuple[int, int]:
    from multiseq import Request, Runner, RunnerConfig, SamplingParams

    def ask(image: bytes, question: str) -> Request:
        return Request(messages=[{"role": "user", "content": [{"type": "image", "data": image},
                                                             {"type": "text", "text": question}]}],
                       sampling=SamplingParams(max_tokens=16, temperature=0))

    def runner(parallel: int, **config) -> Runner:
        return Runner(RunnerConfig(model=model, mmproj=str(projector), parallel=parallel, slot_ctx=1024,
                                   batch_invariant=True, **config))

    with runner(16) as together:
        batched = together.run_batch([ask(image, "Describe this image.") for image in images])
    with runner(1) as alone:
        single = [alone.run_batch([ask(image, "Describe this image.")])[0] for image in images]
        again = [alone.run_batch([ask(image, "What is in it?")])[0] for image in images]
    with runner(1, prefix_cache=False) as afresh:
        fresh = [afresh.run_batch([ask(image, "What is in it?")])[0] for image in images]
    return (sum(a.text == b.text for a, b in zip(batched, single)),
            sum(a.text == b.text for a, b in zip(again, fresh)))


def questions(args, workdir: Path, figures: dict) -> None:
    projector = _smolvlm_projector(workdir)
    image = image_of(512, 512, seed=7, image_format="JPEG")
    asked = ["Describe this image.", "What colors are in it?", "Is there a person?", "What is in the corner?",
             "Is it day or night?", "How many objects are there?", "What style is it?", "Give it a title."]
    bodies = [chat(image, question, 24) for question in asked]
    found = on_both(Servers(projector, 8, args.threads, workdir), bodies, len(bodies))
    for name in ("llama-server", "multiseq"):
        print(f"{name}: 8 questions about one image in {found[name]['seconds']} s {found[name].get('metrics', '')}",
              flush=True)
    found["ratio"] = round(found["multiseq"]["seconds"] / found["llama-server"]["seconds"], 3)
    figures["questions"] = found


def captions(args, workdir: Path, figures: dict) -> None:
    projector = _smolvlm_projector(workdir)
    images = [image_of(512, 384, seed=1000 + index, image_format="JPEG") for index in range(args.images)]
    bodies = [chat(image, "Describe this image in one sentence.", 16) for image in images]
    found = on_both(Servers(projector, 16, args.threads, workdir), bodies, 16)
    for name in ("llama-server", "multiseq"):
        found[name]["images_per_s"] = round(len(bodies) / found[name]["seconds"], 3)
        print(f"{name}: {len(bodies)} captions in {found[name]['seconds']} s ({found[name]['images_per_s']} images/s)",
              flush=True)
    found["ratio"] = round(found["multiseq"]["images_per_s"] / found["llama-server"]["images_per_s"], 3)
    figures["captions"] = found


def streams(args, workdir: Path, figures: dict) -> None:
    """16 text chats streaming (EOS ignored, so every stream runs its length) while an image
    request comes every few seconds: the longest gap between two chunks of any stream, from
    the first image on (before it, the streams' own prompts are prefilled)."""
    projector = _smolvlm_projector(workdir)
    servers = Servers(projector, 17, args.threads, workdir)
    found = {}
    for name in ("llama-server", "multiseq"):
        found[name] = servers.run(name, lambda base: _gaps_beside_images(base, args.images_beside))
        print(f"{name}: longest gap {found[name]['longest_gap_s']} s, median gap {found[name]['median_gap_s']} s, "
              f"images answered in {found[name]['image_seconds']} s", flush=True)
    found["ratio"] = round(found["multiseq"]["longest_gap_s"] / found["llama-server"]["longest_gap_s"], 3)
    figures["streams"] = found


def _gaps_beside_images(base: str, num_images: int) -> dict:
    gaps: list[float] = []
    long_gaps: list[tuple[float, float]] = []
    lock = threading.Lock()
    origin = time.perf_counter()

    def stream(index: int) -> None:
        body = json.dumps({"messages": [{"role": "user", "content": f"Tell me a long story about the number {index}."}],
                           "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}).encode()
        request = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        last = None
        with opener.open(request, timeout=1800) as response:
            for line in response:
                if not line.startswith(b"data: {"):
                    continue
                now = time.perf_counter()
                if last is not None and last - origin >= 3:  # after the streams' prompts, from the first image on
                    with lock:
                        gaps.append(now - last)
                        if now - last > 0.4:
                            long_gaps.append((round(last - origin, 2), round(now - last, 3)))
                last = now

    streamers = [threading.Thread(target=stream, args=(index,)) for index in range(16)]
    for thread in streamers:
        thread.start()
    time.sleep(3)  # the streams are flowing
    image_seconds = []
    sent_at = []
    for index in range(num_images):
        started = time.perf_counter()
        sent_at.append(round(started - origin, 2))
        answer(base, chat(image_of(512, 384, seed=5000 + index, image_format="JPEG"), "Describe this image.", 4))
        image_seconds.append(round(time.perf_counter() - started, 2))
        time.sleep(2)
    for thread in streamers:
        thread.join()
    gaps.sort()
    return {"longest_gap_s": round(gaps[-1], 3), "median_gap_s": round(gaps[len(gaps) // 2], 3),
            "image_seconds": image_seconds, "chunks": len(gaps), "images_sent_at_s": sent_at,
            "gaps_over_0_4_s": sorted(set(long_gaps))[:12]}


def memory(args, workdir: Path, figures: dict) -> None:
    """500 image requests (each image new) through the engine in process: its resident memory
    after each 50, the embeddings kept (bounded by EMBEDDING_CACHE_BYTES) and the media chunks
    still held (only those of prompts not yet ended)."""
    from multiseq import Request, Runner, RunnerConfig, SamplingParams

    projector = tiny_gemma3_projector(workdir / "tiny-mmproj.gguf", TEXT_EMBEDDING)
    marks = []
    with Runner(RunnerConfig(model=MODEL, mmproj=str(projector), parallel=8, slot_ctx=512)) as runner:
        for batch in range(10):
            results = runner.run_batch([Request(messages=[{"role": "user", "content": [
                {"type": "image", "data": image_of(64, 48, seed=batch * 100 + index, image_format="JPEG")},
                {"type": "text", "text": "Describe this image."}]}], sampling=SamplingParams(max_tokens=2))
                for index in range(50)])
            assert all(result.error is None for result in results), results[0].error
            marks.append(round(_resident_mib()))
        kept = runner.backend.model.projector
        figures["memory"] = {"rss_mib_after_each_50": marks, "encoded": kept.encoded,
                             "embeddings_kept_mib": round(kept._embedding_bytes / 2**20, 2), "chunks_held": len(kept._held)}
    print(f"resident memory after each 50 image requests: {marks} MiB; {figures['memory']}", flush=True)


def _resident_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def _smolvlm_projector(workdir: Path) -> Path:
    path = workdir / "smolvlm-shaped-mmproj.gguf"
    return path if path.exists() else tiny_gemma3_projector(path, TEXT_EMBEDDING, **SMOLVLM_TOWER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = {"same": same, "same-mrope": same_mrope, "questions": questions, "captions": captions, "streams": streams,
             "memory": memory}
    parser.add_argument("parts", nargs="*", default=list(parts), choices=list(parts))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=64, help="captions: how many images")
    parser.add_argument("--images-beside", type=int, default=3, help="streams: images sent beside the streams")
    args = parser.parse_args()
    figures: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        for part in args.parts:
            parts[part](args, Path(folder), figures)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
