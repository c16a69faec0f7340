"""Every template's own rendering of calls reads back as those calls, with no marker in the text.

A chat template that writes an assistant's calls into the history shows the model the format it
is to write. For every such template in tests/data/llama.cpp-templates: an assistant turn (text,
reasoning where the template keeps it, calls whose values are any text), rendered by the
template, is read as the model's output after the template's own prompt by the family detected
from that template, whole and streamed cut anywhere: the same calls with the same arguments,
the text and the reasoning as they were written, and none of the family's markers in the
content, the reasoning or an argument. (tests/test_family_markers.py asks the same of the text
the families' grammars write.)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from multiseq.llama.chat_template import JinjaRenderer
from multiseq.tools import Tool, read_output
from multiseq.tools.families import detect

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
PARAMETERS = {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["text"]}
NOTE = Tool("note", None, PARAMETERS)
TOOLS = [{"type": "function", "function": {"name": "note", "description": "Take a note.", "parameters": PARAMETERS}}]
QUESTION = ({"role": "user", "content": "Take two notes."},)
SENTINEL = "Sentinel-Zq9"
PROBE = "probe value"

# The tokens that end a generation (llama.cpp's vocabulary marks them end-of-generation): the
# model's output stops before them, so the rendered turn is read without them.
END_OF_GENERATION = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|return|>", "<|call|>", "<|calls|>",
                     "<|flush|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<turn|>", "<|tool_response>",
                     "<｜end▁of▁sentence｜>", "[e~[", "<|END_OF_TURN_TOKEN|>", "<seed:eos>", "<|end_of_text|>",
                     "[EOT]", "[EOS]", "<|eot|>", "<|end_of_msg|>")

# Templates whose history holds no call a model could write as one output, and why.
NOT_ONE_OUTPUT = {
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "writes a turn's text after its calls, as a turn of its own",
    "NVIDIA-Nemotron-Nano-v2.jinja": "writes a turn's text and its calls as two turns",
}

# Text around and inside calls: letters, digits, spaces, line breaks and punctuation, but not the
# characters markup is made of, nor a backslash (tests/test_family_markers.py's PLAIN).
PLAIN = st.text(st.characters(blacklist_characters="<>[]{}|\\`=\"'", blacklist_categories=("Cs", "Cc")),
                max_size=30)
# A call's value may also hold double quotes and backslashes, which the templates escape (JSON) or
# write as they are (XML-like values); not a single quote, which LFM2's templates write unescaped
# inside single quotes (text='it's'), as no reader can read back.
VALUE = st.text(st.characters(blacklist_characters="<>[]{}|`='", blacklist_categories=("Cs", "Cc")), max_size=30)


@functools.cache
def template(name: str) -> tuple[str, JinjaRenderer, str, str]:
    """(its source, its renderer, its prompt for QUESTION, what it writes after a plain answer)."""
    source = (TEMPLATES / name).read_text()
    renderer = JinjaRenderer(source, name, "", "", add_bos=False)
    plain = renderer.render((*QUESTION, {"role": "assistant", "content": SENTINEL}), TOOLS, generation_prompt=False)
    return source, renderer, renderer.render(QUESTION, TOOLS), plain[plain.rindex(SENTINEL) + len(SENTINEL):]


def rendered_turn(name: str, text: str, thought: str, calls: list[dict]) -> str:
    """The assistant's turn as the template writes it into the history, where the model's own
    output would be: after what the prompt shares with it, before its end of turn."""
    _, renderer, prompt, turn_end = template(name)
    message = {"role": "assistant", "content": text, "reasoning_content": thought, "tool_calls": [
        {"id": f"call{index:05d}", "type": "function", "function": {"name": "note", "arguments": json.dumps(arguments)}}
        for index, arguments in enumerate(calls)]}
    whole = renderer.render((*QUESTION, message), TOOLS, generation_prompt=False)
    shared = next((index for index, (a, b) in enumerate(zip(prompt, whole)) if a != b), min(len(prompt), len(whole)))
    if shared < len(prompt) and whole[shared - 1] not in ">]\n":  # parted inside a marker: the turn starts with it
        shared = max(whole.rfind("<", 0, shared), whole.rfind("[", 0, shared))
    return without_end(whole[shared:], turn_end)


def without_end(turn: str, turn_end: str) -> str:
    """The turn less what the template writes after every turn (or the markers at its end the two
    share), and less the tokens that end a generation."""
    common = next((length for length in range(min(len(turn), len(turn_end)), 0, -1)
                   if turn.endswith(turn_end[-length:]) and (length == len(turn_end) or turn_end[-length] in "<[")), 0)
    turn = turn[:len(turn) - common]
    while end := next((end for end in END_OF_GENERATION if turn.rstrip().endswith(end)), None):
        turn = turn.rstrip()[:-len(end)]
    return turn.rstrip()


@functools.cache
def calls_written(name: str) -> int:
    """How many calls of a turn with text the template writes: 2, 1 (gpt-oss, GigaChat and Llama
    3.x write the first alone, or refuse more), or 0 (it writes none, or none beside text)."""
    for count in (2, 1):
        try:
            turn = rendered_turn(name, "Answer", "", [{"text": f"{PROBE} {index}"} for index in range(count)])
        except ValueError:
            continue
        if all(f"{PROBE} {index}" in turn for index in range(count)):
            return count
    return 0


@functools.cache
def writes_backslashes_raw(name: str) -> bool:
    """Whether the template writes a string value's backslashes as they are inside Python-style
    quotes (LFM2.5's text='a\\b'), where every reader takes them for escapes ('\\' is no string,
    '\\n' a line break): values with one are then not drawn, as single quotes never are."""
    return "'a\\b'" in rendered_turn(name, "Answer", "", [{"text": "a\\b"}])


NAMES = sorted(path.name for path in TEMPLATES.glob("*.jinja"))
WRITING_CALLS = [name for name in NAMES if name not in NOT_ONE_OUTPUT and calls_written(name)]


def test_most_templates_write_calls_and_each_exception_is_a_template():
    assert len(WRITING_CALLS) >= 55, WRITING_CALLS
    assert set(NOT_ONE_OUTPUT) <= set(NAMES) and all(calls_written(name) for name in NOT_ONE_OUTPUT)
    assert "Qwen-Qwen3-0.6B.jinja" in WRITING_CALLS and "HuggingFaceTB-SmolLM3-3B.jinja" not in WRITING_CALLS


@pytest.mark.parametrize("name", WRITING_CALLS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_templates_own_turn_reads_back_with_no_marker_in_its_text(name, data):
    source, _, prompt, _ = template(name)
    family = detect(source)
    markers = [marker for marker in family.markers if marker]
    text, thought = (data.draw(PLAIN, label=label) for label in ("text", "thought"))
    value = data.draw(VALUE, label="value")
    # Told apart wherever the template puts them, and as templates trim them.
    text, thought = f"Answer: {text}".strip(), f"Thought: {thought}".strip()
    assume(not any(marker in piece for piece in (text, thought, value) for marker in markers))
    assume("\\" not in value or not writes_backslashes_raw(name))
    calls = [{"text": value, "n": index} for index in range(calls_written(name))]
    if family.reasoning and prompt.rstrip().endswith(family.reasoning[1]):
        thought = ""  # the prompt wrote an empty reasoning block: the model writes none
    turn = rendered_turn(name, text, thought, calls)
    if family.reasoning and family.opens_reasoning(prompt) and thought not in turn and family.reasoning[1] not in turn:
        turn = family.reasoning[1] + turn  # the template keeps no reasoning: the model's closes here
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(turn) - 1)), max_size=10), label="cuts"))
    for pieces in (None, [turn[start:end] for start, end in zip([0, *cuts], [*cuts, len(turn)])]):
        parsed = read_output(pieces if pieces is not None else turn, family, template=source, tools=[NOTE],
                             prompt=prompt)
        assert parsed.error is None, (parsed.error, turn)
        assert [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls] == \
            [("note", arguments) for arguments in calls], turn
        where_text = parsed.reasoning if family.name == "gpt-oss" else parsed.content  # its analysis channel
        if text in turn:
            assert (where_text or "").strip() == text, (parsed, turn)
        if thought and thought in turn and family.name != "gpt-oss":
            assert (parsed.reasoning or "").strip() == thought, (parsed, turn)
        for marker in markers:
            for where, read_text in (("content", parsed.content), ("reasoning", parsed.reasoning),
                                     *(("arguments", call.arguments) for call in parsed.tool_calls)):
                assert marker not in (read_text or ""), f"{marker!r} reached the {where}: {read_text!r} (turn {turn!r})"
