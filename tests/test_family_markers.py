"""No marker of a family ever reaches content, reasoning or arguments, whatever text surrounds it.

For every family: calls written in its own syntax (the one its grammar writes, or for the
JSON-call formats the one their templates write), between any text, after reasoning or not,
read whole and streamed cut anywhere, come back as those calls, and none of the family's
markers (opening or closing, of calls, sections, reasoning, turns) is in the content, the
reasoning or any call's arguments.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from multiseq.tools import Tool, read_output
from multiseq.tools.families import all_families, family_named
from multiseq.tools.writing import written

NOTE = Tool("note", None, {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
                           "required": ["text"]})

# Text around and inside calls: any letters, digits, spaces, line breaks and punctuation, but not
# the characters markup is made of (a marker written in the text would be the model's markup,
# not text) nor a backslash (raw text in XML-like values is written unescaped).
PLAIN = st.text(st.characters(blacklist_characters="<>[]{}|\\`=\"'", blacklist_categories=("Cs", "Cc")),
                max_size=40)


def json_call(name: str, arguments: dict, arguments_key: str = "arguments") -> str:
    return json.dumps({"name": name, arguments_key: arguments}, ensure_ascii=False)


# Three of the JSON-call formats written as their templates write them (which their grammars' form
# is one of: Mistral's templates write [TOOL_CALLS]name[ARGS]{...} too).
LEGACY_WRITERS = {
    "hermes": lambda calls: "\n".join(f"<tool_call>\n{json_call(name, arguments)}\n</tool_call>"
                                      for name, arguments in calls),
    "llama3": lambda calls: "<|python_tag|>" + "; ".join(json_call(name, arguments, "parameters")
                                                         for name, arguments in calls),
    "mistral": lambda calls: "".join(f"[TOOL_CALLS]{name}[ARGS]{json.dumps(arguments, ensure_ascii=False)}"
                                     for name, arguments in calls),
}


# Where text around calls needs a message of its own (the formats made of messages addressed to a
# recipient), and elsewhere on lines of its own (formats that read a call only at a line's start:
# Command R+'s Action:, a bare function tag).
FRAMES = {
    "functionary-v3.2": lambda before, calls, after: f"all\n{before}>>>{calls}>>>all\n{after}",
    "muse-glimmer": lambda before, calls, after: (f" to=user<|message|>{before}<|eom|><|start|>assistant{calls}"
                                                  f"<|eom|><|start|>assistant to=user<|message|>{after}"),
}


def framed(family, before: str, calls: str, after: str) -> str:
    if family.call_syntax is not None and family.call_syntax.leads and family.name not in LEGACY_WRITERS:
        before = ""  # its calls come first or not at all (the generic format's)
    frame = FRAMES.get(family.name, lambda before, calls, after: f"{before}\n{calls}\n{after}")
    return frame(before, calls, after)


def reasoning_of(family) -> tuple[str, str] | None:
    """The reasoning block as the family's grammar writes it (where a message follows it, its
    header too), else as the family reads it."""
    syntax = family.call_syntax or next(iter(family.variant_call_syntax.values()), None)
    return (syntax.reasoning if syntax is not None and syntax.reasoning else None) or family.reasoning


def writer_of(family):
    if family.name in LEGACY_WRITERS:
        return LEGACY_WRITERS[family.name]
    syntax = family.call_syntax or next(iter(family.variant_call_syntax.values()), None)
    return None if syntax is None else (lambda calls: written(syntax, calls))


def variant_of(family) -> str | None:
    return None if family.call_syntax is not None else next(iter(family.variant_call_syntax), None)


FAMILIES = [family for family in all_families() if writer_of(family) is not None]


def read(family, text: str, pieces: list[str] | None):
    return read_output(pieces if pieces is not None else text, family, tools=[NOTE], variant=variant_of(family))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_marker_reaches_content_reasoning_or_arguments(family, data):
    markers = [marker for marker in family.markers if marker]
    before, after, thought, value = (data.draw(PLAIN, label=label) for label in ("before", "after", "thought", "value"))
    assume(not any(marker in piece for piece in (before, after, thought, value) for marker in markers))
    num_calls = 1 if family.name == "gpt-oss" else data.draw(st.integers(1, 2), label="calls")  # one call per turn
    calls = [("note", {"text": value or "x", "n": index}) for index in range(num_calls)]
    reasons = family.reasoning is not None and data.draw(st.booleans(), label="reasons")
    opener, closer = reasoning_of(family) if reasons else ("", "")
    text = f"{opener}{thought}{closer}" * reasons + framed(family, before, writer_of(family)(calls), after)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=12), label="cuts"))
    for pieces in (None, [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)])]):
        parsed = read(family, text, pieces)
        assert parsed.error is None, (parsed.error, text)
        assert [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls] == calls, text
        for marker in markers:
            for where, read_text in (("content", parsed.content), ("reasoning", parsed.reasoning),
                                     *(("arguments", call.arguments) for call in parsed.tool_calls)):
                assert marker not in (read_text or ""), f"{marker!r} reached the {where}: {read_text!r} (text {text!r})"


def test_a_marker_in_the_content_is_caught():
    """The check itself: a call the family cannot read leaves its markers in the content."""
    parsed = read(family_named("hermes"), "Sure. <tool_call>\n{not json}\n</tool_call>", None)
    assert "<tool_call>" in parsed.content and parsed.error is not None
