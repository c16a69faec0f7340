"""A family whose markers are control tokens (gpt-oss's <|channel|>, Kimi's sections): llama.cpp
renders control tokens as nothing, so the engine hands those tokens' text to the family's parser,
and only to it: the channels split reasoning from the answer, and no marker reaches the text
of a request that is not parsed (a plain completion).

A fake backend with a gpt-oss template and its markers as control tokens (ids 300 and up) stands
in for the model.
"""

from __future__ import annotations

from fakes import EOS, FakeBackend
from multiseq import Request, SamplingParams
from multiseq.tools.families import family_named

GPT_OSS = family_named("gpt-oss")
MARKERS = {marker: 300 + index for index, marker in enumerate(GPT_OSS.markers)}
TEMPLATE = "{{ '<|start|>assistant' }}{{ '<|channel|>analysis<|message|>' }}"  # its fingerprint, enough here


class ControlTokenBackend(FakeBackend):
    """Markers tokenize to one control token each and render as nothing, as in llama.cpp."""

    chat_template_source = TEMPLATE

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        tokens, position = [], 0
        while position < len(text):
            marker = next((marker for marker in MARKERS if text.startswith(marker, position)), None)
            if marker is not None:
                tokens.append(MARKERS[marker])
                position += len(marker)
            else:
                tokens.extend(text[position].encode())
                position += 1
        return tokens if not add_special else [256, *tokens]

    def render_chat(self, messages, tools=None, options=None, **shaping) -> str:
        return "".join(f"<|start|>{m['role']}<|message|>{m['content']}<|end|>" for m in messages) + "<|start|>assistant"


def reply_tokens(backend: ControlTokenBackend, text: str) -> list[int]:
    return backend.tokenize(text, add_special=False) + [EOS]


OUTPUT = "<|channel|>analysis<|message|>They greet me.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"


def test_control_token_markers_reach_the_parser_and_never_the_text(make_runner):
    backend = ControlTokenBackend(num_slots=2, window=256, n_batch=64)
    chat_prompt = "userHiassistant"  # the prompt's bytes, control tokens left out (the fake's reply key)
    backend.replies[chat_prompt] = reply_tokens(backend, OUTPUT)
    backend.replies["Say hi"] = reply_tokens(backend, OUTPUT)
    runner = make_runner(backend)
    assert runner.tool_family["name"] == "gpt-oss"
    chat, plain = runner.run_batch([
        Request(messages=[{"role": "user", "content": "Hi"}], sampling=SamplingParams(max_tokens=64, temperature=0)),
        Request(prompt="Say hi", sampling=SamplingParams(max_tokens=64, temperature=0))])
    assert chat.reasoning == "They greet me."
    assert chat.text == "Hello!"
    # A plain completion has no parser: the control tokens render as nothing, llama.cpp's way.
    assert plain.text == "analysisThey greet me.assistantfinalHello!"
    assert not any(marker in plain.text for marker in MARKERS)


def test_reasoning_format_none_keeps_the_raw_text(make_runner):
    backend = ControlTokenBackend(num_slots=1, window=256, n_batch=64)
    backend.replies["userHiassistant"] = reply_tokens(backend, OUTPUT)
    runner = make_runner(backend, reasoning_format="none")
    [chat] = runner.run_batch([Request(messages=[{"role": "user", "content": "Hi"}],
                                       sampling=SamplingParams(max_tokens=64, temperature=0))])
    assert chat.reasoning is None
    assert chat.text == "analysisThey greet me.assistantfinalHello!"
