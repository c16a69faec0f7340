"""llama-server's /infill, as llama.vscode and llama.vim call it: the fill-in-the-middle layout
(the same tokens llama-server builds for the same request), and the door on the fake backend,
with the editor's limits (n_indent, t_max_predict_ms) and its cache-warming n_predict 0."""

from __future__ import annotations

import json

import pytest
from fakes import BOS, FIM_MID, FIM_PRE, FIM_REP, FIM_SEP, FIM_SUF, FakeBackend
from helpers import post_json
from multiseq.formats.fields import ItemError
from multiseq.formats.infill import ExtraChunk, InfillInput, InfillWindow, infill_input, infill_tokens
from multiseq.llama.text import FimTokens
from multiseq.server import ServerSettings, create_app

FIM = FimTokens(FIM_PRE, FIM_SUF, FIM_MID, FIM_REP, FIM_SEP)
WIDE = InfillWindow(n_batch=2048, n_ctx=4096)


def text_tokens(text: str) -> list[int]:
    return list(text.encode())


def tokens(*parts: str | int) -> list[int]:
    return [token for part in parts for token in (text_tokens(part) if isinstance(part, str) else [part])]


def test_the_repository_level_layout_puts_other_files_first_and_the_cursor_last():
    request = InfillInput("def f():\n    ", "\nprint(f())", (ExtraChunk("x = 1", "a.py"), ExtraChunk("y = 2")), "ret")
    built = infill_tokens(request, FIM, text_tokens, text_tokens("ret"), WIDE, bos=None)
    assert built == tokens(FIM_REP, "myproject\n", FIM_SEP, "a.py\n", "x = 1", FIM_SEP, "tmp\n", "y = 2",
                           FIM_SEP, "filename\n", FIM_PRE, "def f():\n    ", "ret", FIM_SUF, "\nprint(f())", FIM_MID)


def test_without_repository_tokens_chunks_follow_a_snippet_line_and_bos_follows_them():
    fim = FimTokens(FIM_PRE, FIM_SUF, FIM_MID)
    request = InfillInput("a", "b", (ExtraChunk("x", "a.py"),))
    built = infill_tokens(request, fim, text_tokens, [], WIDE, bos=7)
    assert built == tokens("\n\n--- snippet ---\n\n", "x", 7, FIM_PRE, "a", FIM_SUF, "b", FIM_MID)


def test_long_text_is_cut_as_llama_server_cuts_it():
    """The prefix keeps its last 3/4 of a batch, the suffix its first quarter less the prompt
    and two, the chunks the last (context - batch + 2) tokens (the server's n_predict is -1)."""
    window = InfillWindow(n_batch=64, n_ctx=80)
    request = InfillInput("p" * 100 + "END", "START" + "s" * 100, (ExtraChunk("e" * 50 + "LAST"),))
    built = infill_tokens(request, FIM, text_tokens, text_tokens("xy"), window, bos=None)
    extra_end = built.index(FIM_PRE)
    assert built[:extra_end] == tokens("eeee", "LAST", FIM_SEP, "filename\n")  # 18 = 80 - 64 + 2
    prefix = bytes(built[extra_end + 1:built.index(FIM_SUF)])
    assert prefix == b"p" * 45 + b"END" + b"xy"  # 48 = 3/4 of 64, then the prompt
    suffix = bytes(built[built.index(FIM_SUF) + 1:-1])
    assert suffix == b"START" + b"s" * 7  # 16 - (2 + 2)
    assert built[-1] == FIM_MID


def test_mixed_prefix_of_texts_and_token_ids_is_taken_as_given():
    request = InfillInput(["a", 300, "b"], "")
    built = infill_tokens(request, FIM, text_tokens, [], WIDE, None)
    start = built.index(FIM_PRE)
    assert built[start:] == tokens(FIM_PRE, "a", 300, "b", FIM_SUF, FIM_MID)


@pytest.mark.parametrize("body, param", [
    ({"input_suffix": ""}, "input_prefix"),
    ({"input_prefix": ""}, "input_suffix"),
    ({"input_prefix": 3, "input_suffix": ""}, "input_prefix"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": {"text": "x"}}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a.py"}]}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "x", "filename": 1}]}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "prompt": ["x"]}, "prompt"),
])
def test_bad_infill_fields_name_the_field(body, param):
    with pytest.raises(ItemError) as raised:
        infill_input(body)
    assert raised.value.param == param


# --- the door, on the fake backend ------------------------------------------------------------

# What the fake's prompt reads as (its bytes; the FIM tokens are not bytes) for the request below.
CURSOR_PROMPT = "myproject\nfilename\ndef f():\n\nprint(f())"
BLOCK = "    x = 1\n    return x\n\ny = f()\n"


@pytest.fixture
def serve_fake(make_runner, serve_app):
    def serve(fim: bool = True, **backend_args) -> str:
        backend = FakeBackend(fim=fim, replies={CURSOR_PROMPT: BLOCK}, **backend_args)
        return serve_app(create_app(make_runner(backend), ServerSettings(model_name="fake-model")))
    return serve


def post(base: str, path: str, body: dict) -> tuple[int, dict]:
    status, data = post_json(base, path, body)
    return status, json.loads(data)


EDITOR_REQUEST = {"input_prefix": "def f():\n", "input_suffix": "\nprint(f())", "input_extra": [], "prompt": "",
                  "n_predict": 64, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
                  "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "temperature": 0}


def test_infill_completes_the_middle_and_shows_the_prompt_it_built(serve_fake):
    status, answer = post(serve_fake(), "/infill", EDITOR_REQUEST)
    assert status == 200 and answer["content"] == BLOCK and answer["stop_type"] == "eos"
    assert answer["prompt"] == f"<{FIM_REP}>myproject\n<{FIM_SEP}>filename\n<{BOS}><{FIM_PRE}>def f():\n" \
                               f"<{FIM_SUF}>\nprint(f())<{FIM_MID}>"
    assert answer["tokens_evaluated"] == len(answer["prompt"]) - 6 * 5 + 6  # each marker is one token


def test_n_indent_ends_the_block_where_it_dedents(serve_fake):
    status, answer = post(serve_fake(), "/infill", EDITOR_REQUEST | {"n_indent": 4})
    assert status == 200 and answer["content"] == "    x = 1\n    return x\n" and answer["stop_type"] == "limit"


def test_t_max_predict_ms_ends_at_the_first_new_line_after_the_deadline(serve_fake):
    """Each decode takes 20 ms: past a 1 ms deadline at the second token, so the first new
    line ends it."""
    status, answer = post(serve_fake(decode_delay=0.02), "/infill", EDITOR_REQUEST | {"t_max_predict_ms": 1})
    assert status == 200 and answer["content"] == "    x = 1\n" and answer["stop_type"] == "limit"


def test_n_predict_0_computes_the_prompt_and_answers_nothing(serve_fake):
    """llama.vscode warms the cache with its chunks this way, then asks again."""
    base = serve_fake()
    status, warm = post(base, "/infill", EDITOR_REQUEST | {"n_predict": 0})
    assert status == 200 and warm["content"] == "" and warm["tokens_predicted"] == 0
    status, answer = post(base, "/infill", EDITOR_REQUEST)
    assert status == 200 and answer["content"] == BLOCK and answer["tokens_cached"] > 0


def test_a_model_without_fim_tokens_gets_a_clear_400(serve_fake):
    status, answer = post(serve_fake(fim=False), "/infill", EDITOR_REQUEST)
    assert status == 400 and "fill-in-the-middle" in answer["error"]["message"]
    assert "prefix, suffix, middle" in answer["error"]["message"]


@pytest.mark.parametrize("change, param", [
    ({"input_suffix": None}, "input_suffix"),
    ({"input_extra": [{"filename": "a.py"}]}, "input_extra"),
    ({"n_indent": -1}, "min_indent"),
    ({"lora": [{"id": 0, "scale": 0.5}]}, "lora"),
])
def test_bad_input_is_a_400_naming_the_field(serve_fake, change, param):
    body = {name: value for name, value in (EDITOR_REQUEST | change).items() if value is not None}
    status, answer = post(serve_fake(), "/infill", body)
    assert status == 400 and answer["error"]["param"] == param
