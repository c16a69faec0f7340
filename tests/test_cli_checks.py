"""What batch-run refuses before it loads a model: files that are not text, outputs it could
not write, unknown chat templates. Each is one error and exit code 2; none loads a model
(the model named is one that does not exist, so reaching the model would fail differently)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest

from multiseq.cli import job as job_module
from multiseq.formats import reader as reader_module
from multiseq.formats.reader import PromptFormat, detect_format

NO_MODEL = ["-m", "no-such-model"]


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    return path


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("Error:")]


@pytest.mark.parametrize("content, reason", [
    (bytes(range(256)) * 40, "is not a text file (it holds NUL bytes)"),
    (bytes(range(128, 256)) * 40, "is not a UTF-8 text file (5120 of its first 5120 bytes are not UTF-8)"),
    ('{"prompt": "hi"}\n'.encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
])
def test_a_file_that_is_not_text_is_one_error_line_before_the_model(tmp_path, run_cli, content, reason):
    path = tmp_path / "prompts.bin"
    path.write_bytes(content)
    result = run_cli("batch-run", str(path), "-o", str(tmp_path / "out.jsonl"), *NO_MODEL)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"Error: {path} {reason}"]
    assert not (tmp_path / "out.jsonl").exists()


def test_a_missing_output_folder_is_a_usage_error(tmp_path, run_cli, prompts):
    out = tmp_path / "absent" / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), *NO_MODEL)
    assert result.exit_code == 2
    assert error_lines(result) == [f"Error: cannot write -o/--output {out}: the folder {out.parent} does not exist"]


def test_an_output_under_a_file_or_onto_the_prompts_is_a_usage_error(tmp_path, run_cli, prompts):
    result = run_cli("batch-run", str(prompts), "-o", str(prompts / "out.jsonl"), *NO_MODEL)
    assert result.exit_code == 2 and "does not exist" in error_lines(result)[0]
    result = run_cli("batch-run", str(prompts), "-o", str(prompts), *NO_MODEL)
    assert result.exit_code == 2 and error_lines(result)[0].endswith("it is the prompts file")
    assert prompts.read_text() == json.dumps({"prompt": "Hello"}) + "\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_output_without_permission_is_a_usage_error(tmp_path, run_cli, prompts):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = run_cli("batch-run", str(prompts), "-o", str(locked / "out.jsonl"), *NO_MODEL)
    assert result.exit_code == 2 and "permission denied" in error_lines(result)[0]


def test_a_missing_stats_folder_is_a_usage_error(tmp_path, run_cli, prompts):
    stats = tmp_path / "absent" / "stats.json"
    result = run_cli("batch-run", str(prompts), "--stats-json", str(stats), *NO_MODEL)
    assert result.exit_code == 2 and error_lines(result) == [
        f"Error: cannot write --stats-json {stats}: the folder {stats.parent} does not exist"]


def test_an_unknown_chat_template_name_is_a_usage_error(run_cli, prompts):
    result = run_cli("batch-run", str(prompts), "--chat-template", "no-such-template", *NO_MODEL)
    assert result.exit_code == 2
    [line] = error_lines(result)
    assert line.startswith("Error: --chat-template: unknown chat template 'no-such-template'")
    assert "chatml" in line and "gemma" in line


def test_a_template_file_that_is_missing_or_broken_is_a_usage_error(tmp_path, run_cli, prompts):
    result = run_cli("batch-run", str(prompts), "--chat-template", str(tmp_path / "absent.jinja"), *NO_MODEL)
    assert result.exit_code == 2
    assert error_lines(result) == [f"Error: --chat-template: chat template file not found: {tmp_path / 'absent.jinja'}"]
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for message in messages %}\n{{ message['content'] }\n")
    result = run_cli("batch-run", str(prompts), "--chat-template", str(broken), *NO_MODEL)
    assert result.exit_code == 2
    [line] = error_lines(result)
    assert line.startswith(f"Error: --chat-template: chat template file {broken} does not compile: line 2:")


def test_duplicate_ids_in_a_large_file_are_named_before_anything_runs(tmp_path, run_cli):
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"id": f"id-{index}", "prompt": "x"}) for index in range(50_000)]
    lines.append(json.dumps({"id": "id-123", "prompt": "again"}))
    path.write_text("\n".join(lines) + "\n")
    result = run_cli("batch-run", str(path), "-o", str(tmp_path / "out.jsonl"), *NO_MODEL)
    assert result.exit_code == 2
    assert error_lines(result) == ["Error: duplicate ids in the input: 'id-123' (lines 124, 50001)"]


def test_ctrl_c_before_the_run_starts_exits_at_once_without_a_traceback(monkeypatch, run_cli, prompts):
    def interrupted_scan(*args, **kwargs):
        raise KeyboardInterrupt  # what the first Ctrl-C raises while nothing runs yet

    monkeypatch.setattr(job_module, "scan_file", interrupted_scan)
    result = run_cli("batch-run", str(prompts), *NO_MODEL)
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted before anything ran"


def test_a_prompts_file_that_cannot_be_read_is_one_error_line(monkeypatch, run_cli, prompts):
    def unreadable(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(job_module, "sniff_text", unreadable)
    result = run_cli("batch-run", str(prompts), *NO_MODEL)
    assert result.exit_code == 2 and error_lines(result) == [f"Error: cannot read {prompts}: Permission denied"]


def test_a_read_error_during_the_run_stops_it_with_one_line(tmp_path, monkeypatch, fake_job, read_jsonl):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"r{index}", "prompt": "x"}) + "\n" for index in range(100)))
    real_iter_lines = reader_module.iter_lines

    def failing_disk(path):
        for line in real_iter_lines(path):
            if line.number == 50:
                raise OSError(5, "Input/output error")
            yield line

    monkeypatch.setattr(reader_module, "iter_lines", failing_disk)
    out = tmp_path / "out.jsonl"
    with pytest.raises(click.ClickException) as error:
        fake_job(prompts, out)
    assert error.value.format_message() == (f"cannot read {prompts}: Input/output error; the run stopped "
                                            f"({len(read_jsonl(out))} result lines were written)")
    assert 0 < len(read_jsonl(out)) < 50


EXAMPLES = Path(__file__).resolve().parents[1] / "cli" / "examples"


@pytest.mark.parametrize("name, prompt_format", [("prompts.jsonl", PromptFormat.JSONL), ("prompts.txt", PromptFormat.TEXT),
                                                 ("openai-batch.jsonl", PromptFormat.OPENAI)])
def test_the_example_files_the_readme_shows_are_valid_input(tmp_path, fake_job, read_jsonl, name, prompt_format):
    path = EXAMPLES / name
    assert detect_format(path) is prompt_format
    out = tmp_path / "out.jsonl"
    assert fake_job(path, out, strict=True) == 0, "every line valid (--strict) and run"
    assert len(read_jsonl(out)) == sum(1 for line in path.read_text().splitlines() if line.strip())
