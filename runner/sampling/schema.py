"""JSON schemas as clients send them: the grammar that constrains the output, and a check of
every finished output against the whole schema.

llguidance compiles a JSON schema into a grammar exactly, or refuses a keyword it cannot
enforce: oneOf whose branches may overlap, not, dependencies, uniqueItems, propertyNames,
if/then/else, a format it does not know, and a few more. Real schemas (Pydantic models,
JSON Schema Store files, API specs) are full of them, so by default a schema is translated
leniently:

1. llguidance's `lenient` option leaves out the keywords and formats it does not implement
   and treats oneOf as anyOf (its `coerce_one_of`); its warnings name each one;
2. where even that fails, the schema is rewritten to leave out a little more, one rewrite per
   failure, each named: a regex llguidance cannot compile (a lookaround, say) is dropped,
   overlapping patternProperties are dropped, and a recursive $ref that would have to be
   intersected with sibling keys is cut at those places (llguidance cannot intersect a
   definition with itself while it is still compiling it).

Everything left out is listed (`Translation.approximated`), and every output that ends is
validated against the full, original schema (`SchemaCheck`), so an output that breaks a
keyword the grammar could not enforce is flagged, never passed off as valid
(multiseq.sampling.schema_check). A strict
translation compiles the schema exactly or refuses it, naming the keyword.

Either way the grammar is compiled from a narrowed copy of the schema (`grammar_schema`), so
that a small model's output ends: an object offers only its declared properties where the
schema leaves additionalProperties unsaid, and numbers have a bounded count of digits. Both
only leave out outputs that would be valid, so they are not approximations; outputs are still
validated against the schema as given.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import llguidance
import referencing
import referencing.exceptions
import referencing.jsonschema

from ..errors import ConstraintError, first_line

# llguidance's JSON options (its "x-guidance" keys), all here: `json_options` combines them with
# a schema's own. Whitespace between JSON tokens, as llama.cpp's JSON-schema grammars allow it:
# one space, or one or two newlines and an indent of up to 20. JSON itself allows any run of
# whitespace, and small models then tend to write whitespace until max_tokens instead of finishing.
JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})?"}
LENIENT_OPTIONS = {**JSON_OPTIONS, "lenient": True}  # lenient implies coerce_one_of
# A strict translation overrides whatever the schema's own "x-guidance" options say.
STRICT_OVERRIDES = {"lenient": False, "coerce_one_of": False}
# Each rewrite removes something from the schema, so a handful always settles it; the bound
# only guards against a failure that keeps coming back.
MAX_REWRITES = 16
# Keywords whose values are data, not schemas: never looked into for schema keywords.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
# Keywords that only annotate a schema: they do not make their neighbours an intersection.
_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples", "example", "definitions",
                          "$defs", "$schema", "$id", "id", "deprecated", "readOnly", "writeOnly"})


@dataclass(frozen=True)
class Translation:
    """A constraint translated for llguidance: its grammar (validated), and what the grammar
    leaves out of a JSON schema, one entry per keyword (or regex, or $ref) in words; empty
    when exact."""

    grammar: str
    approximated: tuple[str, ...] = ()


def schema_grammar(schema: dict[str, Any], strict: bool) -> Translation:
    """The grammar of a JSON schema, compiled from its `grammar_schema` copy: exact when
    `strict` (ConstraintError names what cannot be enforced), otherwise approximated where it
    must be (module docstring). Strict or not, the grammar offers only declared properties
    where additionalProperties is unsaid and numbers of bounded length: every output it leaves
    out would be valid, so a strict grammar still enforces exactly what the schema says."""
    schema = grammar_schema(schema)
    if strict:
        grammar = _grammar(schema, json_options(schema, strict=True))
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ConstraintError(f"json_schema cannot be compiled exactly: {_summary(messages[0])} (without "
                                  f"strict it would be approximated, and each output validated)")
        return Translation(grammar)
    rewrites: list[str] = []
    for _ in range(MAX_REWRITES + 1):
        grammar = _grammar(schema, json_options(schema, strict=False))
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if not is_error:
            return Translation(grammar, _unique([*rewrites, *(keyword for message in messages
                                                                for keyword in _approximations(message))]))
        rewritten = _rewrite(schema, messages[0]) if len(rewrites) < MAX_REWRITES else None
        if rewritten is None:
            raise ConstraintError(f"json_schema cannot be compiled: {_summary(messages[0])}")
        schema, notes = rewritten
        rewrites += notes
    raise AssertionError("unreachable: the loop returns or raises")


def json_options(schema: dict[str, Any], strict: bool) -> dict[str, Any]:
    """llguidance's JSON options for a schema, as `schema_grammar` compiles it: ours
    (JSON_OPTIONS, lenient unless `strict`) under the schema's own "x-guidance" ones, and a
    strict translation's overrides above them. Where a schema is embedded in a larger grammar
    (Lark's `%json`), these go in its top-level "x-guidance" key."""
    own = schema.get("x-guidance")
    return {**(JSON_OPTIONS if strict else LENIENT_OPTIONS), **(own if isinstance(own, dict) else {}),
            **(STRICT_OVERRIDES if strict else {})}


def _grammar(schema: dict[str, Any], options: dict[str, Any]) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=options)
    except ValueError as error:  # not a JSON object after all (a NaN, say)
        raise ConstraintError(f"json_schema cannot be compiled: {first_line(error)}") from None


def _summary(message: str) -> str:
    """llguidance's message on one line: a regex error names the regex and the reason (its
    first line says only "regex parse error:")."""
    lines = [line.strip() for line in message.strip().splitlines()]
    if len(lines) >= 4 and lines[0] == "regex parse error:" and lines[-1].startswith("error: "):
        return f"regex {lines[1]} cannot be compiled: {lines[-1].removeprefix('error: ')}"
    return first_line(message)


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*)\]')
_TIMES = re.compile(r" \(\d+ times\)$")


def _approximations(warning: str) -> list[str]:
    """One of llguidance's lenient warnings as the keywords it left out."""
    text = _TIMES.sub("", first_line(warning))
    keys = _UNIMPLEMENTED.match(text)
    if keys:
        try:
            return [str(key) for key in json.loads(f"[{keys.group(1)}]")]
        except ValueError:
            return [text]
    if text.startswith("Unknown format: "):
        return [f"format: {text.removeprefix('Unknown format: ')}"]
    if text.startswith("oneOf not fully supported"):
        return ["oneOf (as anyOf)"]
    if text.startswith("min/maxProperties"):
        return ["minProperties/maxProperties"]
    return [text]


# --- the grammar's copy: declared properties only, numbers of bounded length ---------------------

# Integers of at most 15 digits, as llama.cpp's grammars bound them (16 there): 10**15 - 1 is
# exact as the float llguidance reads a bound as.
NUMBER_LIMIT = 10**15 - 1
# At most 10 digits after the point (16 in llama.cpp): llguidance reads multipleOf through a
# float, and 1e-10 is the finest power of ten it reads exactly.
FRACTION_STEP = 1e-10
# The widest bound llguidance builds a range for (it fails beyond an i64 for integers, and near
# 1e19 for numbers): a schema's own bound beyond it is pulled in to it, which leaves out only
# values of more than 18 digits.
WIDEST_BOUND = 10**18
# A schema's own bounds closer than this leave the fraction unbounded: a range narrower than a
# couple of steps might hold no multiple of FRACTION_STEP at all.
_MIN_STEPPED_RANGE = 2 * FRACTION_STEP
# Keywords whose subschemas are generated as part of their parent's value (the grammar follows
# them); the others (not, if/then/else, dependentSchemas, propertyNames, contains, ...) only
# test a value, so narrowing them would change what they accept.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_SCHEMA_VALUES = frozenset({"items", "additionalProperties", "additionalItems"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems", "items"})
# Keywords through which an object may hold keys that `properties` does not declare.
_OTHER_KEYS = frozenset({"additionalProperties", "patternProperties", "unevaluatedProperties", "if", "then", "else",
                         "dependentSchemas", "dependencies", "dependentRequired"})
_ROOT_URI = "urn:multiseq:schema"
# What the referencing library raises for a $ref it cannot follow: one to nothing or to another
# document, one that is no URI (ValueError), a $schema or $id that is no string.
_UNREADABLE = (referencing.exceptions.Unresolvable, referencing.exceptions.CannotDetermineSpecification, ValueError,
               TypeError, AttributeError)


def grammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` that compiles to a grammar whose outputs end, the copy every grammar
    is compiled from (a tool's parameters included); the schema itself is left as it is, and
    outputs are validated against it. Two narrowings, each of which leaves out only outputs
    valid under the schema:

    - an object schema with `properties` that says nothing of other keys (no
      additionalProperties, patternProperties, unevaluatedProperties, conditional keywords,
      nor a required key or minProperties beyond what it declares) gets
      `additionalProperties: false`, as llama.cpp's grammars read it; otherwise a small model
      invents property after property. An object schema without properties still allows any;
    - a number or integer gets the bounds it lacks (NUMBER_LIMIT) and a number without
      multipleOf gets `multipleOf: FRACTION_STEP`, so that digits cannot run on. The schema's
      own minimum/maximum are kept, and llguidance applies them exactly.

    Where llguidance intersects schemas (allOf, or a $ref, anyOf or oneOf beside other keys),
    additionalProperties is read against the merged properties, which no single branch knows,
    so those schemas, what they reference and what they hold are left as they are."""
    if not isinstance(schema, dict):
        return schema
    narrowed = copy.deepcopy(schema)
    intersected = _intersected_nodes(narrowed)
    if intersected is None:
        return schema
    for node in _generated_schemas(narrowed):
        if id(node) not in intersected:
            _close_object(node)
            _bound_number(node)
    return narrowed


def _generated_schemas(node: Any) -> Iterator[dict[str, Any]]:
    """`node` and every schema in it that the grammar may generate (the _SCHEMA_* keywords)."""
    if not isinstance(node, dict):
        return
    yield node
    for key, value in node.items():
        for child in _subschemas(key, value):
            yield from _generated_schemas(child)


def _subschemas(key: str, value: Any) -> list[Any]:
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        return list(value.values())
    if key in _SCHEMA_LISTS and isinstance(value, list):
        return value
    return [value] if key in _SCHEMA_VALUES else []


def _is_intersection(node: dict[str, Any]) -> bool:
    """Whether llguidance intersects schemas to compile `node`: more than one of its allOf
    branches, its $ref, its anyOf, its oneOf and its other (non-annotation) keys."""
    all_of = node.get("allOf")
    num_parts = (len(all_of) if isinstance(all_of, list) else 0) + sum(key in node for key in ("$ref", "anyOf",
                                                                                              "oneOf"))
    has_own_keys = bool(set(node) - _ANNOTATIONS - {"allOf", "$ref", "anyOf", "oneOf", "x-guidance"})
    return num_parts + has_own_keys > 1


def _intersected_nodes(schema: dict[str, Any]) -> set[int] | None:
    """The ids of the schemas that llguidance intersects with others, or that lie in or are
    referenced from such a schema; None when a $ref there cannot be resolved (then no schema
    can be known not to be intersected)."""
    try:
        resource = referencing.Resource.from_contents(schema, default_specification=referencing.jsonschema.DRAFT202012)
        base = resource.id() or _ROOT_URI
    except _UNREADABLE:
        return None
    resolver = referencing.Registry().with_resource(base, resource).resolver(base_uri=base)
    intersected: set[int] = set()
    pending: list[tuple[Any, bool]] = [(schema, False)]
    while pending:
        node, is_intersected = pending.pop()
        if not isinstance(node, dict) or (is_intersected and id(node) in intersected):
            continue
        is_intersected = is_intersected or _is_intersection(node)
        if is_intersected:
            intersected.add(id(node))
            reference = node.get("$ref")
            if isinstance(reference, str):
                try:
                    pending.append((resolver.lookup(reference).contents, True))
                except _UNREADABLE:
                    return None
        for key, value in node.items():
            # Definitions are only part of a value where they are referenced.
            inner = is_intersected and key not in ("$defs", "definitions")
            pending.extend((child, inner) for child in _subschemas(key, value))
    return intersected


def _close_object(node: dict[str, Any]) -> None:
    """additionalProperties: false where the schema declares its properties and asks for no
    others (grammar_schema)."""
    properties = node.get("properties")
    if not isinstance(properties, dict) or not properties or _OTHER_KEYS & set(node):
        return
    required = node.get("required")
    if isinstance(required, list) and not set(required) <= set(properties):
        return
    min_properties = node.get("minProperties")
    if _is_number(min_properties) and min_properties > len(properties):
        return
    node["additionalProperties"] = False


def _bound_number(node: dict[str, Any]) -> None:
    """The bounds and fraction step a number or integer schema lacks (grammar_schema)."""
    types = node.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if not types & {"number", "integer"} or "enum" in node or "const" in node:
        return
    low, high = _lower_bound(node), _upper_bound(node)
    if low is not None and low < -WIDEST_BOUND and (high is None or high >= -WIDEST_BOUND):
        low = _pull_in(node, "minimum", "exclusiveMinimum", -WIDEST_BOUND)
    if high is not None and high > WIDEST_BOUND and (low is None or low <= WIDEST_BOUND):
        high = _pull_in(node, "maximum", "exclusiveMaximum", WIDEST_BOUND)
    # A side the schema bounds keeps its bound (one that is no number stays llguidance's to
    # refuse); one beyond the limit leaves the other side unbounded rather than the range empty.
    if "minimum" not in node and low is None and (high is None or high > -NUMBER_LIMIT):
        node["minimum"] = low = -NUMBER_LIMIT
    if "maximum" not in node and high is None and (low is None or low < NUMBER_LIMIT):
        node["maximum"] = high = NUMBER_LIMIT
    is_wide = low is None or high is None or high - low >= _MIN_STEPPED_RANGE
    if "number" in types and "multipleOf" not in node and is_wide:
        node["multipleOf"] = FRACTION_STEP


def _pull_in(node: dict[str, Any], inclusive: str, exclusive: str, bound: int) -> int:
    """Make `bound` the node's bound on that side (every numeric bound there is beyond it)."""
    node[inclusive] = bound
    if _is_number(node.get(exclusive)):
        del node[exclusive]
    return bound


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _lower_bound(node: dict[str, Any]) -> float | None:
    # exclusiveMinimum is a number since draft 6, a flag on minimum in draft 4.
    bounds = [node[key] for key in ("minimum", "exclusiveMinimum") if _is_number(node.get(key))]
    return max(bounds) if bounds else None


def _upper_bound(node: dict[str, Any]) -> float | None:
    bounds = [node[key] for key in ("maximum", "exclusiveMaximum") if _is_number(node.get(key))]
    return min(bounds) if bounds else None


# --- rewrites: what lenient compilation still refuses ------------------------------------------

def _rewrite(schema: dict[str, Any], error: str) -> tuple[dict[str, Any], list[str]] | None:
    """The schema with what `error` is about left out, and notes naming it; None when the
    error is not one a rewrite settles (then the schema is refused)."""
    schema = copy.deepcopy(schema)
    text = first_line(error)
    circular = re.match(r"circular references with sibling keys are not supported: \S*?(#\S*)$", text)
    if circular:
        fragment = circular.group(1)
        if _cut_refs(schema, fragment, only_intersected=True):
            return schema, [f"$ref {fragment} (recursive, intersected with sibling keys)"]
        # The intersection lies inside other definitions (a property that a patternProperties
        # regex matches too, say): the recursion is cut wherever the definition is used.
        return (schema, [f"$ref {fragment} (recursive, intersected)"]) \
            if _cut_refs(schema, fragment, only_intersected=False) else None
    overlapping = re.match(r"patternProperty regexes /(.*)/ and /(.*)/ are not disjoint", text)
    if overlapping:
        found = _drop_overlapping_pattern_properties(schema, set(overlapping.groups()))
        return (schema, [f"patternProperties: /{overlapping.group(1)}/ and /{overlapping.group(2)}/ overlap"]) \
            if found else None
    if "regex" in error.lower():
        dropped = _drop_uncompilable_patterns(schema)
        return (schema, [f"pattern: {pattern}" for pattern in dropped]) if dropped else None
    return None


def _schemas_in(node: Any) -> Iterator[dict[str, Any]]:
    """Every object in a schema that may be a schema (data keywords are not looked into)."""
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            if key not in _DATA_KEYWORDS:
                yield from _schemas_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schemas_in(value)


@functools.lru_cache(maxsize=1024)
def _is_compilable_regex(pattern: str) -> bool:
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({"type": "string", "pattern": pattern}))
    return not llguidance.LLMatcher.validate_grammar_with_warnings(grammar)[0]


def _drop_uncompilable_patterns(schema: dict[str, Any]) -> list[str]:
    """Leave out every `pattern`, and every patternProperties entry, whose regex llguidance
    cannot compile (such a string or key is then unconstrained); return those regexes."""
    dropped = []
    for node in _schemas_in(schema):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and not _is_compilable_regex(pattern):
            del node["pattern"]
            dropped.append(pattern)
        properties = node.get("patternProperties")
        if isinstance(properties, dict):
            for key in [key for key in properties if not _is_compilable_regex(key)]:
                del properties[key]
                dropped.append(key)
    return _unique(dropped)


def _drop_overlapping_pattern_properties(schema: dict[str, Any], regexes: set[str]) -> bool:
    """Leave out the patternProperties that hold both overlapping regexes (their keys then fall
    to additionalProperties); whether any were found."""
    found = False
    for node in _schemas_in(schema):
        properties = node.get("patternProperties")
        if isinstance(properties, dict) and regexes <= set(properties):
            del node["patternProperties"]
            found = True
    return found


def _cut_refs(schema: dict[str, Any], fragment: str, only_intersected: bool) -> bool:
    """Replace by {} (any value) every $ref to `fragment`, or (only_intersected) those that
    llguidance has to intersect with something where they stand: inside an allOf, inside an
    anyOf or oneOf that has sibling keys, or beside sibling keys of their own. Whether any
    were found."""

    def is_target(node: Any) -> bool:
        return isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].endswith(fragment)

    def has_siblings(node: dict[str, Any], keyword: str) -> bool:
        return bool(set(node) - _ANNOTATIONS - {keyword})

    found = False

    def visit(node: Any, intersected: bool) -> None:
        nonlocal found
        if isinstance(node, list):
            for index, value in enumerate(node):
                if intersected and is_target(value):
                    node[index], found = {}, True
                else:
                    visit(value, intersected)
            return
        if not isinstance(node, dict):
            return
        here = intersected or ("$ref" in node and has_siblings(node, "$ref"))
        for key, value in node.items():
            if key in _DATA_KEYWORDS or key == "$ref":
                continue
            inner = here or key == "allOf" or (key in ("anyOf", "oneOf") and has_siblings(node, key))
            if inner and is_target(value):
                node[key], found = {}, True
            else:
                visit(value, inner)

    visit(schema, not only_intersected)
    return found
