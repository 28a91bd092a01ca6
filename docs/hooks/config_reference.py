"""MkDocs hook: the configuration reference, generated from the code when the site is built.

The page ``reference/configuration.md`` holds the line :data:`MARKER`; this hook replaces it
with tables read from the code itself, so a setting added later appears without editing the
page:

* every ``settings`` key from the frozen dataclasses of :mod:`scoperouter.catalog`
  (:class:`~scoperouter.catalog.Settings` and the sections it holds: ``Limits``, ``Breaker``,
  ``Peers``, ...), each with the docstring written under its field;
* each default as the config loader (:mod:`scoperouter.config`) applies it to a config that
  leaves the key out, and what the loader accepts, in the words of its own error message;
* the keys of ``clouds.<name>`` (and of its listeners, endpoints, ``proxy``, ``metrics``) with
  the docstrings of the model fields they fill.

The keys are checked against the loader: a key it accepts that the reference does not
describe, a field without a docstring, or a description for a key it no longer accepts fails
the build (:class:`ReferenceDrift`). ``python docs/hooks/config_reference.py`` prints the
generated Markdown.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from scoperouter.catalog import Cloud, Endpoint, Frontend, Settings
from scoperouter.config import OBSOLETE_DATA_PATH, build_catalog
from scoperouter.errors import ConfigError

MARKER = "<!-- generated: configuration reference -->"
PAGE = "reference/configuration.md"

_UNKNOWN = "x-not-a-key"
_WRONG = ["not", "a", "value"]  # of no type the loader accepts for a leaf key

# The smallest config the loader accepts: one cloud, one endpoint.
MINIMAL: dict[str, Any] = {
    "version": 1,
    "clouds": {
        "CloudOne": {
            "frontends": [{"url": "http://127.0.0.2:9292"}],
            "services": {
                "image": {
                    "public": {"url": "http://127.0.0.2:9292", "backend": "http://127.0.1.2:9292"}
                }
            },
        }
    },
}

# The keys of a cloud and what fills them: YAML key -> (model class, field, YAML shape).
CLOUD_KEYS: dict[str, tuple[type, str, str]] = {
    "region": (Cloud, "region", "a string"),
    "frontends": (Cloud, "frontends", "a list of listeners (below)"),
    "services": (
        Cloud,
        "endpoints",
        "service type → interface (`public`, `internal`, `admin`) → endpoint (below)",
    ),
    "peer": (Cloud, "peer", "a listener (below), `https://`"),
    "proxy": (Cloud, "proxy_listen", "`{listen: HOST:PORT}`, and `ca`, `ca_key` (below)"),
    "metrics": (Cloud, "metrics_listen", "`{listen: HOST:PORT}`"),
    "credentials": (Cloud, "credentials", "another cloud's name → a clouds.yaml entry"),
}
LISTENER_KEYS: dict[str, tuple[type, str, str]] = {
    "url": (Frontend, "url", "`http://HOST:PORT` or `https://HOST:PORT`"),
    "listen": (Frontend, "listen_host", "`HOST:PORT`"),
    "tls": (Frontend, "cert", "`{cert: FILE, key: FILE}` (relative: to the config file)"),
}
PROXY_KEYS: dict[str, tuple[type, str, str]] = {
    "listen": (Cloud, "proxy_listen", "`HOST:PORT`"),
    "ca": (Cloud, "proxy_ca", "a PEM file (relative: to the config file)"),
    "ca_key": (Cloud, "proxy_ca_key", "a PEM file, mode 0600"),
}
ENDPOINT_KEYS: dict[str, tuple[type, str, str]] = {
    "url": (Endpoint, "url", "an http(s) URL"),
    "backend": (Endpoint, "backend", "an http(s) URL"),
}
TOP_KEYS = {"version", "settings", "clouds"}


class ReferenceDrift(Exception):
    """The code and the reference disagree: the build stops, saying where."""


# ---------------------------------------------------------------------------------- the code


@cache
def _module_tree(module: str) -> ast.Module:
    """The module's source, read from its .py: a compiled module (mypyc's extension module,
    scoperouter._build) has none for inspect.getsource, and its .py is beside it."""
    file = Path(sys.modules[module].__file__ or "")
    return ast.parse(file.with_name(file.name.split(".", 1)[0] + ".py").read_text())


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under the fields of `cls` (a string right after the field), as
    one line each."""
    for node in ast.walk(_module_tree(cls.__module__)):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            break
    else:
        raise ReferenceDrift(f"no class {cls.__name__} in {cls.__module__}")
    docs: dict[str, str] = {}
    body = node.body
    for field, after in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)):
            continue
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[field.target.id] = _markdown(after.value.value)
    return docs


def _markdown(docstring: str) -> str:
    """A docstring as one line of Markdown (reST's ``literal`` becomes `literal`)."""
    text = " ".join(inspect.cleandoc(docstring).split())
    return re.sub(r"``(.+?)``", r"`\1`", text).replace(" -> ", " → ")


def describe(cls: type, field: str) -> str:
    doc = attribute_docs(cls).get(field)
    if not doc:
        raise ReferenceDrift(
            f"{cls.__name__}.{field} has no description: write a docstring under the field in "
            f"{cls.__module__} (the configuration reference shows it)"
        )
    return doc


def _load(doc: Any) -> ConfigError | None:
    try:
        build_catalog(doc, source="", base_dir=None)
    except ConfigError as exc:
        return exc
    return None


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """MINIMAL with `value` at `path` (mappings made on the way)."""
    doc = copy.deepcopy(MINIMAL)
    node: Any = doc
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[path[-1]] = value
    return doc


def _dotted(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")


def accepted_keys(path: tuple[str | int, ...], mapping: dict[str, Any]) -> set[str]:
    """The keys the loader accepts in the mapping at `path` (`mapping`: a valid one), read
    from its refusal of an unknown key."""
    doc = copy.deepcopy(MINIMAL) if not path else _with(path, {**mapping, _UNKNOWN: 1})
    if not path:
        doc[_UNKNOWN] = 1
    error = _load(doc)
    found = re.search(r"unknown key \(expected one of: ([^)]*)\)", error.message if error else "")
    if error is None or found is None:
        raise ReferenceDrift(f"the loader accepts an unknown key at {_dotted(path) or 'the top'}")
    return {key.strip() for key in found.group(1).split(",")}


def required_keys(path: tuple[str | int, ...]) -> set[str]:
    """The keys the loader requires in the mapping at `path`, read from its refusal of an
    empty one."""
    error = _load(_with(path, {}))
    found = re.search(r"missing key\(s\): (.*)", error.message if error else "")
    return {key.strip() for key in found.group(1).split(",")} if found else set()


def accepted_values(path: tuple[str | int, ...]) -> str:
    """What the loader accepts at `path`, in the words of its error for a wrong value."""
    error = _load(_with(path, copy.deepcopy(_WRONG)))
    if error is None:
        return "anything (not checked)"
    text = re.sub(r",? not \[.*\]$", "", error.message)
    text = re.sub(r"^(must be|expected) ", "", text)
    return text


# ---------------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Setting:
    path: tuple[str, ...]
    default: Any
    accepted: str
    description: str


def _sections(cls: type) -> dict[str, type]:
    """The fields of `cls` that are sections of their own (a dataclass made by default)."""
    found: dict[str, type] = {}
    for field in dataclasses.fields(cls):
        made = field.default_factory
        if isinstance(made, type) and dataclasses.is_dataclass(made):
            found[field.name] = made
    return found


def settings(cls: type = Settings, path: tuple[str, ...] = ("settings",)) -> Iterator[Setting]:
    """Every settings key under `path`, leaves first, then each section's."""
    parsed = build_catalog(copy.deepcopy(MINIMAL)).settings
    for key in path[1:]:
        parsed = getattr(parsed, key)
    names = {f.name for f in dataclasses.fields(cls)}
    loader = accepted_keys(path, {})
    if path == ("settings",):
        loader.discard(OBSOLETE_DATA_PATH)  # read with a warning, described on its own below
    if loader != names:
        raise ReferenceDrift(
            f"{_dotted(path)}: the loader accepts {sorted(loader)}, {cls.__name__} has "
            f"{sorted(names)}"
        )
    sections = _sections(cls)
    for field in dataclasses.fields(cls):
        if field.name not in sections:
            yield Setting(
                (*path, field.name),
                getattr(parsed, field.name),
                accepted_values((*path, field.name)),
                describe(cls, field.name),
            )
    for name, section in sections.items():
        yield from settings(section, (*path, name))


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _default(value: Any) -> str:
    return "not set" if value is None else f"`{_yaml(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_markdown() -> str:
    out: list[str] = []
    by_section: dict[tuple[str, ...], list[Setting]] = {}
    for setting in settings():
        by_section.setdefault(setting.path[:-1], []).append(setting)
    for section, rows in by_section.items():
        name = ".".join(section)
        owner: type = Settings
        for key in section[1:]:
            owner = _sections(owner)[key]
        intro = _markdown((owner.__doc__ or "").split("\n\n")[0])
        out += [f"### `{name}`", "", intro, "", "| key | default | accepted | |"]
        out.append("|---|---|---|---|")
        for row in rows:
            out.append(
                f"| `{row.path[-1]}` | {_default(row.default)} | {_cell(row.accepted)} | "
                f"{_cell(row.description)} |"
            )
        out.append("")
    out += ["Every setting with its default, as YAML:", "", "```yaml", *_defaults_yaml(), "```"]
    return "\n".join(out)


def _defaults_yaml() -> list[str]:
    lines = ["settings:"]
    for setting in settings():
        depth = len(setting.path) - 1
        for level in range(1, depth):
            header = "  " * level + f"{setting.path[level]}:"
            if header not in lines:
                lines.append(header)
        indent = "  " * depth
        if setting.default is None:
            lines.append(f"{indent}# {setting.path[-1]}:   (not set)")
        else:
            lines.append(f"{indent}{setting.path[-1]}: {_yaml(setting.default)}")
    return lines


# ------------------------------------------------------------------------------------ clouds


def _check(path: tuple[str | int, ...], mapping: dict[str, Any], table: dict[str, Any]) -> None:
    loader = accepted_keys(path, mapping)
    if loader != set(table):
        raise ReferenceDrift(
            f"{_dotted(path)}: the loader accepts {sorted(loader)}, the reference describes "
            f"{sorted(table)} (docs/hooks/config_reference.py)"
        )


def _table(rows: dict[str, tuple[type, str, str]], required: set[str]) -> list[str]:
    out = ["| key | | value | |", "|---|---|---|---|"]
    for key, (cls, field, shape) in rows.items():
        need = "required" if key in required else "optional"
        out.append(f"| `{key}` | {need} | {shape} | {_cell(describe(cls, field))} |")
    return [*out, ""]


def clouds_markdown() -> str:
    cloud_path: tuple[str | int, ...] = ("clouds", "CloudOne")
    cloud = MINIMAL["clouds"]["CloudOne"]
    listener = cloud["frontends"][0]
    endpoint = cloud["services"]["image"]["public"]
    _check((), MINIMAL, dict.fromkeys(TOP_KEYS))
    _check(cloud_path, cloud, CLOUD_KEYS)
    _check((*cloud_path, "frontends", 0), listener, LISTENER_KEYS)
    _check((*cloud_path, "services", "image", "public"), endpoint, ENDPOINT_KEYS)
    _check((*cloud_path, "frontends", 0, "tls"), {"cert": "c", "key": "k"}, {"cert": 0, "key": 0})
    _check((*cloud_path, "proxy"), {"listen": "127.0.0.2:3128"}, PROXY_KEYS)
    _check((*cloud_path, "metrics"), {"listen": "127.0.0.2:9180"}, {"listen": 0})
    out = ["### `clouds.<name>`", "", f"`<name>`: {describe(Cloud, 'name')}", ""]
    out += _table(CLOUD_KEYS, required_keys(cloud_path))
    out += [
        "### Listeners: `frontends[]` and `peer`",
        "",
        _markdown(Frontend.__doc__ or ""),
        "",
        *_table(LISTENER_KEYS, required_keys((*cloud_path, "frontends", 0))),
        "### The forward proxy: `proxy`",
        "",
        "Where the cloud's services send their calls (`HTTP_PROXY`, and `HTTPS_PROXY` when it "
        "intercepts TLS: [TLS clouds](../router/tls-clouds.md)).",
        "",
        *_table(PROXY_KEYS, required_keys((*cloud_path, "proxy"))),
        "### Endpoints: `services.<type>.<interface>`",
        "",
        _markdown(Endpoint.__doc__ or ""),
        "",
        *_table(ENDPOINT_KEYS, required_keys((*cloud_path, "services", "image", "public"))),
    ]
    return "\n".join(out)


OBSOLETE = (
    f"An earlier version's `settings.{OBSOLETE_DATA_PATH}` is still read: `lean` (what the "
    "router's one data path is now) with a warning to remove it; `mitmproxy` is refused with "
    "what to do."
)


def reference_markdown() -> str:
    return (
        "## Settings\n\n"
        + settings_markdown()
        + "\n\n"
        + OBSOLETE
        + "\n\n## Clouds\n\n"
        + clouds_markdown()
    )


# ------------------------------------------------------------------------------ the MkDocs hook


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ReferenceDrift(f"{PAGE} has lost its marker {MARKER}")
    return markdown.replace(MARKER, reference_markdown())


if __name__ == "__main__":
    print(reference_markdown())
