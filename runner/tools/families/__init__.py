"""The registry of model families' tool-call and reasoning formats: one module, one family.

Every module of this package defines `FAMILY`, a `multiseq.tools.family.Family`; adding a
family is adding a module (docs/tool-formats.md says how). `detect` finds a chat template's
family: exact fingerprints first (most specific first), then the generic format.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from ..family import Family

GENERIC = "generic"


@cache
def all_families() -> tuple[Family, ...]:
    """Every registered family, in detection order."""
    families = [importlib.import_module(f"{__name__}.{module.name}").FAMILY
                for module in pkgutil.iter_modules(__path__) if not module.name.startswith("_")]
    names = [family.name for family in families]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
        raise RuntimeError(f"tool-call families registered twice: {sorted(duplicates)}")
    return tuple(sorted(families, key=lambda family: (family.priority, family.name)))


def family_names() -> tuple[str, ...]:
    return tuple(sorted(family.name for family in all_families()))


def family_named(name: str) -> Family:
    """The family of that name (--tool-format); ValueError naming the known ones."""
    for family in all_families():
        if family.name == name:
            return family
    raise ValueError(f"unknown tool-call format {name!r}: the formats are {', '.join(family_names())}")


def detect(template: str | None) -> Family:
    """The family whose fingerprint the template holds; the generic format when none does."""
    if template:
        for family in all_families():
            if family.matches(template):
                return family
    return family_named(GENERIC)
