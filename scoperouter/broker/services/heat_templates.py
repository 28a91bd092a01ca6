"""HOT templates of the ``heat`` services: a template's ``parameters`` as the plan's JSON
schemas (:func:`template_schemas`), the values sent to heat (:func:`stack_parameters`), and the
name and tags a stack of an instance carries (:func:`stack_name`, :func:`owner_of`).

No I/O but reading a template file; :mod:`~scoperouter.broker.services.heat` is the service.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from scoperouter.broker.config import BrokerConfigError
from scoperouter.broker.contract import DRAFT4, JSONValue
from scoperouter.broker.openstack_helpers import instance_tag

HOT_TYPES = ("string", "number", "json", "comma_delimited_list", "boolean")
STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,254}$")


class _HotLoader(yaml.SafeLoader):
    """YAML as heat reads templates: dates stay text (``heat_template_version: 2018-08-31``
    is a version, not a date)."""


_HotLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_template(path: Path) -> dict[str, Any]:
    """A HOT template from a file, checked for what the broker relies on; raises
    BrokerConfigError naming the file."""
    try:
        data = yaml.load(path.read_text(), Loader=_HotLoader)  # a SafeLoader
    except OSError as exc:
        raise BrokerConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise BrokerConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or "heat_template_version" not in data:
        raise BrokerConfigError(f"{path}: not a HOT template (no heat_template_version)")
    if not isinstance(data.get("resources"), Mapping) or not data["resources"]:
        raise BrokerConfigError(f"{path}: resources: a template needs at least one resource")
    for key in ("parameters", "outputs"):
        if not isinstance(data.get(key) or {}, Mapping):
            raise BrokerConfigError(f"{path}: {key}: expected a mapping")
    return data


def template_schemas(
    template: Mapping[str, Any], *, fixed: Iterable[str] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON schemas (create, update) of a template's parameters, but those in `fixed`
    (set by the plan). A parameter without a default is required at create; the update schema
    leaves out ``immutable`` parameters and requires nothing (an update changes what it
    names). Raises ValueError naming the parameter and the key it cannot use."""
    fixed = set(fixed)
    properties: dict[str, Any] = {}
    required: list[str] = []
    mutable: dict[str, Any] = {}
    for name, spec in (template.get("parameters") or {}).items():
        name = str(name)
        if name in fixed:
            continue
        if not isinstance(spec, Mapping):
            raise ValueError(f"parameters.{name}: expected a mapping")
        schema = parameter_schema(name, spec)
        properties[name] = schema
        if "default" not in spec:
            required.append(name)
        if not spec.get("immutable"):
            mutable[name] = copy.deepcopy(schema)
    create: dict[str, Any] = {
        "$schema": DRAFT4,
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if required:
        create["required"] = sorted(required)
    update = {
        "$schema": DRAFT4,
        "type": "object",
        "additionalProperties": False,
        "properties": mutable,
    }
    return create, update


def parameter_schema(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """One HOT parameter as a JSON schema (draft-04)."""
    kind = spec.get("type")
    if kind not in HOT_TYPES:
        raise ValueError(f"parameters.{name}.type: expected one of {list(HOT_TYPES)}, got {kind!r}")
    schema: dict[str, Any]
    if kind == "string":
        schema = {"type": "string"}
    elif kind == "number":
        schema = {"type": "number"}
    elif kind == "boolean":
        schema = {"type": "boolean"}
    elif kind == "json":
        schema = {"type": ["object", "array"]}
    else:  # a list, or its comma separated text (as heat takes it)
        schema = {"type": ["array", "string"], "items": {"type": "string"}}
    if spec.get("label"):
        schema["title"] = str(spec["label"])
    notes = [str(spec["description"])] if spec.get("description") else []
    if "default" in spec:
        schema["default"] = _default(kind, spec["default"])
    if spec.get("hidden"):
        schema["writeOnly"] = True
    if spec.get("immutable"):
        notes.append("cannot be changed by an update")
    constraints = spec.get("constraints") or []
    if not isinstance(constraints, list):
        raise ValueError(f"parameters.{name}.constraints: expected a list")
    for index, constraint in enumerate(constraints):
        if not isinstance(constraint, Mapping):
            raise ValueError(f"parameters.{name}.constraints[{index}]: expected a mapping")
        note = _constrain(name, kind, schema, constraint)
        if note:
            notes.append(note)
    if notes:
        schema["description"] = "; ".join(notes)
    return schema


def _default(kind: str, value: JSONValue) -> JSONValue:
    if kind == "comma_delimited_list" and isinstance(value, str):
        return [item.strip() for item in value.split(",")] if value else []
    if kind == "number" and isinstance(value, str):
        try:
            return float(value) if "." in value else int(value)
        except ValueError:
            return value
    return value


def _constrain(name: str, kind: str, schema: dict[str, Any], constraint: Mapping[str, Any]) -> str:
    """Apply one HOT constraint to `schema`; returns a note for what only heat can check."""
    where = f"parameters.{name}.constraints"
    if "length" in constraint:
        bounds = constraint["length"] or {}
        if kind == "string":
            keys = ("minLength", "maxLength")
        elif kind in ("comma_delimited_list", "json"):
            keys = ("minItems", "maxItems")  # heat counts items (json: keys too)
            if kind == "json":
                return "its length is checked by heat"
        else:
            raise ValueError(f"{where}: length applies to string, json and list parameters")
        if "min" in bounds:
            schema[keys[0]] = int(bounds["min"])
        if "max" in bounds:
            schema[keys[1]] = int(bounds["max"])
    elif "range" in constraint:
        if kind != "number":
            raise ValueError(f"{where}: range applies to number parameters")
        bounds = constraint["range"] or {}
        if "min" in bounds:
            schema["minimum"] = bounds["min"]
        if "max" in bounds:
            schema["maximum"] = bounds["max"]
    elif "modulo" in constraint:
        if kind != "number":
            raise ValueError(f"{where}: modulo applies to number parameters")
        step = (constraint["modulo"] or {}).get("step")
        offset = (constraint["modulo"] or {}).get("offset", 0)
        if step and not offset:
            schema["multipleOf"] = step
        else:
            return f"a multiple of {step} plus {offset} (checked by heat)"
    elif "allowed_values" in constraint:
        values = list(constraint["allowed_values"] or [])
        target = schema["items"] if kind == "comma_delimited_list" else schema
        target["enum"] = values
    elif "allowed_pattern" in constraint:
        if kind not in ("string", "comma_delimited_list"):
            raise ValueError(f"{where}: allowed_pattern applies to string parameters")
        pattern = str(constraint["allowed_pattern"])
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{where}: allowed_pattern: {exc}") from None
        # heat matches the whole value (re.match and the match's end); JSON schema searches
        target = schema["items"] if kind == "comma_delimited_list" else schema
        target["pattern"] = f"^(?:{pattern})$"
    elif "custom_constraint" in constraint:
        return f"a valid {constraint['custom_constraint']} (checked by heat)"
    else:
        raise ValueError(f"{where}: unknown constraint {sorted(constraint)}")
    return str(constraint.get("description") or "")


def stack_parameters(template: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """What heat gets: the template's parameters among `values` (lists of a
    comma_delimited_list joined as heat takes them)."""
    declared = template.get("parameters") or {}
    out: dict[str, Any] = {}
    for name, spec in declared.items():
        if name not in values:
            continue
        value = values[name]
        if (spec or {}).get("type") == "comma_delimited_list" and isinstance(value, list):
            value = ",".join(str(v) for v in value)
        out[str(name)] = value
    return out


def stack_name(instance_id: str) -> str:
    """``osb-<instance id>`` when heat takes it as a stack name, else ``osb-<digest>`` (48
    hex digits: never the 40 of a digested instance tag, so `broker repair` tells the two
    apart)."""
    name = f"osb-{instance_id}"
    if STACK_NAME.match(name):
        return name
    return "osb-" + hashlib.sha256(instance_id.encode()).hexdigest()[:48]


def owner_of(name: str | None, tags: Iterable[str]) -> str | None:
    """The instance id a stack of this broker belongs to, from its name and tags (None when
    neither says it: an instance id heat could not take as a name)."""
    if not name or not name.startswith("osb-"):
        return None
    candidate = name[len("osb-") :]
    return candidate if instance_tag(candidate) in set(tags) else None
