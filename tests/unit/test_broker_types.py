"""The broker's `Any` stands for JSON only (issue 33).

`Any` may be the value type of a str-keyed JSON object (``dict[str, Any]``,
``Mapping[str, Any]``, ``MutableMapping[str, Any]``: parameters, contexts, progress, config
sections, ASGI messages) and the one alias of a JSON value of any shape,
:data:`scoperouter.broker.contract.JSONValue`. Everything else has its real type: openstacksdk's,
keystoneauth's and SQLAlchemy's classes, the contract's Protocols, ``object`` for a value that
is only inspected with isinstance. mypy --strict checks those types; this test keeps a new
`Any` from standing where a type belongs.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROKER = ROOT / "scoperouter" / "broker"
JSON_CONTAINERS = {"dict", "Mapping", "MutableMapping"}
# (module, alias name): where `Any` may be spelt alone, once
JSON_ALIAS = ("scoperouter/broker/contract.py", "JSONValue")


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any"
    )


def loose_anys(source: str, *, alias: str | None = None) -> list[int]:
    """The lines of every `Any` in `source` that is neither the value type of a str-keyed
    JSON container nor the value of the assignment ``<alias> = Any``."""
    tree = ast.parse(source)
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple):
            base = node.value
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            parts = node.slice.elts
            if (
                name in JSON_CONTAINERS
                and len(parts) == 2
                and isinstance(parts[0], ast.Name)
                and parts[0].id == "str"
                and _is_any(parts[1])
            ):
                allowed.add(id(parts[1]))
        elif (
            alias is not None
            and isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == [alias]
            and _is_any(node.value)
        ):
            allowed.add(id(node.value))
    return sorted(
        node.lineno for node in ast.walk(tree) if _is_any(node) and id(node) not in allowed
    )


def test_the_broker_uses_any_for_json_only() -> None:
    loose = {}
    for path in sorted(BROKER.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        alias = JSON_ALIAS[1] if name == JSON_ALIAS[0] else None
        if lines := loose_anys(path.read_text(), alias=alias):
            loose[name] = lines
    assert not loose, loose


def test_the_json_alias_is_there() -> None:
    from scoperouter.broker import contract

    assert hasattr(contract, JSON_ALIAS[1])


def test_the_check_finds_a_loose_any() -> None:
    source = textwrap.dedent(
        """
        import typing
        from typing import Any
        JSONValue = Any
        def f(conn: Any, body: dict[str, Any], seen: Mapping[int, Any]) -> list[Any]:
            rows: tuple[typing.Any, ...] = ()
            kept: MutableMapping[str, Any] = {}
            return [x for x in body.values()]
        """
    )
    assert loose_anys(source, alias="JSONValue") == [5, 5, 5, 6]
    assert loose_anys(source) == [4, 5, 5, 5, 6]
