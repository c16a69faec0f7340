"""No source file passes 500 lines, no class 250, and no function of runner/ 60: a module, class
or function that grows past them is split by concern (collaborators, not mixins that only hide
length). Checked on the source of runner/, cli/ and models/ (functions: runner/'s; cli/'s
commands carry click's declarations); a class or function is measured with the ast module from
its `class` or `def` line to its last line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = [ROOT / "runner", ROOT / "cli", ROOT / "models"]
MAX_FILE_LINES = 500
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 60


def source_files(folders: list[Path]) -> list[Path]:
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


def class_lengths(source: str, filename: str) -> list[tuple[str, int]]:
    """Each class in the source (nested ones too), with its length in lines."""
    return [(node.name, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(source, filename)) if isinstance(node, ast.ClassDef)]


def offenders(files: list[Path], root: Path) -> list[str]:
    """The files past MAX_FILE_LINES and the classes past MAX_CLASS_LINES, by name and length."""
    found = []
    for path in files:
        source = path.read_text()
        name = path.relative_to(root).as_posix()
        num_lines = len(source.splitlines())
        if num_lines > MAX_FILE_LINES:
            found.append(f"{name}: {num_lines} lines (at most {MAX_FILE_LINES})")
        found += [f"{name}: class {class_name}, {length} lines (at most {MAX_CLASS_LINES})"
                  for class_name, length in class_lengths(source, str(path)) if length > MAX_CLASS_LINES]
    return found


def function_lengths(source: str, filename: str) -> list[tuple[str, int]]:
    """Each function in the source (methods and nested ones too), with its length in lines."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source, filename))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def long_functions(files: list[Path], root: Path) -> list[str]:
    return [f"{path.relative_to(root).as_posix()}: {name}, {length} lines (at most {MAX_FUNCTION_LINES})"
            for path in files for name, length in function_lengths(path.read_text(), str(path))
            if length > MAX_FUNCTION_LINES]


def test_no_function_of_runner_is_too_long():
    found = long_functions(source_files([ROOT / "runner"]), ROOT)
    assert not found, "split these:\n" + "\n".join(found)


def test_the_check_flags_a_function_past_60_lines(tmp_path):
    body = "\n".join(f"    value_{index} = {index}" for index in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "at_the_limit.py").write_text(f"def fits():\n{body}\n")
    (tmp_path / "too_long.py").write_text(f"async def grows():\n{body}\n    return value_0\n")
    assert long_functions(source_files([tmp_path]), tmp_path) == ["too_long.py: grows, 61 lines (at most 60)"]


def test_no_file_or_class_is_too_long():
    found = offenders(source_files(SOURCE_FOLDERS), ROOT)
    assert not found, "split these by concern:\n" + "\n".join(found)


def module_with_class(num_class_lines: int, num_lines_after: int = 0) -> str:
    """A module whose one class spans num_class_lines lines, then num_lines_after more lines."""
    body = [f"    value_{index} = {index}" for index in range(num_class_lines - 2)]
    return "\n".join(["class Sized:", '    """A class of a known length."""', *body,
                      *(f"after_{index} = {index}" for index in range(num_lines_after))]) + "\n"


def test_the_check_flags_a_class_past_250_lines_and_a_file_past_500(tmp_path):
    package = tmp_path / "made_up"
    package.mkdir()
    (package / "at_the_limits.py").write_text(module_with_class(MAX_CLASS_LINES, MAX_FILE_LINES - MAX_CLASS_LINES))
    (package / "long_class.py").write_text(module_with_class(MAX_CLASS_LINES + 1))
    (package / "long_file.py").write_text(module_with_class(10, MAX_FILE_LINES - 9))
    assert class_lengths((package / "long_class.py").read_text(), "long_class.py") == [("Sized", 251)]
    assert offenders(source_files([package]), tmp_path) == [
        "made_up/long_class.py: class Sized, 251 lines (at most 250)",
        "made_up/long_file.py: 501 lines (at most 500)",
    ]
