"""Every finished output under a JSON schema checked against the whole schema, as the client
gave it (the grammar that constrained it may have left keywords out: multiseq.sampling.schema)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import jsonschema.validators
from jsonschema.exceptions import ValidationError, best_match

from ..errors import first_line

MAX_MESSAGE = 300  # characters of a validation message (it may quote a whole document)


def _dependencies(validator: Any, dependencies: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """Draft 7's `dependencies` (split into dependentRequired and dependentSchemas since
    2019-09), still common in schemas that name no draft."""
    if not validator.is_type(instance, "object") or not isinstance(dependencies, dict):
        return
    for name, dependency in dependencies.items():
        if name not in instance:
            continue
        if isinstance(dependency, list):
            for other in dependency:
                if other not in instance:
                    yield ValidationError(f"{other!r} is a dependency of {name!r}")
        else:
            yield from validator.descend(instance, dependency, schema_path=name)


# A schema that names no draft is read as JSON Schema 2020-12 (as llguidance reads it), plus
# draft 7's `dependencies`, which 2020-12 dropped but real schemas still use.
_DefaultValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"dependencies": _dependencies})


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # llguidance does not keep keys from repeating where additionalProperties or
    # patternProperties allow them, and JSON parsers disagree about which repeat wins.
    result = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


class SchemaCheck:
    """Validates outputs against one schema (its draft's rules, per its $schema; formats
    checked where jsonschema can check them)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        cls = jsonschema.validators.validator_for(schema, default=_DefaultValidator)
        self._validator = cls(schema, format_checker=cls.FORMAT_CHECKER)

    def error(self, text: str) -> str | None:
        """Why `text` is not one JSON document valid under the schema; None when it is."""
        try:
            document = json.loads(text, object_pairs_hook=_unique_keys)
        except _DuplicateKey as error:
            return f"the output repeats the key {json.dumps(error.key)} in one object"
        except (ValueError, RecursionError) as error:
            return f"the output is not one JSON document ({_shortened(first_line(error))})"
        try:
            found = best_match(self._validator.iter_errors(document))
        except Exception as error:  # noqa: BLE001 - a schema jsonschema cannot apply (a bad regex, a remote $ref)
            return f"the output could not be validated against json_schema ({_shortened(first_line(error))})"
        if found is None:
            return None
        return f"the output does not validate against json_schema: at {found.json_path}: {_shortened(found.message)}"


def _shortened(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."

