"""The prompt readers on anything: arbitrary bytes, arbitrary JSON values, arbitrary files.

Every line gives either a request or an error naming its line, never an exception; the id the
pre-run pass finds for a line is the id the reader gives it; every item's line can be written.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multiseq import SamplingParams
from multiseq.formats import lines as lines_module
from multiseq.formats.fields import COMMON_FIELDS, SAMPLING_FIELDS
from multiseq.formats.lines import NotTextError, RawLine, count_items, iter_lines, sniff_text
from multiseq.formats.output import encode_record
from multiseq.formats.reader import PromptFormat, TextMode, detect_format, line_id, parse_line, read_prompts
from multiseq.formats.records import record_for

DEFAULTS = SamplingParams()
FORMATS = st.sampled_from(list(PromptFormat))
TEXT_MODES = st.sampled_from(list(TextMode))
# Any character, lone surrogates included (JSON escapes such as "\ud800" produce them).
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=20)
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT
JSON_VALUES = st.recursive(JSON_SCALARS, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(ANY_TEXT, children, max_size=4), max_leaves=12)
# Objects built from the field names the readers look for, holding any values: these reach
# deeper than random objects, whose keys are unknown fields.
JSONL_FIELDS = sorted({"id", "prompt", "messages"} | set(SAMPLING_FIELDS) | COMMON_FIELDS)
MESSAGE = st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "system", "assistant", "robot"])
                                              | JSON_VALUES, "content": ANY_TEXT | JSON_VALUES})
RESPONSE_FORMATS = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["json_schema", "json_object", "text", "grammar", "regex"]) | JSON_VALUES,
    "json_schema": st.fixed_dictionaries({}, optional={"name": ANY_TEXT, "schema": JSON_VALUES}) | JSON_VALUES,
    "grammar": ANY_TEXT | JSON_VALUES})
FIELD_VALUES = (JSON_VALUES | st.lists(MESSAGE, max_size=3) | RESPONSE_FORMATS
                | st.sampled_from([1, 0, -1, 0.5, 2**64, "x", [], {}, True]))
JSONL_OBJECTS = st.dictionaries(st.sampled_from(JSONL_FIELDS), FIELD_VALUES, max_size=5)
OPENAI_OBJECTS = st.fixed_dictionaries({}, optional={
    "custom_id": FIELD_VALUES, "method": st.sampled_from(["POST", "GET"]) | JSON_VALUES,
    "url": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]) | JSON_VALUES,
    "body": st.dictionaries(st.sampled_from(JSONL_FIELDS + ["model", "n", "max_completion_tokens", "user"]),
                            FIELD_VALUES, max_size=5) | JSON_VALUES})


def check_line(data: bytes, prompt_format: PromptFormat, text_mode: TextMode, number: int = 7) -> None:
    line = RawLine(number, 100, data)
    item = parse_line(line, prompt_format, DEFAULTS, text_mode)
    if line.is_blank:
        assert item is None and line_id(line, prompt_format) is None
        return
    assert item is not None and item.line_number == number
    assert item.id == line_id(line, prompt_format), "the id pass and the reader agree on every line"
    if item.is_valid:
        assert item.error is None and item.request.id == item.id
    else:
        assert item.request is None and item.error.startswith(f"line {number}: ")
        record = json.loads(encode_record(record_for(prompt_format, item, None, "model")))
        assert str(record.get("custom_id", record.get("id"))) == item.id, "written and read back intact"


@given(st.binary(max_size=200), FORMATS, TEXT_MODES)
def test_any_bytes_give_a_request_or_an_error_naming_the_line(data, prompt_format, text_mode):
    check_line(data, prompt_format, text_mode)


@given(JSON_VALUES, FORMATS, TEXT_MODES, st.booleans())
def test_any_json_value_gives_a_request_or_an_error_naming_the_line(value, prompt_format, text_mode, ascii_only):
    check_line(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"), prompt_format, text_mode)


@settings(max_examples=300)
@given(JSONL_OBJECTS, st.booleans())
def test_jsonl_objects_with_any_field_values(value, ascii_only):
    check_line(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"), PromptFormat.JSONL,
               TextMode.CHAT)


@settings(max_examples=300)
@given(OPENAI_OBJECTS)
def test_openai_objects_with_any_field_values(value):
    check_line(json.dumps(value).encode(), PromptFormat.OPENAI, TextMode.CHAT)


@pytest.mark.parametrize("text", ["[" * 100_000, '{"id": ' + "9" * 5_000 + "}", '{"prompt": "x", "seed": 1e400}'])
def test_pathological_json_is_a_line_error(text):
    for prompt_format in (PromptFormat.JSONL, PromptFormat.OPENAI):
        check_line(text.encode(), prompt_format, TextMode.CHAT)


@pytest.mark.parametrize("prompt_format, text", [(PromptFormat.JSONL, r'{"id": "a\ud800", "prompt": 5}'),
                                                 (PromptFormat.OPENAI, r'{"custom_id": "\udfff", "url": 1}')])
def test_ids_holding_lone_surrogates_are_written_back_intact(prompt_format, text):
    check_line(text.encode(), prompt_format, TextMode.CHAT)


FILE_PIECES = st.sampled_from([b"\n", b"\r\n", b" ", b"\x00", b"\xff", b"\xef\xbb\xbf", b"\xc3\xa9", b"\xc3",
                               b'{"prompt": "hi"}', b'{"id": 1, "prompt": "x"}', b'{"custom_id": "a"}', b"plain text",
                               b"[1, 2]", b'{"messages": [{"role": "user", "content": "x"}]}'])
FILES = st.lists(FILE_PIECES, max_size=30).map(b"".join) | st.binary(max_size=300)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200)
@given(FILES, st.sampled_from([None, *PromptFormat]), TEXT_MODES, st.sampled_from([3, 5, 64, 1 << 20]))
def test_a_whole_file_of_anything_is_refused_or_read_line_by_line(monkeypatch, data, forced_format, text_mode,
                                                                   block_bytes):
    monkeypatch.setattr(lines_module, "BLOCK_BYTES", block_bytes)  # blocks cut lines and characters
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompts"
        path.write_bytes(data)
        try:
            sniff_text(path)
        except NotTextError as error:
            assert str(path) in str(error)
            return
        prompt_format = forced_format or detect_format(path)
        items = list(read_prompts(path, prompt_format, DEFAULTS, text_mode))
        numbers = [item.line_number for item in items]
        assert numbers == sorted(set(numbers))
        assert all(item.is_valid or item.error.startswith(f"line {item.line_number}: ") for item in items)
        assert count_items(path) == len(items) == sum(not line.is_blank for line in iter_lines(path))
