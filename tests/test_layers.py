"""Imports go one way, and nowhere in a circle.

Layers, top to bottom: the command line (multiseq.cli), the server, multiseq.ray and
multiseq.ray_serve (with its ray_serve_* parts); below them
multiseq.formats (request bodies, prompt files, result records, the batch loop); the engine (every
other module of multiseq: multiseq.loop.engine, multiseq.loop.runner, multiseq.tools...); at the bottom
multiseq.models. Exactly one module imports llama_cpp, and
neither the engine nor formats import a terminal or HTTP library. Checked on the source, every
import counted, including the ones inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Where each installed package's source lives (pyproject.toml's package-dir), most specific first.
PACKAGE_DIRS = [
    ("multiseq", ROOT / "runner"),
    ("multiseq.cli", ROOT / "cli"),
    ("multiseq.models", ROOT / "models"),
]
TOP = ("multiseq.cli", "multiseq.server", "multiseq.ray", "multiseq.ray_serve")
UI_AND_HTTP = ("click", "rich", "fastapi", "starlette", "uvicorn", "httpx", "prometheus_client", "aiohttp")


def module_name(path: Path) -> str:
    for package, folder in PACKAGE_DIRS:
        if path.is_relative_to(folder):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise AssertionError(f"{path} belongs to no package")


def source_files() -> list[Path]:
    files = []
    for package, folder in PACKAGE_DIRS:
        inner = [other for _, other in PACKAGE_DIRS if other != folder and other.is_relative_to(folder)]
        files += [path for path in folder.rglob("*.py") if not any(path.is_relative_to(other) for other in inner)]
    return sorted(set(files))


def imports_of(path: Path) -> set[str]:
    """Every module the file imports, anywhere in it, by absolute name (`from x import y` counts
    as x.y where that is a module of ours, else x)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in source_files()}
    return {name: {imported for imported in imports_of(path) if imported in modules or not imported.startswith("multiseq")}
            for name, path in modules.items()}


def is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


NOT_ENGINE = ("multiseq.formats", *TOP, "multiseq.models")


def is_engine(module: str) -> bool:
    """A module of the engine: in multiseq, not the package's own __init__ (the public API, which
    names the engine's modules only lazily), and in none of the layers around it."""
    return is_in(module, "multiseq") and module != "multiseq" and not any(is_in(module, other) for other in NOT_ENGINE)


def engine_modules(graph) -> list[str]:
    return [name for name in graph if is_engine(name)]


def test_the_engine_imports_nothing_above_it(graph):
    above = ("multiseq.formats", *TOP, "bench")
    wrong = {name: sorted(imported for imported in imports if any(is_in(imported, top) for top in above))
             for name, imports in graph.items() if name in engine_modules(graph)}
    assert not {name: found for name, found in wrong.items() if found}


def test_formats_import_neither_the_command_line_nor_the_server(graph):
    wrong = {name: sorted(imported for imported in imports if any(is_in(imported, top) for top in TOP))
             for name, imports in graph.items() if is_in(name, "multiseq.formats")}
    assert not {name: found for name, found in wrong.items() if found}


def test_the_server_and_ray_do_not_import_the_command_line(graph):
    wrong = {name: sorted(imported for imported in imports if is_in(imported, "multiseq.cli"))
             for name, imports in graph.items() if any(is_in(name, top) for top in TOP if top != "multiseq.cli")}
    assert not {name: found for name, found in wrong.items() if found}


def test_the_benchmarks_do_not_import_the_command_line():
    """bench/ drives the library and the installed command, never the CLI's insides."""
    wrong = {path.name: sorted(imported for imported in _bench_imports(path) if is_in(imported, "multiseq.cli"))
             for path in (ROOT / "bench").glob("*.py")}
    assert not {name: found for name, found in wrong.items() if found}


def _bench_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return found


# The engine's folders, bottom up: each imports only from those below it (and the plain types
# every layer shares: config, request, errors).
ENGINE_LAYERS = ("multiseq.llama", "multiseq.kv", "multiseq.sampling", "multiseq.tools", "multiseq.loop")


def test_the_engines_folders_import_only_downward(graph):
    def layer_of(module: str) -> int | None:
        return next((index for index, layer in enumerate(ENGINE_LAYERS) if is_in(module, layer)), None)

    wrong = {}
    for name, imports in graph.items():
        level = layer_of(name)
        if level is None:
            continue
        above = sorted(imported for imported in imports
                       if layer_of(imported) is not None and layer_of(imported) > level)
        if above:
            wrong[name] = above
    assert not wrong, f"engine modules import a folder above their own: {wrong}"


def test_models_import_nothing_of_multiseq_but_models(graph):
    wrong = {name: sorted(imported for imported in imports
                          if is_in(imported, "multiseq") and not is_in(imported, "multiseq.models"))
             for name, imports in graph.items() if is_in(name, "multiseq.models")}
    assert not {name: found for name, found in wrong.items() if found}


def test_only_the_backend_imports_llama_cpp(graph):
    importers = sorted(name for name, imports in graph.items() if any(is_in(imported, "llama_cpp") for imported in imports))
    assert importers == ["multiseq.llama.backend"]


def test_neither_engine_nor_formats_import_a_terminal_or_http_library(graph):
    wrong = {name: sorted(imported for imported in imports if imported.split(".")[0] in UI_AND_HTTP)
             for name, imports in graph.items() if is_engine(name) or is_in(name, "multiseq.formats")}
    assert not {name: found for name, found in wrong.items() if found}


def test_no_import_cycle(graph):
    cycles = [component for component in strongly_connected(graph) if len(component) > 1]
    assert not cycles, f"import cycles: {cycles}"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components over our own modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in sorted(edge for edge in graph[node] if edge in graph and not is_parent(edge, node)):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def is_parent(package: str, module: str) -> bool:
    """A package's __init__ that imports its own submodules is no cycle with them: a submodule
    importing a sibling by `from . import x` names its parent package, not a circle."""
    return module.startswith(package + ".")


def test_the_check_sees_a_cycle_and_an_upward_import():
    """The checks themselves: a made-up graph with a cycle and an engine module importing cli."""
    made_up = {"multiseq.a": {"multiseq.b"}, "multiseq.b": {"multiseq.a", "multiseq.cli.main"},
               "multiseq.cli.main": set()}
    assert [component for component in strongly_connected(made_up) if len(component) > 1] == \
        [["multiseq.a", "multiseq.b"]]
    with pytest.raises(AssertionError):
        test_the_engine_imports_nothing_above_it(made_up)
