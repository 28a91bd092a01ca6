"""The documentation site's generated pages (docs/hooks/): the configuration reference is the
code's model, defaults and validation, and fails the build when they and the page part ways;
the command-line reference is the parsers' own help."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from scoperouter.catalog import Breaker, Limits, Peers, Settings
from scoperouter.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def _hook(name: str) -> ModuleType:
    """A hook module, loaded from its file as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", ROOT / "docs/hooks" / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


reference = _hook("config_reference.py")
cli_help = _hook("cli_help.py")


def _leaves(cls: type, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    instance = cls()
    for field in dataclasses.fields(cls):
        value = getattr(instance, field.name)
        if dataclasses.is_dataclass(value):
            out |= _leaves(type(value), f"{prefix}.{field.name}")
        else:
            out[f"{prefix}.{field.name}"] = value
    return out


def test_every_setting_is_in_the_reference_with_its_default_and_description() -> None:
    rows = {".".join(s.path): s for s in reference.settings()}
    assert set(rows) == set(_leaves(Settings, "settings"))  # every field, nothing else
    assert rows["settings.limits.max_headers"].default == Limits().max_headers
    assert rows["settings.breaker.down_for"].default == Breaker().down_for
    assert rows["settings.peers.warm"].accepted == "an integer from 0 to 64"
    assert rows["settings.verify"].accepted == "true or false"
    assert rows["settings.peers.ca"].default is None
    for setting in rows.values():
        assert setting.description and "``" not in setting.description, setting
    markdown = reference.reference_markdown()
    for section in ("settings", "settings.limits", "settings.breaker", "settings.peers"):
        assert f"### `{section}`" in markdown
    assert "| `idle_timeout` | `60.0` | a positive number of seconds |" in markdown


def test_a_default_is_the_one_the_loader_applies() -> None:
    """peer_connect_timeout's default is the backends' connect_timeout, as the loader applies
    it; the reference shows what a config that leaves the key out gets."""
    rows = {".".join(s.path): s for s in reference.settings()}
    assert rows["settings.peer_connect_timeout"].default == Settings().connect_timeout


def test_a_field_without_a_docstring_stops_the_build() -> None:
    @dataclasses.dataclass(frozen=True)
    class Documented:
        size: int = 1
        """How big."""
        colour: str = "red"

    assert reference.attribute_docs(Documented) == {"size": "How big."}
    with pytest.raises(reference.ReferenceDrift, match=r"Documented.colour has no description"):
        reference.describe(Documented, "colour")


def test_a_field_the_loader_does_not_accept_stops_the_build() -> None:
    """The model and the loader must agree on the keys: a field the loader refuses (or a key
    it accepts that the model lacks) is not documented as if it worked."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class MoreLimits(Limits):
        max_trailer_bytes: int = 4096
        """Bytes of a request's trailer fields."""

    with pytest.raises(reference.ReferenceDrift, match="max_trailer_bytes"):
        list(reference.settings(MoreLimits, ("settings", "limits")))


def test_the_cloud_keys_are_the_loaders() -> None:
    markdown = reference.clouds_markdown()
    for key in ("region", "frontends", "services", "peer", "proxy", "metrics", "credentials"):
        assert f"| `{key}` |" in markdown
    assert "| `frontends` | required |" in markdown and "| `peer` | optional |" in markdown
    assert reference.accepted_keys((), reference.MINIMAL) == reference.TOP_KEYS


def test_the_page_keeps_its_marker() -> None:
    page = (ROOT / "docs" / reference.PAGE).read_text()
    assert reference.MARKER in page


@pytest.mark.parametrize(
    "command", ["serve", "route", "check-config", "import-catalog", "pki", "status"]
)
def test_the_cli_reference_is_the_parsers_help(command: str) -> None:
    text = cli_help.help_text([command])
    assert text.startswith(f"usage: scoperouter {command} ")
    assert " here)" not in text  # nothing of the machine that builds the site
    assert (
        f"<!-- generated: scoperouter {command} --help -->"
        in (ROOT / "docs/reference/cli.md").read_text()
    )


def test_the_cli_reference_refuses_a_command_that_does_not_exist() -> None:
    assert set(COMMANDS) >= {"serve", "pki"}
    with pytest.raises(cli_help.NoSuchCommand, match="'nope'"):
        cli_help.help_text(["pki", "nope"])


def test_peers_are_documented_from_their_own_class() -> None:
    docs = reference.attribute_docs(Peers)
    assert docs["warm"] == "Connections each worker keeps open ahead to every peer router."
