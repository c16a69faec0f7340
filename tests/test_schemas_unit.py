"""JSON schemas as clients send them, on the fake backend: what the grammar cannot enforce is
approximated and named, every output that ends is validated against the whole schema (an
invalid one is flagged, never a plain success), strict mode refuses instead, a schema compiles
once however many requests repeat it, and one that compiles too slowly is its request's error.
The grammar offers only declared properties where a schema leaves other keys unsaid, and
numbers of bounded length, while outputs are validated against the schema as given."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from fakes import FakeBackend
from multiseq import FinishReason, Request, SamplingParams
from multiseq.sampling import grammar
from multiseq.formats.openai_output import openai_record
from multiseq.formats.reader import parse_jsonl_line, parse_openai_line
from multiseq.formats.records import result_record
from multiseq.formats.resume import record_succeeded
from multiseq.formats.summary import RunTally
from multiseq.errors import ConstraintError
from multiseq.sampling.grammar import TokenConstraint
from multiseq.sampling.schema import schema_grammar
from multiseq.sampling.schema_check import SchemaCheck

# Each case: a schema with a keyword the grammar cannot enforce, what the result names as
# approximated, a reply that follows the approximated grammar but breaks the keyword, and one
# that keeps it.
APPROXIMATED = {
    "oneOf": ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]},
              "oneOf (as anyOf)", "3", "1"),
    "not": ({"type": "object", "properties": {"name": {"type": "string", "not": {"const": "admin"}}},
             "required": ["name"], "additionalProperties": False},
            "not", '{"name":"admin"}', '{"name":"bob"}'),
    "dependencies": ({"type": "object", "properties": {"card": {"type": "string"}, "billing": {"type": "string"}},
                      "dependencies": {"card": ["billing"]}, "additionalProperties": False},
                     "dependencies", '{"card":"x"}', '{"card":"x","billing":"y"}'),
    "dependencies, draft 7": ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                               "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                               "dependencies": {"a": {"required": ["b"]}}},
                              "dependencies", '{"a":1}', '{"a":1,"b":2}'),
    "dependentRequired": ({"type": "object", "properties": {"card": {"type": "string"}, "billing": {"type": "string"}},
                           "dependentRequired": {"card": ["billing"]}, "additionalProperties": False},
                          "dependentRequired", '{"card":"x"}', '{"card":"x","billing":"y"}'),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
                    "uniqueItems", "[1,1]", "[1,2]"),
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                       "additionalProperties": {"type": "integer"}},
                      "propertyNames", '{"A1":1}', '{"ab":1}'),
    "unknown format": ({"type": "object", "properties": {"re": {"type": "string", "format": "regex"}},
                        "required": ["re"], "additionalProperties": False},
                       "format: regex", '{"re":"[a-"}', '{"re":"[a-z]+"}'),
    "if/then": ({"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "size": {"type": "integer"}},
                 "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["size"]}},
                "then", '{"kind":"a"}', '{"kind":"a","size":1}'),
    "lookaround pattern": ({"type": "object", "properties": {"user": {"type": "string", "pattern": "^(?!admin$)[a-z]+$"}},
                            "required": ["user"], "additionalProperties": False},
                           "pattern: ^(?!admin$)[a-z]+$", '{"user":"admin"}', '{"user":"bob"}'),
    "overlapping patternProperties": ({"type": "object", "patternProperties": {
                                          "^a": {"type": "integer"}, "^ab": {"type": "integer", "maximum": 5}}},
                                      "patternProperties: /^a/ and /^ab/ overlap", '{"ab":9}', '{"ab":3}'),
    "recursive $ref in allOf": ({"$defs": {"node": {"type": "object", "properties": {
                                     "v": {"type": "integer"},
                                     "child": {"allOf": [{"$ref": "#/$defs/node"}, {"required": ["v"]}]}}}},
                                 "$ref": "#/$defs/node"},
                                "$ref #/$defs/node (recursive, intersected with sibling keys)",
                                '{"v":1,"child":{"v":2,"child":{"v":"x"}}}', '{"v":1,"child":{"v":2}}'),
}
# Schemas strict mode refuses, and what it names.
REFUSED_WHEN_STRICT = {name: case[0] for name, case in APPROXIMATED.items()}
REFUSAL_NAMES = {"oneOf": "oneOf", "not": '"not"', "dependencies": '"dependencies"',
                 "dependencies, draft 7": '"dependencies"', "dependentRequired": '"dependentRequired"',
                 "uniqueItems": '"uniqueItems"', "propertyNames": '"propertyNames"',
                 "unknown format": "Unknown format: regex", "if/then": '"if"',
                 "lookaround pattern": "look-around", "overlapping patternProperties": "not disjoint",
                 "recursive $ref in allOf": "circular references"}


def run(make_runner, requests, replies, **backend):
    runner = make_runner(FakeBackend(replies=replies, **backend))
    try:
        return runner.run_batch(requests)
    finally:
        runner.close()


def greedy(schema, **fields):
    return SamplingParams(**({"temperature": 0, "max_tokens": 64, "json_schema": schema} | fields))


@pytest.mark.parametrize("name", APPROXIMATED)
def test_an_approximated_keyword_is_named_and_an_output_that_breaks_it_is_flagged(make_runner, name):
    schema, approximated, breaking, keeping = APPROXIMATED[name]
    [broken, kept] = run(make_runner, [Request(prompt="bad", sampling=greedy(schema)),
                                       Request(prompt="good", sampling=greedy(schema))],
                         {"bad": breaking, "good": keeping})
    assert broken.text == breaking and broken.finish_reason is FinishReason.STOP, "the grammar let it through"
    assert approximated in broken.approximated and broken.approximated == kept.approximated
    assert not broken.ok and broken.error is None and "does not validate against json_schema" in broken.schema_error
    assert kept.text == keeping and kept.ok and kept.schema_error is None


def test_a_schema_the_grammar_enforces_exactly_approximates_nothing(make_runner):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}, "required": ["n"],
              "additionalProperties": False}
    [result] = run(make_runner, [Request(prompt="q", sampling=greedy(schema))], {"q": '{"n":9}'})
    assert result.approximated == () and result.ok and json.loads(result.text)["n"] <= 5, "the grammar kept n <= 5"


def test_an_output_cut_at_max_tokens_is_not_validated(make_runner):
    schema, _, breaking, _ = APPROXIMATED["uniqueItems"]
    [result] = run(make_runner, [Request(prompt="q", sampling=greedy(schema, max_tokens=3))], {"q": breaking})
    assert result.finish_reason is FinishReason.LENGTH and result.text == "[1,"
    assert result.ok and result.schema_error is None and result.approximated == ("uniqueItems",)


def test_an_output_cut_by_a_stop_string_is_not_a_valid_document(make_runner):
    schema, _, _, keeping = APPROXIMATED["not"]
    [result] = run(make_runner, [Request(prompt="q", sampling=greedy(schema, stop=("bob",)))], {"q": keeping})
    assert result.finish_reason is FinishReason.STOP and result.text == '{"name":"'
    assert not result.ok and "not one JSON document" in result.schema_error


@pytest.mark.parametrize("name", REFUSED_WHEN_STRICT)
def test_strict_mode_refuses_what_it_cannot_enforce_and_names_it(make_runner, name):
    [refused, other] = run(make_runner, [Request(prompt="a", sampling=greedy(REFUSED_WHEN_STRICT[name],
                                                                              strict_schema=True)),
                                         Request(prompt="b", sampling=SamplingParams(max_tokens=2))], {})
    assert refused.finish_reason is FinishReason.ERROR and refused.is_invalid_request
    assert "json_schema cannot be compiled exactly" in refused.error and REFUSAL_NAMES[name] in refused.error
    assert other.ok, "the other request runs"


def test_a_schema_nothing_can_compile_is_refused_even_leniently(make_runner):
    [result] = run(make_runner, [Request(prompt="a", sampling=greedy({"$ref": "#/$defs/missing"}))], {})
    assert result.is_invalid_request and "json_schema cannot be compiled" in result.error and "missing" in result.error


def test_a_jsonl_line_and_an_openai_line_choose_strictness():
    schema = APPROXIMATED["uniqueItems"][0]
    lenient = parse_jsonl_line(json.dumps({"prompt": "p", "json_schema": schema}), 1, SamplingParams())
    strict_line = parse_jsonl_line(json.dumps({"prompt": "p", "json_schema": schema, "strict_schema": True}), 2,
                                   SamplingParams())
    assert lenient.is_valid and not strict_line.is_valid
    assert strict_line.error_param == "json_schema" and 'Unimplemented keys: ["uniqueItems"]' in strict_line.error

    def openai_line(strict, defaults=SamplingParams()):
        spec = {"name": "x", "schema": schema} | ({} if strict is None else {"strict": strict})
        body = {"messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema", "json_schema": spec}}
        return parse_openai_line(json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
                                             "body": body}), 1, defaults)

    assert not openai_line(True).is_valid and openai_line(True).error_param == "response_format"
    assert openai_line(False).is_valid and openai_line(None).is_valid
    strict_default = SamplingParams(strict_schema=True)
    assert not openai_line(None, strict_default).is_valid, "--strict-schema for lines that do not say"
    assert openai_line(False, strict_default).is_valid, "a line's own strict: false wins"
    bad = openai_line("yes")
    assert bad.error_param == "response_format.json_schema.strict" and "true or false" in bad.error


def test_the_flag_reaches_result_lines_and_openai_output(make_runner):
    schema, _, breaking, keeping = APPROXIMATED["uniqueItems"]
    [broken, kept] = run(make_runner, [Request(prompt="bad", id="bad", sampling=greedy(schema)),
                                       Request(prompt="good", id="good", sampling=greedy(schema))],
                         {"bad": breaking, "good": keeping})
    line = result_record(broken)
    assert line["finish_reason"] == "stop" and line["text"] == breaking and line["approximated"] == ["uniqueItems"]
    assert "non-unique elements" in line["error"] and not record_succeeded(line), "--errors and --resume see it"
    assert result_record(kept)["error"] is None and record_succeeded(result_record(kept))
    tally = RunTally()
    tally.add_result(broken)
    tally.add_result(kept)
    assert (tally.num_succeeded, tally.num_failed, tally.num_requests) == (1, 1, 2), "the summary counts it as failed"

    item = parse_openai_line(json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {
        "messages": [{"role": "user", "content": "hi"}], "n": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}}), 1,
        SamplingParams())
    failed = openai_record(item, [kept, broken], "m")["response"]
    assert failed["status_code"] == 422 and failed["body"]["error"]["type"] == "invalid_output_error"
    assert failed["body"]["error"]["code"] == "output_does_not_validate"
    assert failed["body"]["error"]["message"].startswith("choice 1: the output does not validate")
    assert "(the grammar approximated: uniqueItems)" in failed["body"]["error"]["message"]
    assert not record_succeeded(openai_record(item, [kept, broken], "m"))
    passed = openai_record(item, [kept, kept], "m")["response"]
    assert passed["status_code"] == 200 and passed["body"]["schema_approximated"] == ["uniqueItems"]


def test_validation_counts_repeated_keys_and_reads_the_schemas_draft():
    check = SchemaCheck({"type": "object", "additionalProperties": {"type": "integer"}})
    assert check.error('{"a":1,"b":2}') is None
    assert "repeats the key \"a\"" in check.error('{"a":1,"a":2}')
    assert "not one JSON document" in check.error('{"a":1')
    # Draft 4's exclusiveMaximum is a flag beside maximum; 2020-12 reads it as a number.
    draft4 = SchemaCheck({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer", "maximum": 5,
                          "exclusiveMaximum": True})
    assert draft4.error("4") is None and "at $" in draft4.error("5")
    assert "could not be validated" in SchemaCheck({"type": "string", "pattern": "(?<a>x)"}).error('"x"')


def fresh(schema: dict) -> dict:
    """The schema under a title of its own, so that no earlier test has compiled it."""
    return {"title": uuid.uuid4().hex, **schema}


def counting(monkeypatch, module, name: str) -> list:
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_schema_repeated_over_many_requests_compiles_once(make_runner, monkeypatch):
    translations = counting(monkeypatch, grammar, "schema_grammar")
    matchers = counting(monkeypatch, grammar, "_build_matcher")
    schema = fresh(APPROXIMATED["not"][0])
    lines = [parse_jsonl_line(json.dumps({"prompt": f"p{index}", "json_schema": schema}), index, SamplingParams(
        temperature=0, max_tokens=32)) for index in range(20)]
    assert all(line.is_valid for line in lines) and len(translations) == 1, "read and checked: translated once"
    results = run(make_runner, [line.request for line in lines], {})
    assert all(result.finish_reason is not FinishReason.ERROR for result in results)
    assert len(translations) == 1 and len(matchers) == 1, "twenty requests, one translation, one matcher"
    assert all(result.approximated == ("not",) for result in results)
    run(make_runner, [Request(prompt="p", sampling=greedy(schema, strict_schema=True))], {})
    assert len(translations) == 2, "strict is another translation of the same schema"


@pytest.mark.parametrize("stage", ["schema_grammar", "_build_matcher"])  # translating, then the matcher
def test_a_schema_that_compiles_too_slowly_is_its_requests_error_and_the_run_goes_on(make_runner, monkeypatch, stage):
    release = threading.Event()
    original = getattr(grammar, stage)

    def slow(*args):
        release.wait(10)
        return original(*args)

    monkeypatch.setattr(grammar, stage, slow)
    monkeypatch.setattr(grammar, "COMPILE_TIMEOUT_S", 0.2)
    schema = fresh({"type": "object"})
    try:
        started = time.perf_counter()
        [slow_one, free, again] = run(make_runner, [
            Request(prompt="a", sampling=greedy(schema)), Request(prompt="b", sampling=SamplingParams(max_tokens=2)),
            Request(prompt="c", sampling=greedy(schema))], {})
        assert time.perf_counter() - started < 5, "the wait was bounded"
        assert slow_one.is_invalid_request and "json_schema took longer than 0.2 s to compile" in slow_one.error
        assert free.ok, "the run goes on"
        assert again.error == slow_one.error, "the same schema gets the same answer"
        release.set()
        time.sleep(0.05)
        [later] = run(make_runner, [Request(prompt="d", sampling=greedy(schema))], {})
        assert later.error == slow_one.error, "even once the slow compile has finished"
    finally:
        release.set()


def test_strict_schema_on_the_command_line_applies_to_lines_that_do_not_say(tmp_path, run_cli):
    schema = APPROXIMATED["uniqueItems"][0]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "say-nothing", "prompt": "p", "json_schema": schema}) + "\n"
                       + json.dumps({"id": "lenient", "prompt": "p", "json_schema": schema, "strict_schema": False})
                       + "\n")
    # --strict stops before the model loads when any line is bad, and names the bad lines.
    result = run_cli("batch-run", str(prompts), "-o", str(tmp_path / "out.jsonl"), "--strict", "--strict-schema")
    assert result.exit_code == 2, result.output
    assert "1 bad line" in result.output and 'line 1: json_schema cannot be compiled exactly' in result.output


def test_every_schema_of_the_benchmark_sample_compiles_and_strict_mode_refuses_some():
    """The 60 JSONSchemaBench schemas of bench/schemabench.py: translated leniently, none is
    refused; strictly, those with keywords the grammar cannot enforce are."""
    sample = Path(__file__).resolve().parent.parent / "bench" / "jsonschemabench_sample.jsonl"
    schemas = [json.loads(line)["schema"] for line in sample.read_text(encoding="utf-8").splitlines()]
    assert len(schemas) == 60
    approximated = [grammar.translate(SamplingParams(json_schema=schema)).approximated for schema in schemas]
    assert sum(bool(found) for found in approximated) >= 10
    refused = 0
    for schema in schemas:
        try:
            grammar.translate(SamplingParams(json_schema=schema, strict_schema=True))
        except ValueError:
            refused += 1
    assert refused >= 10


# --- the grammar's narrowed copy: declared properties only, numbers of bounded length ----------

def constraint(schema: dict, strict: bool = False) -> TokenConstraint:
    """A request's constraint as the runner builds it: the grammar, and the output check."""
    return TokenConstraint(FakeBackend().grammar_tokenizer(), SamplingParams(json_schema=schema, strict_schema=strict))


def num_allowed_bytes(schema: dict, text: str, strict: bool = False) -> int:
    """How many bytes of `text` the grammar lets through (a byte is a token of the fake)."""
    return constraint(schema, strict).matcher.try_consume_tokens(list(text.encode()))


def allows(schema: dict, text: str, strict: bool = False) -> bool:
    """Whether the grammar lets `text` through as a whole output."""
    matcher = constraint(schema, strict).matcher
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name"]}
# Where an object schema may stand: the schema around it, and the output around its value.
PLACES = {
    "top level": (lambda inner: inner, "{}"),
    "property": (lambda inner: {"type": "object", "properties": {"p": inner}, "required": ["p"],
                                "additionalProperties": False}, '{{"p":{}}}'),
    "array items": (lambda inner: {"type": "array", "items": inner}, "[{}]"),
    "anyOf branch": (lambda inner: {"anyOf": [inner, {"type": "null"}]}, "{}"),
    "$ref": (lambda inner: {"$defs": {"person": inner}, "$ref": "#/$defs/person"}, "{}"),
}


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
@pytest.mark.parametrize("place", PLACES)
def test_an_object_that_leaves_other_keys_unsaid_is_offered_only_its_declared_properties(place, strict):
    wrap, around = PLACES[place]
    schema = fresh(wrap(PERSON))
    given = json.dumps(schema)
    assert allows(schema, around.format('{"name":"ada","age":36}'), strict)
    assert allows(schema, around.format('{"name":"ada"}'), strict)
    invented = around.format('{"name":"ada","nickname":"a"}')
    assert num_allowed_bytes(schema, invented, strict) == invented.index('"nickname"') + 1, "only \"age\" may follow"
    assert constraint(schema, strict).output_error(invented) is None, "validated against the schema as given"
    assert json.dumps(schema) == given, "the request's schema is left as it is"


# Schemas whose objects may hold keys they do not declare, and an output with one.
OTHER_KEYS_ALLOWED = {
    "additionalProperties: true": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                    "additionalProperties": True}, '{"a":1,"b":"x"}'),
    "additionalProperties: a schema": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                        "additionalProperties": {"type": "integer"}}, '{"a":1,"b":2}'),
    "patternProperties": ({"type": "object", "properties": {"a": {"type": "integer"}},
                           "patternProperties": {"^x_": {"type": "integer"}}}, '{"a":1,"x_b":2}'),
    "no properties": ({"type": "object"}, '{"b":[1,{"c":null}]}'),
    "required beyond properties": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                    "required": ["a", "b"]}, '{"a":1,"b":2}'),
    "allOf branches": ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                                  {"properties": {"b": {"type": "integer"}}}]}, '{"a":1,"b":2}'),
    "$ref beside properties": ({"$defs": {"base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
                                "$ref": "#/$defs/base", "properties": {"b": {"type": "integer"}}}, '{"a":1,"b":2}'),
}


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
@pytest.mark.parametrize("name", OTHER_KEYS_ALLOWED)
def test_a_schema_that_allows_other_keys_keeps_allowing_them(name, strict):
    schema, output = OTHER_KEYS_ALLOWED[name]
    assert allows(fresh(schema), output, strict)
    assert constraint(fresh(schema), strict).output_error(output) is None


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
def test_a_long_run_of_digits_is_refused_after_the_bound(strict):
    integer = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert allows(integer, '{"n":' + "9" * 15 + "}", strict) and allows(integer, '{"n":-' + "9" * 15 + "}", strict)
    assert num_allowed_bytes(integer, '{"n":' + "9" * 40, strict) == len('{"n":') + 15
    number = {"type": "array", "items": {"type": "number"}}
    assert allows(number, "[0.5,-12.25,3," + "9" * 15 + ",-1." + "1" * 10 + "]", strict)
    assert num_allowed_bytes(number, "[" + "9" * 40, strict) == 1 + 15
    assert num_allowed_bytes(number, "[0." + "1" * 40, strict) == len("[0.") + 10
    assert num_allowed_bytes(number, "[1e999999", strict) == len("[1"), "no exponent to run on"
    assert constraint(integer, strict).output_error('{"n":' + "9" * 40 + "}") is None, "validation has no bound"


def test_a_schemas_own_number_bounds_are_kept():
    assert allows({"type": "integer", "minimum": -3, "maximum": 5}, "5")
    assert not allows({"type": "integer", "minimum": -3, "maximum": 5}, "6")
    assert not allows({"type": "integer", "minimum": 0}, "-1"), "the side the schema bounds keeps its bound"
    wide = {"type": "integer", "maximum": 10**17}
    assert allows(wide, "1" + "0" * 17) and num_allowed_bytes(wide, "9" * 40) == 17, "a wider bound of its own"
    above = {"type": "integer", "minimum": 10**17}
    assert allows(above, "1" + "0" * 25), "a minimum beyond the limit is not made empty"
    assert allows({"type": "number", "multipleOf": 0.5}, "1.5")
    assert not allows({"type": "number", "multipleOf": 0.5}, "1.25"), "its own multipleOf"
    tiny = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-12}
    assert allows(tiny, "0.0000000000005"), "a range finer than the fraction bound keeps its fraction"


@pytest.mark.parametrize("schema, output", [
    ({"type": "integer", "minimum": -1e19}, "-12"),
    ({"type": "integer", "exclusiveMinimum": -9.3e18, "maximum": 3}, "-5"),
    ({"type": "number", "minimum": -1e300}, "-12.5"),
    ({"type": "number", "maximum": 1e300}, "7.25"),
    ({"type": "array", "items": {"type": "number", "exclusiveMinimum": -1e30, "exclusiveMaximum": 1e30}}, "[1,-2.5]"),
], ids=["integer minimum -1e19", "exclusive integer -9.3e18", "number minimum -1e300", "number maximum 1e300",
        "exclusive both sides"])
def test_a_bound_beyond_what_llguidance_builds_is_pulled_in_not_refused(schema, output):
    assert allows(fresh(schema), output)
    assert constraint(fresh(schema), strict=False).output_error(output) is None


def test_a_schemas_own_options_do_not_loosen_strict_mode():
    schema = {"x-guidance": {"lenient": True}, "type": "integer", "not": {"const": 1}}
    assert schema_grammar(schema, strict=False).approximated == ("not",)
    with pytest.raises(ConstraintError, match="cannot be compiled exactly"):
        schema_grammar(schema, strict=True)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {}}, "allOf": [{"$ref": "http://[bad"}]},
    {"$id": 5, "type": "object", "properties": {"a": {}}, "allOf": [{"$ref": "#/x"}]},
    {"type": "object", "properties": {"a": {}}, "allOf": [{"$ref": "other.json#/a"}]},
], ids=["no URI", "an $id that is no string", "another document"])
def test_a_reference_that_cannot_be_followed_is_refused_with_a_reason(schema):
    with pytest.raises(ConstraintError, match="json_schema cannot be compiled: "):
        schema_grammar(schema, strict=False)


def test_a_bound_that_is_no_number_is_refused_not_replaced():
    with pytest.raises(ConstraintError, match="'maximum'"):
        schema_grammar({"type": "number", "maximum": "ten"}, strict=False)
