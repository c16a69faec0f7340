"""Every example in README.md, docs/*.md and bench/README.md runs as written.

- Shell blocks (sh, bash, shell, console): each `multiseq ...` command is parsed by the real
  click command (`multiseq.cli.main.cli`), so an option or a subcommand that does not exist, or
  a value the option refuses, fails here; only the files a command names may be missing. A
  `bench/*.py` script must exist and declare every option it is given; a pytest command may only
  use the plugin's `--multiseq-*` options; a repository path a command names must exist.
- Python blocks compile, and their imports from multiseq exist; with a real model (marked
  `model`) each one runs in a subprocess, in a folder holding the files the docs define.
- Prompt files the docs show are valid input of their format, line by line, read by the real
  reader.
- The options table of docs/cli.md lists exactly batch-run's options.
- Relative links between the docs, and their anchors, resolve.

HTML comments right before a code block say what it is (an unknown one fails the test):

    <!-- not-run: REASON -->        a python fragment: compiled, not run
    <!-- run: sh -->                 a shell block also executed (model test), in that folder
    <!-- run: pytest -->             a python block that is a test file: run with pytest
    <!-- run: serve -->              a `multiseq serve` command: started (on a free port instead of
                                     the one it names) for the client blocks after it
    <!-- run: client -->             a python block run against the server started above it (the
                                     address it names pointed at that server)
    <!-- file: NAME -->              the block is the file NAME (valid input, given to runs)
    <!-- input: jsonl|text|openai --> the block is valid input of that format
"""

from __future__ import annotations

import ast
import copy
import importlib
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from helpers import TEST_SEED, TEST_THREADS
from multiseq.formats.reader import PromptFormat, detect_format, read_prompts
from multiseq import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
MARKER_KINDS = {"not-run", "run", "file", "input"}
REPOSITORY_FOLDERS = {"bench", "cli", "docs", "models", "runner", "tests"}
RUN_TIMEOUT_S = 600

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*([\w-]+)\s*(?::\s*(.*?))?\s*-->$")


# --- the docs as code blocks -------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the line of its opening fence, 1-based
    language: str
    marker: tuple[str, str] | None  # (kind, value) of the HTML comment right before it
    text: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def marker_kind(self) -> str | None:
        return self.marker[0] if self.marker else None

    @property
    def marker_value(self) -> str:
        return self.marker[1] if self.marker else ""


def read_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file, each with the marker comment before it."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    previous = ""  # the last non-blank line outside a block
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            if lines[index].strip():
                previous = lines[index].strip()
            index += 1
            continue
        fence, language = opening.groups()
        start = index
        body = []
        index += 1
        while index < len(lines) and not lines[index].startswith(fence):
            body.append(lines[index])
            index += 1
        index += 1
        marker = _MARKER.match(previous)
        blocks.append(Block(path, start + 1, language.lower(),
                            (marker.group(1), marker.group(2) or "") if marker else None, "\n".join(body) + "\n"))
        previous = ""
    return blocks


ALL_BLOCKS = [block for path in DOC_FILES for block in read_blocks(path)]
SHELL_BLOCKS = [block for block in ALL_BLOCKS if block.language in SHELL_LANGUAGES]
PYTHON_BLOCKS = [block for block in ALL_BLOCKS if block.language == "python"]
RUNNABLE = [block for block in PYTHON_BLOCKS if block.marker_kind != "not-run" and block.marker != ("run", "client")]
# Examples that start Ray (`ray.init()`) run as drivers of the tests' one local cluster (conftest).
RAY_PYTHON = [block for block in RUNNABLE if "import ray" in block.text]
RUNNABLE_PYTHON = [block for block in RUNNABLE if block not in RAY_PYTHON]
INPUT_BLOCKS = [block for block in ALL_BLOCKS if block.marker_kind in ("file", "input")]
RUNNABLE_SHELL = [block for block in SHELL_BLOCKS if block.marker == ("run", "sh")]
SERVE_BLOCKS = [block for block in SHELL_BLOCKS if block.marker == ("run", "serve")]


def ids(blocks: list[Block]) -> list[str]:
    return [block.name for block in blocks]


# --- shell commands --------------------------------------------------------------------------

def _without_comment(line: str) -> str:
    """The line up to a shell comment: a # that starts a word, outside quotes."""
    quote = None
    for position, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position]
    return line


def command_lines(block: Block) -> list[str]:
    """The block's commands, continuation lines joined (console blocks: the `$ ` lines)."""
    logical, pending = [], ""
    for raw in block.text.splitlines():
        line = raw
        if block.language == "console":
            if not (line.startswith("$ ") or pending):
                continue
            line = line[2:] if line.startswith("$ ") and not pending else line
        line = _without_comment(line).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        if (pending + line).strip():
            logical.append(pending + line)
        pending = ""
    return logical


def simple_commands(line: str) -> list[list[str]]:
    """A command line cut at &&, ||, ;, | and &, without redirections."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands, current = [], []
    tokens = list(lexer)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token in ("&&", "||", ";", "|", "&"):
            commands.append(current)
            current = []
        elif token in (">", ">>", "<", ">&", "&>", "2>"):
            if current and current[-1].isdigit():
                current.pop()  # 2> file
            index += 1  # the file
        else:
            current.append(token)
        index += 1
    commands.append(current)
    return [command for command in commands if command]


def _lenient(command: click.Command) -> click.Command:
    """The command with its path arguments allowed not to exist (the docs name files the
    reader has, not the repository); every other rule of the parser stays."""
    lenient = copy.copy(command)
    params = []
    for param in command.params:
        if isinstance(param.type, click.Path) and param.type.exists:
            param = copy.copy(param)
            param.type = copy.copy(param.type)
            param.type.exists = False
        params.append(param)
    lenient.params = params
    return lenient


def parse_multiseq(args: list[str]) -> click.Context | None:
    """Parse `multiseq ARGS` with the real click commands, subcommand by subcommand; raises
    click.UsageError (a missing or unknown option or subcommand, a bad value)."""
    from multiseq.cli.main import cli

    command: click.Command = cli
    name, parent = "multiseq", None
    while True:
        try:
            context = _lenient(command).make_context(name, list(args), parent=parent)
        except click.exceptions.Exit:  # --help, --version: accepted
            return None
        if not isinstance(command, click.Group):
            return context
        rest = [*getattr(context, "_protected_args", []), *context.args]
        name, command, args = command.resolve_command(context, rest)
        parent = context


def _declared_options(path: Path, method: str) -> set[str]:
    """The option strings a script declares with parser.add_argument / group.addoption."""
    options = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
            options |= {arg.value for arg in node.args
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-")}
    return options


def _option_names(args: list[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("--")]


def _without_assignments(argv: list[str]) -> list[str]:
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        argv = argv[1:]  # VAR=value before the command
    return argv


def command_kind(argv: list[str]) -> str | None:
    """What a simple command is, for the checks: multiseq, pytest, script, or None."""
    argv = _without_assignments(argv)
    if not argv:
        return None
    program, args = Path(argv[0]).name, argv[1:]
    is_python = program.startswith("python")
    if program == "multiseq" or (is_python and args[:1] == ["-m"] and args[1:2] and args[1].startswith("multiseq")):
        return "multiseq"
    if program == "pytest" or (is_python and args[:2] == ["-m", "pytest"]):
        return "pytest"
    if is_python and args and args[0].endswith(".py"):
        return "script"
    return None


def check_command(argv: list[str]) -> None:
    """Check one simple command: its repository paths exist, and its parser accepts it."""
    argv = _without_assignments(argv)
    for arg in argv:
        if "/" in arg and arg.split("/", 1)[0] in REPOSITORY_FOLDERS and not arg.startswith("-"):
            assert (ROOT / arg).exists(), f"{arg} does not exist in the repository"
    kind = command_kind(argv)
    args = argv[1:]
    if kind == "multiseq":
        parse_multiseq(args if Path(argv[0]).name == "multiseq" else args[2:])
    elif kind == "pytest":
        plugin = _declared_options(ROOT / "runner" / "pytest_plugin.py", "addoption")
        for option in _option_names(args):
            if option.startswith("--multiseq"):
                assert option in plugin, f"the pytest plugin has no option {option}"
    elif kind == "script":
        script = ROOT / args[0]
        assert script.is_file(), f"no script {args[0]}"
        declared = _declared_options(script, "add_argument")
        for option in _option_names(args[1:]):
            assert option in declared, f"{args[0]} has no option {option}"


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=ids(SHELL_BLOCKS))
def test_shell_commands_are_accepted_by_their_parsers(block):
    for line in command_lines(block):
        for argv in simple_commands(line):
            try:
                check_command(argv)
            except click.UsageError as error:
                pytest.fail(f"{block.name}: `{' '.join(argv)}`: {error.format_message()}")
            except AssertionError as error:
                pytest.fail(f"{block.name}: `{' '.join(argv)}`: {error}")


def test_the_docs_show_multiseq_commands_and_the_check_sees_them():
    checked = [command_kind(argv) for block in SHELL_BLOCKS for line in command_lines(block)
               for argv in simple_commands(line)]
    assert checked.count("multiseq") >= 10
    assert checked.count("script") >= 5
    readme = [line for block in SHELL_BLOCKS if block.path.name == "README.md" and block.path.parent == ROOT
              for line in command_lines(block)]
    assert any("multiseq batch-run cli/examples/prompts.jsonl" in line for line in readme), "the README's two commands"


@pytest.mark.parametrize("args", [
    ["batch-run", "prompts.jsonl", "--no-such-option"],
    ["batch-run", "prompts.jsonl", "-np", "many"],
    ["batch-run", "prompts.jsonl", "--order", "random"],
    ["batch-runs", "prompts.jsonl"],
    ["models", "delete", "smollm2-135m"],
    ["batch-run"],
])
def test_the_command_check_refuses_what_multiseq_refuses(args):
    with pytest.raises(click.UsageError):
        parse_multiseq(args)


def test_the_command_check_accepts_missing_files_and_help():
    parse_multiseq(["batch-run", "no/such/file.jsonl", "-o", "out.jsonl", "--ray", "--workers", "2"])
    parse_multiseq(["batch-run", "--help"])
    parse_multiseq(["--version"])


# --- markers, python blocks, input ---------------------------------------------------------

@pytest.mark.parametrize("block", [block for block in ALL_BLOCKS if block.marker], ids=ids(
    [block for block in ALL_BLOCKS if block.marker]))
def test_markers_are_known(block):
    kind, value = block.marker
    assert kind in MARKER_KINDS, f"{block.name}: unknown marker {kind!r}"
    if kind == "run":
        assert (value, block.language in SHELL_LANGUAGES) in (("sh", True), ("pytest", False), ("serve", True),
                                                               ("client", False)), block.name
    if kind == "input":
        assert value in {fmt.value for fmt in PromptFormat}, f"{block.name}: unknown format {value!r}"
    if kind == "not-run":
        assert block.language == "python" and value, f"{block.name}: not-run is for python fragments, with a reason"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=ids(PYTHON_BLOCKS))
def test_python_blocks_compile_and_import_what_exists(block):
    tree = ast.parse(block.text, filename=block.name)
    compile(tree, block.name, "exec")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "multiseq":
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "multiseq":
                    importlib.import_module(alias.name)


def defined_files() -> dict[str, str]:
    """The files the docs define (`<!-- file: NAME -->`), by name; a name is defined once."""
    files: dict[str, str] = {}
    for block in ALL_BLOCKS:
        if block.marker_kind == "file":
            assert block.marker_value not in files, f"{block.name}: {block.marker_value} is defined twice"
            files[block.marker_value] = block.text
    return files


@pytest.mark.parametrize("block", INPUT_BLOCKS, ids=ids(INPUT_BLOCKS))
def test_prompt_files_shown_are_valid_input(block, tmp_path):
    path = tmp_path / (block.marker_value if block.marker_kind == "file" else "input.jsonl")
    path.write_text(block.text, encoding="utf-8")
    prompt_format = PromptFormat(block.marker_value) if block.marker_kind == "input" else detect_format(path)
    items = list(read_prompts(path, prompt_format, SamplingParams()))
    assert len(items) == sum(1 for line in block.text.splitlines() if line.strip())
    for item in items:
        assert item.is_valid, f"{block.name}: {item.error}"


def test_the_options_table_lists_every_batch_run_option():
    from multiseq.cli.main import cli

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            first_cell = row.split("|")[1]
            documented |= set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", first_cell))
    commands = [cli.commands["batch-run"], cli]
    actual = {name for command in commands for param in command.params if isinstance(param, click.Option)
              for name in [*param.opts, *param.secondary_opts]}
    actual.discard("--help")
    assert documented == actual, f"undocumented: {sorted(actual - documented)}; no such option: {sorted(documented - actual)}"


# --- links -----------------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks, inline code removed."""
    lines, fence = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            continue
        if fence is not None:
            if line.startswith(fence):
                fence = None
            continue
        lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lower case, without punctuation, spaces as -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for line in _prose(path):
        heading = _HEADING.match(line)
        if heading:
            slug = github_slug(heading.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@pytest.mark.parametrize("path", DOC_FILES, ids=[str(path.relative_to(ROOT)) for path in DOC_FILES])
def test_links_and_anchors_resolve(path):
    problems = []
    prose = re.sub(r"`[^`\n]*`", "", "\n".join(_prose(path)))  # a link's text may wrap
    for target in _LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if ROOT not in linked.parents and linked != ROOT:
            problems.append(f"{target}: outside the repository")
        elif not linked.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            problems.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not problems, f"{path.relative_to(ROOT)}: " + "; ".join(problems)


def test_every_doc_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for path in DOC_FILES[1:]:
        assert f"]({path.relative_to(ROOT).as_posix()})" in readme, f"the README does not link {path.relative_to(ROOT)}"


# --- running the examples (a real model) -----------------------------------------------------

@pytest.fixture
def example_folder(tmp_path):
    """A folder with the files the docs define, the default registry model fetched."""
    from multiseq import models

    models.resolve(models.DEFAULT_MODEL)
    for name, text in defined_files().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def _run(command: list[str], folder: Path, **environment: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               **environment)
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _fail_with_output(block: Block, result: subprocess.CompletedProcess) -> None:
    pytest.fail(f"{block.name} exited with {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
                f"\n--- stderr\n{result.stderr[-4000:]}")


@pytest.mark.model
@pytest.mark.parametrize("block", RUNNABLE_PYTHON, ids=ids(RUNNABLE_PYTHON))
def test_python_examples_run(block, example_folder):
    _run_python_example(block, example_folder)


@pytest.mark.model
@pytest.mark.parametrize("block", RAY_PYTHON, ids=ids(RAY_PYTHON))
def test_ray_examples_run(block, example_folder, ray_cluster):
    """`ray.init()` as written connects to the cluster RAY_ADDRESS names, as on a machine
    where one runs."""
    _run_python_example(block, example_folder, RAY_ADDRESS=ray_cluster)


def _run_python_example(block: Block, folder: Path, **environment: str) -> None:
    if block.marker == ("run", "pytest"):
        (folder / "test_example.py").write_text(block.text, encoding="utf-8")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_example.py"]
    else:
        (folder / "example.py").write_text(block.text, encoding="utf-8")
        command = [sys.executable, "example.py"]
    result = _run(command, folder, **environment)
    if result.returncode != 0:
        _fail_with_output(block, result)


@pytest.mark.model
@pytest.mark.parametrize("block", RUNNABLE_SHELL, ids=ids(RUNNABLE_SHELL))
def test_shell_examples_run(block, example_folder):
    result = _run(["bash", "-euo", "pipefail", "-c", block.text], example_folder)
    if result.returncode != 0:
        _fail_with_output(block, result)


def client_blocks_of(serve: Block) -> list[Block]:
    """The client blocks after a serve block, up to the next one."""
    later = [block for block in ALL_BLOCKS if block.path == serve.path and block.line > serve.line]
    clients = []
    for block in later:
        if block.marker == ("run", "serve"):
            break
        if block.marker == ("run", "client"):
            clients.append(block)
    return clients


def _option_value(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


@pytest.mark.model
@pytest.mark.parametrize("block", SERVE_BLOCKS, ids=ids(SERVE_BLOCKS))
def test_server_examples_answer_their_clients(block, example_folder):
    """The serve command as written, but on a free port, and with this run's seed and threads
    where it names none (a sampled answer is then the same in each run of a seed); each client
    block after it, as written, but pointed at that port; each must succeed and print something."""
    [argv] = [simple for line in command_lines(block) for simple in simple_commands(line)]
    written = f"http://{_option_value(argv, '--host')}:{_option_value(argv, '--port')}"
    argv[argv.index("--port") + 1] = "0"
    if "--seed" not in argv:
        argv += ["--seed", str(TEST_SEED)]
    if "-t" not in argv and "--threads" not in argv:
        argv += ["-t", str(TEST_THREADS)]
    clients = client_blocks_of(block)
    assert clients, f"{block.name}: a serve example with no client after it"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    server = subprocess.Popen([*argv, "--no-dashboard"], cwd=example_folder, env=env, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any("ready:" in line for line in lines):
            line = server.stderr.readline()
            assert line, f"{block.name}: the server stopped before it was ready:\n{''.join(lines)}"
            lines.append(line)
        actual = re.search(r"(http://\S+?)/v1", next(line for line in lines if "ready:" in line)).group(1)
        for client in clients:
            assert written in client.text, f"{client.name} does not talk to {written}, which the command serves"
            (example_folder / "client.py").write_text(client.text.replace(written, actual), encoding="utf-8")
            result = _run([sys.executable, "client.py"], example_folder)
            if result.returncode != 0 or not result.stdout.strip():
                _fail_with_output(client, result)
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    assert server.returncode == 0
