"""The ``osb`` family: OSB requests with hostile parameters at a real broker running an
Ansible pack (tests/broker/packs/test-files: its playbooks write the parameters to files in a
folder and need no cloud).

The broker is ``scoperouter broker serve`` (:mod:`tests.fuzz.broker`: the pack's runs get a
clouds.yaml they never use), on loopback, with a SQLite database and real ansible-runner.
Inputs are provisions, updates and bindings whose parameters, context and keys carry Jinja2
(``lookup('pipe', 'touch <canary>')``, ``lookup('env', 'HOME')``, arithmetic whose result is
unique to the input, loops, broken templates), huge values, odd unicode and deep nesting. Most
are refused by the pack's schemas without a run; a bounded number (``--osb-runs``) are
accepted and run the playbooks.

What must hold: the canary file never appears; no evaluated result (an input's product, the
broker's HOME) is in any file the pack wrote, in any operation's description or in any
binding's credentials, and an instance's file holds exactly the content that was sent; every
answer is OSB JSON (an object; an error has a ``description``) with a sane status; no
traceback in the broker's log.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.broker.ansible_harness import PACK

RUN_STATUSES = {200, 201, 202}
SANE = RUN_STATUSES | {400, 404, 409, 410, 412, 413, 422}


@dataclass
class OsbInput:
    n: int
    method: str
    path: str
    body: Any  # JSON, or bytes sent as is
    run: bool  # expected to start an Ansible run
    products: list[str] = field(default_factory=list)  # results that must never appear
    content: str | None = None  # what the instance's file holds once it succeeded


def _payload(rng: random.Random, canary: str, products: list[str]) -> str:
    a, b = rng.randrange(10_000, 99_999), rng.randrange(10_000, 99_999)
    products.append(str(a * b))
    product = f"{a}*{b}"
    return rng.choice(
        [
            f"{{{{ lookup('pipe', 'touch {canary}') }}}}",
            f"{{{{ query('pipe', 'touch {canary}') | first }}}}",
            "{{ lookup('env','HOME') }}",
            f"{{{{ {product} }}}}",
            f"x{{{{{product}}}}}y",
            f"{{% for i in range(2) %}}{{{{ {product} }}}}{{% endfor %}}",
            f"{{% set x = {product} %}}{{{{ x }}}}",
            f"{{{{ {product} ",
            "{% if %}",
            "{{ undefined_thing.attr }}",
            "{{ ''.__class__.__mro__[1].__subclasses__() }}",
            f"{{# note #}}{{{{ ({product}) | string }}}}",
            f"{{% raw %}}{{{{ {product} }}}}{{% endraw %}}",
            f"${{{{ {product} }}}}",
            f"{{{{ lookup('file', '/etc/hostname') }}}}{{{{ {product} }}}}",
        ]
    )


def _content_max() -> int:
    """The pack's own bound on `content` (its service.yml): the refused inputs stay above it."""
    spec = yaml.safe_load((PACK / "service.yml").read_text())
    return int(spec["parameters"]["provision"]["properties"]["content"]["maxLength"])


# lengths of `content` the pack's schema refuses, so that these inputs make no Ansible run
TOO_LONG = (_content_max() + 1, 5000, 1 << 20)


def _odd(rng: random.Random) -> str:
    return rng.choice(
        [
            "\u202egnp.exe",
            "\ufeff",
            "e\u0301",
            "\U0001f600" * 3,
            "\x00",
            "\\u0000",
            "\ud7ff",
            "'\"`",
        ]
    )


def _value(rng: random.Random, canary: str, products: list[str], limit: int) -> str:
    text = _payload(rng, canary, products)
    if rng.random() < 0.3:
        text = _odd(rng) + text + _odd(rng)
    return text[:limit] if len(text) > limit else text


def _nested(rng: random.Random, canary: str, products: list[str], depth: int) -> Any:
    if depth <= 0:
        return _payload(rng, canary, products)
    key = _payload(rng, canary, products) if rng.random() < 0.5 else "k"
    inner = _nested(rng, canary, products, depth - 1)
    return {key: inner} if rng.random() < 0.6 else [inner]


def generate(seed: int, n: int, ids: dict[str, str], canary: str, known: list[str]) -> OsbInput:
    """Input `n`; `known`: instances provisioned so far (updates and bindings go there);
    `canary`: the prefix of the file its commands would create (``<canary><n>``)."""
    rng = random.Random(seed * 5_000_011 + n)
    canary = f"{canary}{n}"
    products: list[str] = []
    # the same draws whatever `known` holds: an input replayed alone (--only) is the same
    # request, except that an update's or a binding's instance may not exist then
    pick, index, kind = rng.random(), rng.randrange(1 << 30), rng.random()
    instance = known[index % len(known)] if known and pick < 0.4 else f"fo{n}"
    context = {"platform": "cloudfoundry", "organization_guid": "org", "space_guid": "space"}
    if rng.random() < 0.3:
        context[rng.choice(["organization_guid", "space_guid", "instance_name", "x"])] = _value(
            rng, canary, products, 200
        )
    base = {**ids, "organization_guid": "org", "space_guid": "space", "context": context}
    if kind < 0.25:  # a provision the schema accepts: a run (some without a template, so
        # that runs happen even where a broker refuses templates outright)
        content = _value(rng, canary, products, 100) if rng.random() < 0.85 else f"plain {n} é"
        params: dict[str, Any] = {"content": content}
        if rng.random() < 0.5:
            params["password"] = _value(rng, canary, products, 5000)
        body = {**base, "parameters": params}
        path = f"/v2/service_instances/fo{n}?accepts_incomplete=true"
        return OsbInput(n, "PUT", path, body, True, products, content)
    if kind < 0.35:  # an update the schema accepts: a run (when its instance exists)
        content = _value(rng, canary, products, 100)
        body = {"service_id": ids["service_id"], "parameters": {"content": content}}
        path = f"/v2/service_instances/{instance}?accepts_incomplete=true"
        return OsbInput(n, "PATCH", path, body, instance in known, products, content)
    if kind < 0.42:  # a binding: a run when its role is in the enum and its instance exists
        role = rng.choice(["reader", "writer", _value(rng, canary, products, 100)])
        body = {**ids, "bind_resource": {"app_guid": _value(rng, canary, products, 80)}}
        body["parameters"] = {"role": role}
        if rng.random() < 0.3:
            body["context"] = context
        path = f"/v2/service_instances/{instance}/service_bindings/fb{n}?accepts_incomplete=true"
        run = role in ("reader", "writer") and instance in known
        return OsbInput(n, "PUT", path, body, run, products)
    # refused by the schemas (or the API) without a run
    hostile: dict[str, Any] = rng.choice(
        [
            {"content": _payload(rng, canary, products) + "x" * rng.choice(TOO_LONG)},
            {_payload(rng, canary, products): "x"},
            {"content": _nested(rng, canary, products, rng.choice([1, 3, 30, 200]))},
            {"content": [_payload(rng, canary, products)] * rng.choice([1, 1000])},
            {"content": rng.choice([7, 7.5, True, None])},
            {"sleep": _payload(rng, canary, products)},
            {"fail": _payload(rng, canary, products)},
            {"content": "ok", "extra": {"nested": _payload(rng, canary, products)}},
            {"content": _odd(rng) * TOO_LONG[0]},
        ]
    )
    verb = rng.choice(["PUT", "PATCH", "BIND"])
    if verb == "PUT":
        body = {**base, "parameters": hostile}
        path = f"/v2/service_instances/fo{n}?accepts_incomplete=true"
    elif verb == "PATCH":
        body = {"service_id": ids["service_id"], "parameters": hostile}
        path = f"/v2/service_instances/{instance}?accepts_incomplete=true"
    else:
        body = {**ids, "bind_resource": {"app_guid": "a"}, "parameters": hostile}
        path = f"/v2/service_instances/{instance}/service_bindings/fb{n}?accepts_incomplete=true"
    if rng.random() < 0.1:  # the ids themselves hostile, or no JSON at all
        body = rng.choice(
            [
                {**body, "service_id": _payload(rng, canary, products) * 50},
                {**body, "plan_id": _nested(rng, canary, products, 50)},
                b"{" * 5000,
                b'{"parameters": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                "\ud800".encode("utf-8", "surrogatepass"),
            ]
        )
    verb_method = "PUT" if verb == "BIND" else verb
    return OsbInput(n, verb_method, path, body, False, products)


def check_answer(status: int, text: str) -> str | None:
    """What is wrong with a broker's answer, or None: a sane status, an OSB JSON object, an
    error with its description."""
    if status not in SANE:
        return f"status {status}: {text[:200]!r}"
    try:
        data = json.loads(text)
    except ValueError:
        return f"{status} is not JSON: {text[:200]!r}"
    if not isinstance(data, dict):
        return f"{status} is not a JSON object: {text[:200]!r}"
    if status >= 400 and not isinstance(data.get("description"), str):
        return f"{status} without an OSB description: {text[:200]!r}"
    return None


def evaluated(text: str, products: list[str], home: str) -> str | None:
    """The evaluated result found in `text`, or None."""
    for product in products:
        if product in text:
            return f"the result {product} of a template"
    if home in text:
        return f"the broker's HOME ({home})"
    return None
