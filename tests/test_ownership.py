"""Who may change what, checked on the source: a sequence's fields are written by its own
methods alone (runner/loop/sequence.py), so its state changes only through the transitions
that file allows; a slot's (its holder, the prefix it keeps) by its own (runner/loop/slot.py);
and the engine's threaded front has no lock around the engine (one thread
owns it, others post messages)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEQUENCE_PY = ROOT / "runner" / "loop" / "sequence.py"
SLOT_PY = ROOT / "runner" / "loop" / "slot.py"
THREADED_FRONT = [ROOT / "runner" / "loop" / name for name in ("runner.py", "worker.py", "delivery.py")]


def own_fields(source: str, class_name: str) -> set[str]:
    """The attributes a class sets on itself."""
    [cls] = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef) and node.name == class_name]
    return {target.attr for node in ast.walk(cls) for target in written(node) if is_on_self(target)}


def written(node: ast.AST) -> list[ast.expr]:
    """What an assignment writes: its targets, tuples unpacked, a subscript's container (a
    write into a field's list changes the field)."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return []
    flat: list[ast.expr] = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, (ast.Starred, ast.Subscript)):
            targets.append(target.value)
        else:
            flat.append(target)
    return [target for target in flat if isinstance(target, ast.Attribute)]


def is_on_self(target: ast.Attribute) -> bool:
    """self.x, or anything reached from self (self.stats.x: the writer's own object)."""
    root = target.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id == "self"


def foreign_writes(source: str, fields: set[str]) -> list[str]:
    """Assignments in `source` to an attribute named like a sequence's field, on an object that
    is not the writer's own."""
    return [f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}" for node in ast.walk(ast.parse(source))
            for target in written(node) if target.attr in fields and not is_on_self(target)]


def writes_from_outside(owner: Path, fields: set[str]) -> list[str]:
    """Every write to one of `fields` on another object, in runner/ but the owner's module."""
    return [f"{path.relative_to(ROOT)} {write}" for path in sorted((ROOT / "runner").rglob("*.py"))
            if path != owner for write in foreign_writes(path.read_text(), fields)]


def test_only_the_sequence_writes_its_fields():
    fields = own_fields(SEQUENCE_PY.read_text(), "Sequence")
    assert {"status", "slot", "num_prefilled", "prompt_logprobs", "streams", "parked"} <= fields
    offenders = writes_from_outside(SEQUENCE_PY, fields)
    assert not offenders, "a sequence's fields change through its own methods (runner/loop/sequence.py):\n" + \
        "\n".join(offenders)


def test_only_the_slot_writes_its_fields():
    fields = own_fields(SLOT_PY.read_text(), "Slot")
    assert {"holder", "kept", "kept_scores", "last_used"} <= fields
    offenders = writes_from_outside(SLOT_PY, fields)
    assert not offenders, "a slot's holder and kept prefix change through its own methods (runner/loop/slot.py):\n" \
        + "\n".join(offenders)


def test_the_check_sees_a_write_from_outside():
    fields = {"slot", "prompt_logprobs", "status"}
    source = ("def f(seq, other):\n    seq.slot = 3\n    seq.prompt_logprobs[:2] = []\n"
              "    a, other.status = 1, 2\n    self.slot = 1\n    self.stats.status = 0\n    seq.other = 1\n")
    assert [write.split(":")[0] for write in foreign_writes(source, fields)] == ["line 2", "line 3", "line 4"]


def test_no_lock_is_held_around_the_engine():
    """The inbox's lock and condition guard its lists, the listeners' lock their rare writers,
    the worker's start lock its thread's one start; nothing else in the threaded front takes a
    lock (one thread owns the engine)."""
    locks = [path.name for path in THREADED_FRONT for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr in ("Lock", "RLock", "Condition", "Semaphore")]
    assert sorted(locks) == ["delivery.py", "worker.py", "worker.py", "worker.py"], locks
