"""The commands the documentation shows are commands that work.

Every ``scoperouter ...`` line of a code block in the README, bench/README.md and the manual
(``docs/``) is parsed by the real parser (a command, option or argument that does not exist
fails); every ``--option`` of an inline ``scoperouter ...`` in their prose is an option of that
command; every ``python -m bench...`` / ``python -m tests...`` of a code block is parsed by that
module's own parser (the module run up to its argument parsing, which then stops it), and each
``--option`` and sub-command of an inline one in prose is that parser's;
every ``--help`` of the router's commands ends with an example, which parses too; and the
``scoperouter route`` examples marked ``<!-- docs-test: route -->`` (the sample config) or
``<!-- docs-test: lab-route -->`` (the lab's federation config, generated here as ``lab up``
generates it, without a lab) print exactly what the page says. And every file, folder or module
the pages name (``scoperouter/proxy/combined.py``, ``scoperouter.client.scope_auth``) exists:
the design and the manual cannot go on naming what is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scoperouter.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
MANUAL = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [*MANUAL, ROOT / "bench" / "README.md"]  # the commands: bench/README.md's too
LAB_FEDERATION = "~/.local/share/scoperouter/lab/federation.yaml"
# the router's, not lab/broker
OWN = ("serve", "route", "check-config", "import-catalog", "pki", "status")
MODULES = ("bench", "tests.")  # `python -m` modules of this repository (not pytest's)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ------------------------------------------------------------------------- reading the pages


def code_lines(text: str) -> Iterator[str]:
    """The lines of a page's code: fenced blocks (also inside admonitions), and 4-space
    indented blocks (the README's); continuation lines (``\\``) joined into one."""
    fence: str | None = None
    previous_blank = True
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if fence is None and stripped.startswith("```"):
            fence = raw[: raw.index("`")]
            continue
        if fence is not None and stripped == "```" and raw.startswith(fence):
            fence = None
            continue
        indented = fence is None and raw.startswith("    ") and previous_blank
        previous_blank = not stripped or (indented and previous_blank)
        if fence is None and not indented:
            continue
        line = pending + stripped
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        yield line


def commands(line: str, program: str) -> Iterator[list[str]]:
    """The argument lists of every call of `program` on a shell line: after ``$ ``, a
    ``.venv/bin/`` or an environment assignment, and inside ``$(...)``; the line's comment and
    whatever follows ``&&``, ``||``, ``;`` or ``|`` is another command."""
    inner = re.findall(rf"\$\((?:\.venv/bin/)?{program} ([^)]*)\)", line)
    for text in inner:
        yield shlex.split(text)
    line = re.sub(r"\$\([^)]*\)", "SUBST", line.removeprefix("$ "))
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote: not a shell line
        return
    command: list[str] = []
    for word in [*words, ";"]:
        if word in ("&&", "||", ";", "|"):
            while command and re.fullmatch(r"[A-Z_]+=.*", command[0]):
                command.pop(0)
            if command and command[0] in (program, f".venv/bin/{program}"):
                yield command[1:]
            command = []
        else:
            command.append(word)


def documented(program: str) -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for line in code_lines(page.read_text()):
            found += [(_name(page), argv) for argv in commands(line, program)]
    return found


# --------------------------------------------------------------------- the real parsers


def parse(argv: list[str]) -> str | None:
    """None when ``scoperouter ARGV`` parses, else argparse's complaint."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code != 0:  # --help exits 0
            return err.getvalue().strip().splitlines()[-1]
    return None


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def every_parser(
    parser: argparse.ArgumentParser | None = None,
) -> Iterator[argparse.ArgumentParser]:
    parser = parser or build_parser()
    yield parser
    for child in _children(parser).values():
        yield from every_parser(child)


def test_the_pages_show_scoperouter_commands() -> None:
    """The extraction finds what the pages show (a test that found nothing would pass)."""
    argvs = [argv for _, argv in documented("scoperouter")]
    assert ["lab", "up"] in argvs
    assert any(argv[:1] == ["route"] and "--scope" in argv for argv in argvs)
    assert any(argv[:2] == ["pki", "issue"] for argv in argvs)
    assert any(argv[:2] == ["broker", "rotate-key"] for argv in argvs)  # inside $(...)
    assert parse(["serve", "--no-such-option"]) is not None


def test_every_scoperouter_command_in_a_code_block_parses() -> None:
    wrong = [
        f"{page}: scoperouter {shlex.join(argv)}: {problem}"
        for page, argv in documented("scoperouter")
        if (problem := parse(argv)) is not None
    ]
    assert not wrong, "\n".join(wrong)


INLINE = re.compile(r"`(?:\.venv/bin/)?scoperouter ([^`]+)`")


def test_every_option_of_an_inline_scoperouter_command_exists() -> None:
    """In prose (`scoperouter lab up --no-router`, table cells with [optional] parts): each
    word names a command until the options start, and each --option is that command's."""
    wrong = []
    seen = 0
    for page in PAGES:
        for text in INLINE.findall(page.read_text()):
            seen += 1
            parser = build_parser()
            for word in text.replace("\\|", "|").split():
                if word.startswith(("-", "[")) or word == "..." or not _children(parser):
                    break
                choices = word.split("|")
                if not all(choice in _children(parser) for choice in choices):
                    wrong.append(f"{_name(page)}: `scoperouter {text}`: no command {word!r}")
                    break
                if len(choices) > 1:
                    break
                parser = _children(parser)[word]
            options = {o for action in parser._actions for o in action.option_strings}
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text):
                if option not in options:
                    wrong.append(f"{_name(page)}: `scoperouter {text}`: no option {option}")
    assert seen > 20
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------- the modules run with -m


# Run in a child: each module runs as `python -m` runs it until it builds its parser and asks it
# to parse; that call raises instead (nothing of the bench starts), and the argv the page shows
# is parsed by that parser here (full: code blocks), or its options listed (inline: prose).
PARSE_ONLY = r"""
import argparse, contextlib, io, json, runpy, sys

class Caught(BaseException):
    def __init__(self, parser):
        self.parser = parser

def caught(self, *args, **kwargs):
    raise Caught(self)

full, known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
argparse.ArgumentParser.parse_args = caught
argparse.ArgumentParser.parse_known_args = caught

def options(parser):
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.add(name)
                found |= options(child)
    return found

out = []
for module, argv, mode in json.load(sys.stdin):
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        out.append("ran without parsing its arguments")
        continue
    except Caught as got:
        parser = got.parser
    argparse.ArgumentParser.parse_known_args = known
    if mode == "inline":
        out.append(sorted(options(parser)))
    else:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                full(parser, argv)
            out.append(None)
        except SystemExit as exc:
            said = err.getvalue().strip().splitlines() or ["?"]
            out.append(None if exc.code == 0 else said[-1])
    argparse.ArgumentParser.parse_known_args = caught
print(json.dumps(out))
"""

PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*|<[^>]*>")
INLINE_MODULE = re.compile(r"`(?:\.venv/bin/)?python3? (?:-O )?-m ((?:bench|tests)[^`]*)`")


def module_commands() -> list[tuple[str, str, list[str], str]]:
    """(page, module, argv, "code" or "inline") of every `python -m` of this repository's
    modules the pages show: in code blocks and in prose."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for line in code_lines(text):
            for argv in commands(line, "python"):  # and .venv/bin/python
                words = [w for w in argv if w != "-O"]
                if words[:1] == ["-m"] and len(words) > 1 and words[1].startswith(MODULES):
                    # a placeholder (`--seed S`): its options are checked, as in prose
                    mode = "inline" if any(PLACEHOLDER.fullmatch(w) for w in words) else "code"
                    found.append((_name(page), words[1], words[2:], mode))
        for inline in INLINE_MODULE.findall(text):
            words = inline.split()
            found.append((_name(page), words[0], words[1:], "inline"))
    return found


def parse_modules(calls: list[tuple[str, list[str], str]]) -> list[str | list[str] | None]:
    done = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results: list[str | list[str] | None] = json.loads(done.stdout.splitlines()[-1])
    return results


def test_every_documented_bench_or_tests_command_parses() -> None:
    found = module_commands()
    calls = [(module, argv, mode) for _, module, argv, mode in found]
    wrong = []
    for (page, module, argv, _), result in zip(found, parse_modules(calls), strict=True):
        shown = f"{page}: python -m {shlex.join([module, *argv])}"
        if isinstance(result, str):
            wrong.append(f"{shown}: {result}")
        elif isinstance(result, list):  # inline: its options and sub-commands exist
            for word in argv:
                if word.startswith(("[", "<")) or word == "...":
                    break
                name = word.split("=", 1)[0]
                first_command = word == argv[0] and not re.match(r"-|[A-Z_]+$|<", name)
                if (name.startswith("--") or first_command) and name not in result:
                    wrong.append(f"{shown}: no option or command {name}")
    assert {"bench", "bench.wan", "bench.soak", "tests.peer", "tests.fuzz"} <= {
        module for _, module, _, _ in found
    }
    assert {mode for *_, mode in found} == {"code", "inline"}
    assert not wrong, "\n".join(wrong)


def test_the_module_parser_check_finds_what_does_not_parse() -> None:
    """The check above can fail: a removed option, a bad value, a module that never parses."""
    results = parse_modules(
        [
            ("bench.wan", ["--data-path", "lean"], "code"),
            ("bench.kills", ["--kills", "ten"], "code"),
            ("bench.soak", ["--smoke"], "code"),
            ("bench.wan", [], "inline"),
        ]
    )
    assert isinstance(results[0], str) and results[0].startswith("python -m bench.wan: error:")
    assert isinstance(results[1], str) and "invalid int value: 'ten'" in results[1]
    assert results[2] is None
    assert isinstance(results[3], list) and "--between" in results[3] and "load" in results[3]


def test_ci_runs_the_readmes_install_and_test_commands_as_written() -> None:
    """.ci/run's first command is the README's quick-start install, verbatim, and it runs the
    README's test command verbatim: CI green means a new user's first run is green too."""
    readme = [line.strip() for line in code_lines((ROOT / "README.md").read_text())]
    install = [line for line in readme if line.startswith("python3 -m venv")]
    assert install == ["python3 -m venv .venv && .venv/bin/pip install -e '.[test]' -e ./lab"]
    assert ".venv/bin/python -m pytest" in readme
    script = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in script if line and not line.startswith("#")]
    first_pip = next(i for i, line in enumerate(commands) if "pip install" in line)
    assert commands[first_pip] == install[0]
    assert ".venv/bin/python -m pytest" in commands


# The `openstack` commands the pages show: each is a command of the `openstack` of the venv the
# quick start makes (python-openstackclient with the plugins the client extra brings: heat's
# `orchestration`, placement's `resource provider`), checked with `--help` (no cloud needed).
INLINE_OPENSTACK = re.compile(r"`(?:\.venv/bin/)?openstack ([^`]+)`")
STOP = re.compile(r"^-|[$<>|.┊]|^[A-Z_]+$")  # an option, a placeholder, a value


def openstack_commands() -> dict[tuple[str, ...], str]:
    """The command words (and positional values) of every `openstack ...` of the pages ->
    the first page that shows it; the global --os-* options and their values left out."""
    found: dict[tuple[str, ...], str] = {}
    for page in PAGES:
        text = page.read_text()
        argvs = [argv for line in code_lines(text) for argv in commands(line, "openstack")]
        argvs += [shlex.split(inline) for inline in INLINE_OPENSTACK.findall(text)]
        for argv in argvs:
            while len(argv) > 1 and argv[0].startswith("--os-"):
                argv = argv[2:]
            words = []
            for word in argv:
                if STOP.search(word):
                    break
                words.append(word)
            if words:
                found.setdefault(tuple(words), _name(page))
    return found


def test_every_openstack_command_of_the_pages_is_in_the_venvs_cli() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    done = subprocess.run(  # every command of the CLI and its plugins; no cloud needed
        [str(Path(sys.executable).parent / "openstack"), "command", "list", "-f", "json"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    known = {tuple(c.split()) for group in json.loads(done.stdout) for c in group["Commands"]}
    found = openstack_commands()
    assert ("orchestration", "template", "validate") in found  # heat's plugin
    assert ("resource", "provider", "list") in found  # placement's
    assert ("image", "list") in found and len(found) > 8
    wrong = [
        f"{page}: openstack {' '.join(words)}: not a command of {sys.executable}'s openstack"
        for words, page in sorted(found.items())
        if not any(words[: len(command)] == command for command in known)
    ]
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------------- --help examples


def help_examples(text: str) -> list[list[str]]:
    """The ``scoperouter ...`` lines of a --help text (indented, continued with ``\\``)."""
    found = []
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if raw.startswith("  ") and line.startswith("scoperouter "):
            found.append(shlex.split(line, comments=True)[1:])
    return found


def test_every_help_of_the_routers_commands_ends_with_an_example_that_parses() -> None:
    checked = []
    for parser in every_parser():
        words = parser.prog.split()[1:]
        if words and words[0] not in OWN:
            continue  # lab and broker: their packages' own
        text = parser.format_help()
        assert re.search(r"^examples?\b", text, re.M), f"{parser.prog} --help has no example"
        examples = help_examples(text)
        assert any(argv[: len(words)] == words for argv in examples), parser.prog
        for argv in examples:
            assert parse(argv) is None, (parser.prog, argv, parse(argv))
        checked.append(parser.prog)
    assert set(COMMANDS) - {"lab", "broker"} <= {p.split()[1] for p in checked[1:]}
    assert "scoperouter pki issue" in checked


# --------------------------------------------------------------------- scoperouter route


def route_examples(marker: str) -> list[tuple[str, list[str], str]]:
    """(page, argv, the output the page shows) of each console block after `marker`."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(rf"{re.escape(marker)}\n```console\n(.*?)\n```", text, re.S):
            lines = block.splitlines()
            command = lines.pop(0)
            while command.endswith("\\"):
                command = command[:-1] + lines.pop(0)
            argv = shlex.split(command.removeprefix("$ "))
            assert argv[0] in ("scoperouter", ".venv/bin/scoperouter"), command
            found.append((_name(page), argv[1:], "\n".join(lines)))
    return found


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    main(argv)
    return capsys.readouterr().out.rstrip("\n")


def test_the_route_examples_print_what_the_pages_say(capsys: pytest.CaptureFixture[str]) -> None:
    examples = route_examples("<!-- docs-test: route -->")
    assert len(examples) >= 3
    for page, argv, shown in examples:
        assert argv[argv.index("--config") + 1] == "config/federation.yaml", page
        argv[argv.index("--config") + 1] = str(ROOT / "config" / "federation.yaml")
        assert run(argv, capsys) == shown, f"{page}: scoperouter {shlex.join(argv)}"


def lab_federation(directory: Path) -> Path:
    """The federation config `scoperouter lab up` writes for its default two clouds and
    services, made as the lab makes it (its catalog rows, its import, its CA and peer links),
    with no lab."""
    from scoperouter_lab import files, pki
    from scoperouter_lab.layout import DEFAULT_SERVICES, CloudSpec, service_types

    rows = {}
    for index in (1, 2):
        cloud = CloudSpec(index)
        rows[cloud] = [
            {
                "service_type": stype,
                "interface": "public",
                "url": cloud.endpoint_url(stype, routed=True),
                "region": cloud.region,
            }
            for stype in service_types(DEFAULT_SERVICES)
        ]
    config = pki.peer_links(files.federation_config(rows), directory / "pki")
    path = directory / "federation.yaml"
    path.write_text(files.dump(config, "# the lab's, made by tests/unit/test_docs_commands.py\n"))
    return path


def test_the_lab_route_example_prints_what_the_page_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lab's routers reach each other over TLS peer links (:9443): the getting-started
    example shows that decision, as `scoperouter route` prints it for the lab's config."""
    examples = route_examples("<!-- docs-test: lab-route -->")
    assert examples
    config = lab_federation(tmp_path)
    for page, argv, shown in examples:
        assert argv[argv.index("--config") + 1] == LAB_FEDERATION, page
        argv[argv.index("--config") + 1] = str(config)
        assert run(argv, capsys) == shown, f"{page}: scoperouter {shlex.join(argv)}"
        assert "https://127.0.0.3:9443" in shown


# ------------------------------------------------------------ files and modules the pages name

PATH = re.compile(r"`((?:scoperouter|tests|bench|lab|playbooks|deploy|config|docs|\.ci)/[^`\s]*)`")
MODULE = re.compile(r"(?<!logger )`((?:scoperouter|scoperouter_lab)(?:\.[A-Za-z_]+)+)`")


def _expand(path: str) -> list[str]:
    """``scoperouter/{scope,catalog}.py`` -> both paths."""
    found = re.search(r"\{([^}]*)\}", path)
    if found is None:
        return [path]
    return [
        expanded
        for alternative in found.group(1).split(",")
        for expanded in _expand(path[: found.start()] + alternative + path[found.end() :])
    ]


def _resolves(dotted: str) -> bool:
    """A module, or an attribute of one (a function, a class)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            thing: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                thing = getattr(thing, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_file_and_module_the_pages_name_exists() -> None:
    """The manual, the README and the design (not the changelog: history names what was; nor
    bench/README.md, which names other projects' files)."""
    wrong = []
    named = 0
    for page in MANUAL:
        text = page.read_text()
        for path in PATH.findall(text):
            path = re.sub(r"[:#].*$", "", path.rstrip(".,;)"))
            for each in _expand(path):
                named += 1
                if "<" not in each and not list(ROOT.glob(each)):
                    wrong.append(f"{_name(page)}: {each} does not exist")
        for dotted in MODULE.findall(text):
            named += 1
            if not _resolves(dotted):
                wrong.append(f"{_name(page)}: {dotted} is not a module or one's attribute")
    assert named > 50
    assert not wrong, "\n".join(wrong)
