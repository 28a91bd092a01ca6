"""The router's three layers stay apart (docs/design.md, "Layers"):

* ``scoperouter.router`` (the logic) imports neither the HTTP layer, the processes, mitmproxy
  nor httptools;
* ``scoperouter.http`` (HTTP/1.1) imports neither the router's logic, the processes nor
  mitmproxy;
* only ``scoperouter.proxy.forward`` imports mitmproxy, and a worker whose cloud has no forward
  proxy never imports it (the reverse path runs with mitmproxy blocked);
* no import cycle among them, function-level imports included; no module over 600 lines.

The broker's layers, top to bottom (docs/broker.md): transport (the HTTP app, the CLI) ->
endpoints (one module per OSB endpoint, the OSB models) -> state (worker, runtime, store,
tables, the operator's queries) -> services (the plug-ins) -> contract and helpers (the plug-in
contract, the OpenStack helpers, placement, credentials, identity, config). A module imports
its own layer or lower ones, never a higher one; every broker module has a layer (a new one
must be placed here); no import cycle; no module over 600 lines. The tables and their states
(``Instance``, ``GONE``, ``utcnow``...) are imported from ``scoperouter.broker.tables``, where
they are defined, never through ``scoperouter.broker.store`` (the queries), anywhere in the
package, bench/, tests/ or lab/.

The benches (bench/, their tests included): no import cycle, no module over 600 lines.
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scoperouter"
LAYERS = ("router", "http", "proxy")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code (TYPE_CHECKING ones included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _sources(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


def _touches(names: set[str], prefix: str) -> set[str]:
    return {n for n in names if n == prefix or n.startswith(prefix + ".")}


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("router", ("scoperouter.http", "scoperouter.proxy", "mitmproxy", "httptools")),
        ("http", ("scoperouter.router", "scoperouter.proxy", "mitmproxy")),
    ],
)
def test_a_layer_never_imports_the_ones_above_it(layer: str, forbidden: tuple[str, ...]) -> None:
    wrong = {
        f"{_module(path)} imports {name}"
        for path in _sources(layer)
        for prefix in forbidden
        for name in _touches(_imports(path), prefix)
    }
    assert not wrong, sorted(wrong)


def test_only_the_forward_proxy_imports_mitmproxy() -> None:
    wrong = {
        _module(path)
        for path in PACKAGE.rglob("*.py")
        if _touches(_imports(path), "mitmproxy") and "forward" not in path.parts
    }
    assert not wrong, sorted(wrong)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of a module graph (a package and its own modules do not count)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return [c for c in found if not any(_is_package_link(a, b) for a, b in itertools.pairwise(c))]


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a": {"a.x"}, "a.w": {"a"}}
    assert cycles(graph) == [["a.x", "a.y", "a.z", "a.x"]]


def test_no_import_cycle_in_the_router() -> None:
    edges: dict[str, set[str]] = {}
    for layer in LAYERS:
        for path in _sources(layer):
            edges[_module(path)] = {n for n in _imports(path) if n.startswith("scoperouter.")}
    modules = set(edges)
    edges = {m: {n for n in edges[m] if n in modules and n != m} for m in modules}
    assert not cycles(edges)


def _is_package_link(a: str, b: str) -> bool:
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_no_module_of_the_router_is_over_600_lines() -> None:
    long = {
        _module(path): n
        for layer in LAYERS
        for path in _sources(layer)
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert not long, long


def test_no_module_of_the_bench_is_over_600_lines_nor_in_an_import_cycle() -> None:
    """bench/ is held to the package's standard (STANDARDS.md): no module over 600 lines, its
    tests included, and no import cycle among its modules, function-level imports included."""
    modules = {_module(path): path for path in sorted((ROOT / "bench").rglob("*.py"))}
    long = {m: n for m, path in modules.items() if (n := len(path.read_text().splitlines())) > 600}
    edges = {
        m: {n for n in _imports(path) if n in modules and n != m} for m, path in modules.items()
    }
    assert len(modules) > 40 and not long, long
    assert not cycles(edges)


def test_the_reverse_path_runs_without_mitmproxy(tmp_path: Path) -> None:
    """A router whose cloud has no forward proxy never imports mitmproxy: its worker is made
    (config, pipeline, reverse server) and serves a request with mitmproxy blocked."""
    config = tmp_path / "f.yaml"
    config.write_text(
        textwrap.dedent(
            """
            version: 1
            clouds:
              Solo:
                frontends: [{url: "http://127.0.0.1:{port}"}]
                services:
                  image: {public: {url: "http://127.0.0.1:{port}", backend: "http://127.0.0.1:9"}}
            """
        )
    )
    code = textwrap.dedent(
        f"""
        import asyncio, importlib.abc, socket, sys
        from pathlib import Path

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "mitmproxy":
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
                return None

        sys.meta_path.insert(0, Block())
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        config = Path({str(config)!r})
        config.write_text(config.read_text().replace("{{port}}", str(port)))
        from scoperouter.proxy.worker import Worker

        async def main():
            worker = Worker(str(config), "Solo", Path({str(tmp_path)!r}))
            assert worker.forward is None
            await worker.reverse.start(worker.config.listeners, {{}})
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /v2/images HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
            answer = await reader.read()
            worker.reverse.stop_listening()
            return answer.split(b"\\r\\n")[0]

        print(asyncio.run(main()).decode())
        try:
            import scoperouter.proxy.forward.engine
        except ModuleNotFoundError as exc:
            print("blocked:", exc.name)
        print(sorted(m for m in sys.modules if m.startswith("mitmproxy")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # The backend port is closed: the router answered (502), itself, without mitmproxy.
    assert lines == ["HTTP/1.1 502 Bad Gateway", "blocked: mitmproxy", "[]"], done.stdout


# ------------------------------------------------------------------------------- the broker

BROKER_LAYERS: dict[str, int] = {
    # transport: how requests and commands come in
    "scoperouter.broker.api": 5,
    "scoperouter.broker.middleware": 5,
    "scoperouter.broker.cli": 5,
    "scoperouter.broker.__main__": 5,
    # endpoints: one module per OSB endpoint, and the OSB request/response models
    "scoperouter.broker.osb": 4,
    "scoperouter.broker.models": 4,
    # state: the worker and what it runs on; the database; the operator's queries
    "scoperouter.broker.worker": 3,
    "scoperouter.broker.runtime": 3,
    "scoperouter.broker.store": 3,
    "scoperouter.broker.tables": 3,
    "scoperouter.broker.engine": 3,
    "scoperouter.broker.migrate": 3,
    "scoperouter.broker.migrations": 3,
    "scoperouter.broker.drift": 3,
    "scoperouter.broker.describe": 3,
    "scoperouter.broker.metrics": 3,  # counted by the worker and the middleware; reads the store
    # services: the plug-ins (services.base re-exports the contract under its plug-in name)
    "scoperouter.broker.services": 2,
    # contract and helpers: what the plug-ins are written against and with
    "scoperouter.broker.contract": 1,
    "scoperouter.broker.openstack_helpers": 1,
    "scoperouter.broker.offerings": 1,
    "scoperouter.broker.credentials": 1,
    "scoperouter.broker.placement": 1,
    "scoperouter.broker.identity": 1,
    "scoperouter.broker.clouds": 1,
    "scoperouter.broker.secrets": 1,
    "scoperouter.broker.config": 1,
    "scoperouter.broker.logs": 1,
    "scoperouter.broker.parent": 1,
    "scoperouter.broker.osbclient": 1,
    "scoperouter.broker": 1,  # the package's __init__
}
LAYER_NAMES = {5: "transport", 4: "endpoints", 3: "state", 2: "services", 1: "contract/helpers"}


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of `module`: that of the longest prefix `layers` names (None: unplaced)."""
    best = max(
        (p for p in layers if module == p or module.startswith(p + ".")), key=len, default=None
    )
    return None if best is None else layers[best]


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every import in `graph` (module -> the modules it imports) of a higher layer than the
    importer's, and every module without a layer."""
    wrong = []
    for module, names in sorted(graph.items()):
        mine = layer_of(module, layers)
        if mine is None:
            wrong.append(f"{module} has no layer")
            continue
        for name in sorted(names):
            theirs = layer_of(name, layers)
            if theirs is not None and theirs > mine:
                wrong.append(
                    f"{module} ({LAYER_NAMES.get(mine, mine)}) imports {name} "
                    f"({LAYER_NAMES.get(theirs, theirs)})"
                )
    return wrong


def _graph(root: Path, package: Path) -> dict[str, set[str]]:
    return {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): {
            n for n in _imports(path) if n.startswith(package.name)
        }
        for path in sorted(package.rglob("*.py"))
    }


def _broker_graph() -> dict[str, set[str]]:
    return {
        _module(path): {n for n in _imports(path) if n.startswith("scoperouter.broker")}
        for path in _sources("broker")
    }


def test_a_broker_layer_never_imports_a_higher_one() -> None:
    assert not upward_imports(_broker_graph(), BROKER_LAYERS)


def test_the_layer_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The check on a planted case: a tiny package whose helper (the lowest layer) imports a
    plug-in, as credentials.py and placement.py imported services.base before the contract
    moved below the services; and a module no layer names. Both are reported; the downward
    import (the plug-in importing the helper) is not."""
    pkg = tmp_path / "mini"
    (pkg / "services").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "services" / "__init__.py").write_text("")
    (pkg / "services" / "base.py").write_text("from mini.helpers import tag\n")
    (pkg / "helpers.py").write_text(
        "def tag():\n    from mini.services.base import Service  # upward\n"
    )
    (pkg / "stray.py").write_text("")
    layers = {"mini.services": 2, "mini.helpers": 1, "mini": 1}
    graph = _graph(tmp_path, pkg)
    graph["mini.stray"] = set()
    assert upward_imports(graph, layers) == [
        "mini.helpers (contract/helpers) imports mini.services.base (services)",
        "mini.helpers (contract/helpers) imports mini.services.base.Service (services)",
    ]
    unplaced = upward_imports(graph, {"mini.services": 2, "mini.helpers": 1})
    assert {"mini has no layer", "mini.stray has no layer"} <= set(unplaced)


def _top_level_names(path: Path) -> set[str]:
    """The names a module defines at its top level (classes, functions, assignments)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def imports_through(paths: list[Path], module: str, names: set[str]) -> list[str]:
    """Every import of one of `names` from `module` in `paths` (as "file:line name")."""
    found = []
    for path in paths:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                found += [
                    f"{shown}:{node.lineno} {alias.name}"
                    for alias in node.names
                    if alias.name in names
                ]
    return sorted(found)


def test_the_tables_are_imported_from_tables_not_store() -> None:
    """The tables moved out of store.py (720 lines) into tables.py; store.py re-exported them
    for a while. Now every importer names tables.py: one name for each table and state, and
    no dependency on the queries where only the schema is needed."""
    tables = _top_level_names(PACKAGE / "broker" / "tables.py")
    assert {"Instance", "Binding", "Operation", "GONE", "utcnow"} <= tables
    paths = [
        path
        for top in ("scoperouter", "bench", "tests", "lab")
        for path in sorted((ROOT / top).rglob("*.py"))
        if not {".venv", "site-packages", "build"} & set(path.relative_to(ROOT).parts)
    ]
    assert not imports_through(paths, "scoperouter.broker.store", tables)


def test_the_re_export_check_finds_one(tmp_path: Path) -> None:
    """The check on a planted case: a table imported through store, a query's name not."""
    planted = tmp_path / "planted.py"
    planted.write_text("from scoperouter.broker.store import GONE, Store\n")
    found = imports_through([planted], "scoperouter.broker.store", {"GONE", "Instance"})
    assert [f.split(" ")[-1] for f in found] == ["GONE"]


def test_no_import_cycle_in_the_broker() -> None:
    graph = _broker_graph()
    modules = set(graph)
    edges = {m: {n for n in graph[m] if n in modules and n != m} for m in modules}
    assert not cycles(edges)


def test_no_module_of_the_broker_is_over_600_lines() -> None:
    long = {
        _module(path): n
        for path in _sources("broker")
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert not long, long


def test_each_broker_command_is_a_module_of_at_most_400_lines() -> None:
    from scoperouter.broker.cli import COMMANDS

    sizes = {
        module: len((ROOT / (module.replace(".", "/") + ".py")).read_text().splitlines())
        for module in COMMANDS.values()
    }
    assert all(0 < n <= 400 for n in sizes.values()), sizes
