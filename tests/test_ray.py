"""batch-run --ray and multiseq.ray on a local Ray cluster (loopback, 2 workers x 1 thread):
every row comes back once, greedy text (and a document's embedding) equals a plain
batch-run's, a bad row is an error record, and a worker killed mid-run loses no row."""

from __future__ import annotations

import json
import signal
import threading

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'multiseq[ray]')")

from click.testing import CliRunner  # noqa: E402

from helpers import wait_for_lines  # noqa: E402
from multiseq.cli.main import cli  # noqa: E402
from multiseq import Request, RunnerConfig, SamplingParams  # noqa: E402
from multiseq import ray as multiseq_ray  # noqa: E402

pytestmark = pytest.mark.model

NUM_ROWS = 32
BAD_ROW = 5
RUN_OPTIONS = ["-np", "4", "-t", "1", "-n", "6", "--temperature", "0", "--batch-invariant", "--no-dashboard"]


@pytest.fixture(scope="module")
def cluster(ray_cluster, smollm):
    """The tests' local Ray (conftest: 3 CPUs, loopback), the model fetched before workers load it."""
    return ray_cluster


EMBEDDED_ROWS = (7, 19)  # rows that are documents to embed (a vector each)


def rows() -> list[dict]:
    lines = [{"id": f"r{index:02d}", "prompt": f"Item {index}: the weather in town number {index} is"}
             for index in range(NUM_ROWS)]
    lines[BAD_ROW] = {"id": f"r{BAD_ROW:02d}", "prompt": "x", "max_tokens": -3}
    for index in EMBEDDED_ROWS:
        lines[index] = {"id": f"r{index:02d}", "input": f"Document {index}: the rain in town number {index}."}
    return lines


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    return path


def texts_by_id(records: list[dict]) -> dict[str, str | list]:
    """Each record's text, or its embedding (a document's)."""
    return {record["id"]: record.get("embedding") or record["text"] for record in records}


@pytest.fixture(scope="session")  # under pytest-xdist a module's fixtures may be set up again mid-module
def plain_texts(tmp_path_factory) -> dict[str, str]:
    """The rows' texts from a plain batch-run (no Ray), with the options the Ray runs use."""
    folder = tmp_path_factory.mktemp("plain")
    prompts, output = folder / "prompts.jsonl", folder / "out.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    result = CliRunner().invoke(cli, ["batch-run", str(prompts), "-o", str(output), *RUN_OPTIONS])
    assert result.exit_code == 1, result.output  # the bad row failed, nothing else
    return texts_by_id([json.loads(line) for line in output.read_text().splitlines()])


def test_every_row_comes_back_once_with_the_text_of_a_plain_run(cluster, prompts_file, tmp_path, run_cli,
                                                                 read_jsonl, plain_texts):
    on_ray = tmp_path / "ray.jsonl"
    ray_run = run_cli("batch-run", str(prompts_file), "-o", str(on_ray), "--ray", "--workers", "2", *RUN_OPTIONS)
    assert ray_run.exit_code == 1  # the bad row failed, nothing else
    records = read_jsonl(on_ray)
    assert sorted(record["id"] for record in records) == [row["id"] for row in rows()]
    assert texts_by_id(records) == plain_texts
    bad = next(record for record in records if record["id"] == f"r{BAD_ROW:02d}")
    assert bad["finish_reason"] == "error" and "max_tokens" in bad["error"]
    embedded = {f"r{index:02d}" for index in EMBEDDED_ROWS}
    assert all(record["finish_reason"] == ("stop" if record["id"] in embedded else "length")
               for record in records if record is not bad)
    assert all(len(record["embedding"]) == 576 for record in records if record["id"] in embedded)


def test_resume_on_ray_runs_only_what_is_missing(cluster, prompts_file, tmp_path, run_cli, read_jsonl):
    output = tmp_path / "out.jsonl"
    first = [json.dumps({"id": "r00", "text": "kept", "finish_reason": "length", "error": None})]
    output.write_text("\n".join(first) + "\n")
    result = run_cli("batch-run", str(prompts_file), "-o", str(output), "--resume", "--ray", "--workers", "2",
                     *RUN_OPTIONS)
    assert result.exit_code == 1
    records = read_jsonl(output)
    assert sorted(record["id"] for record in records) == [row["id"] for row in rows()]
    assert texts_by_id(records)["r00"] == "kept"


def test_ctrl_c_on_ray_writes_finished_and_partial_results_then_resume_completes_each_id_once(
        cluster, tmp_path, start_cli, run_cli, read_jsonl):
    """batch-run in its own process, a driver of this module's cluster, as on a real one."""
    ids = [f"item-{index}" for index in range(12)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": item_id, "prompt": f"Story number {index}:",
                                           "max_tokens": 4 if index == 0 else 40}) + "\n"
                               for index, item_id in enumerate(ids)))
    out = tmp_path / "out.jsonl"
    process = start_cli("batch-run", str(prompts), "-o", str(out), "--ray", cluster,
                        "--workers", "2", "-t", "1", "-np", "2", "--temperature", "0", "--ignore-eos",
                        "--slot-ctx", "512", "--no-dashboard")
    wait_for_lines(out, 1, process)  # item-0 finished; the others are running on the workers or queued
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    first = {record["id"]: record for record in read_jsonl(out)}
    cancelled = [record for record in first.values() if record["finish_reason"] == "cancelled"]
    # Running requests are written, cancelled. (Whether they had text yet depends on how far the
    # workers got when the signal came: a worker that started late has none. The partial text
    # itself is checked without Ray, in test_cli_formats.)
    assert cancelled and all(record["error"] is None for record in cancelled), "running requests are written"
    not_started = len(ids) - len(first)
    assert not_started >= 1 and f"{not_started} not started (--resume runs them)" in stderr

    result = run_cli("batch-run", str(prompts), "-o", str(out), "--resume", "-np", "12", "-n", "4",
                     "--temperature", "0", "--ignore-eos", "--slot-ctx", "512")
    assert result.exit_code == 0, result.output
    final = read_jsonl(out)
    assert sorted(record["id"] for record in final) == sorted(ids), "no id lost, none twice"


def test_a_killed_worker_loses_no_request(cluster):
    config = RunnerConfig(model="smollm2-135m", parallel=4, threads=1, slot_ctx=256, seed=0)
    requests = [Request(prompt=row["prompt"], id=row["id"], sampling=SamplingParams(max_tokens=12, temperature=0))
                for row in rows() if row["id"] != f"r{BAD_ROW:02d}" and "prompt" in row]
    results, lock, first_done = [], threading.Lock(), threading.Event()

    def finished(result):
        with lock:
            results.append(result)
        first_done.set()

    with multiseq_ray.RayRunnerPool(config, workers=2) as pool:
        for request in requests:
            pool.submit(request, on_finish=finished)
        assert first_done.wait(60)
        ray.kill(pool._actors[0], no_restart=False)  # Ray restarts it and sends its requests again
        deadline = threading.Event()
        for _ in range(600):
            with lock:
                if len(results) == len(requests):
                    break
            deadline.wait(0.2)
    assert sorted(result.id for result in results) == sorted(request.id for request in requests)
    assert all(result.ok for result in results), [result.error for result in results if not result.ok]


def test_ray_data_map_batches_gives_batch_run_records(cluster, prompts_file, plain_texts):
    dataset = ray.data.read_json(str(prompts_file), num_cpus=0)  # the 2 actors take 2 of the 3 CPUs
    results = multiseq_ray.generate(dataset, workers=2, threads=1, model="smollm2-135m", parallel=4,
                                    batch_invariant=True, max_tokens=6, temperature=0).take_all()
    assert sorted(record["id"] for record in results) == [row["id"] for row in rows()]
    assert texts_by_id(results) == plain_texts
    bad = next(record for record in results if record["id"] == f"r{BAD_ROW:02d}")
    assert bad["finish_reason"] == "error" and bad["param"] == "max_tokens"
    assert bad["error"].startswith(f"row r{BAD_ROW:02d}: max_tokens")


def test_cluster_errors_are_one_line(cluster, prompts_file, run_cli):
    too_many = run_cli("batch-run", str(prompts_file), "--ray", "--workers", "4", "-t", "1")
    assert too_many.exit_code == 1
    assert "4 workers x 1 threads need 4 CPUs, and the Ray cluster has 3" in too_many.output
    assert "Traceback" not in too_many.output
    no_ray = run_cli("batch-run", str(prompts_file), "--workers", "2")
    assert no_ray.exit_code == 2 and "--workers needs --ray" in no_ray.output
    nobody = run_cli("batch-run", str(prompts_file), "--ray", "127.0.0.1:9")
    assert nobody.exit_code == 1 and "could not connect to the Ray cluster at 127.0.0.1:9" in nobody.output


def test_ray_data_rows_carry_image_bytes(cluster, unpacked_model, real_runner, tmp_path):
    """A row's image_url part may hold the image's bytes (a dataset read from image files has
    them so): the record is the one a plain run gives the same image."""
    from tiny_projectors import image_of, tiny_gemma3_projector

    projector = tiny_gemma3_projector(tmp_path / "mmproj.gguf", text_embedding=640)
    images = [image_of(64, 48, seed) for seed in (1, 2)]

    def messages(image) -> list[dict]:
        return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                             {"type": "text", "text": "Describe this image."}]}]

    gemma = unpacked_model("gemma3-270m")
    gemma.load_projector(str(projector), threads=1, flash_attn="auto")
    try:
        expected = real_runner(gemma, 2, batch_invariant=True).run_batch(
            [Request(messages=[{"role": "user", "content": [{"type": "image", "data": image},
                                                            {"type": "text", "text": "Describe this image."}]}],
                     sampling=SamplingParams(max_tokens=6, temperature=0)) for image in images])
    finally:
        gemma.projector.close()
        gemma.projector = None
    dataset = ray.data.from_items([{"id": f"img{index}", "messages": messages(image)}
                                   for index, image in enumerate(images)])
    results = multiseq_ray.generate(dataset, workers=1, threads=1, model="gemma3-270m", mmproj=str(projector),
                                    parallel=2, batch_invariant=True, max_tokens=6, temperature=0).take_all()
    by_id = {record["id"]: record for record in results}
    assert [by_id[f"img{index}"]["error"] for index in range(2)] == [None, None]
    assert [by_id[f"img{index}"]["text"] for index in range(2)] == [result.text for result in expected]
    assert by_id["img0"]["prompt_tokens"] == expected[0].prompt_tokens
