"""Hostile values for anything the broker hands to an interpreter (Jinja2 in an Ansible pack's
run, a shell, a path): the payloads of issue 30 finding 1 and their relatives. Shared by the
broker's tests (tests/broker/test_ansible_hostile.py) and the OSB fuzz family.

Every value must reach a playbook as its literal text: `evaluated(text)` says whether a text
holds what evaluating one of them would have produced."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any


def templates(canary: Path) -> list[str]:
    """Jinja2 that runs a command (touching `canary`), reads the environment or a file,
    computes, loops, and that does not parse."""
    return [
        f"{{{{ lookup('pipe', 'id; touch {canary}') }}}}",
        f"{{{{ query('ansible.builtin.pipe', 'touch {canary}') }}}}",
        "{{ lookup('env','HOME') }}",
        "{{ 7*7 }}",
        "{% for i in range(3) %}{{ i }}{% endfor %}",
        "{% if true %}{{ 'evaluated' ~ '-if' }}{% endif %}",
        "{{ lookup('ansible.builtin.file', '/etc/hostname') }}",
        "{{ nope(",  # a template syntax error
        "{% raw %}{{ 7*7 }}{% endraw %}",
        "{# a comment #}x",
        "${HOME} $(id) `id` ; id | id && id",  # shell metacharacters
        "'\"\\ \n\t",
    ]


def nested(values: list[str]) -> dict[str, Any]:
    """The values as dict values, in lists, and as dict keys."""
    return {
        "flat": values[0],
        "list": list(values),
        "dict": {f"k{i}": value for i, value in enumerate(values)},
        "keys": {value: i for i, value in enumerate(values)},
        "deep": [{"a": [values[-1], {values[0]: values[1:3]}]}],
    }


_EVALUATED = re.compile(r"uid=\d|\b49\b|\b012\b|evaluated-if")


def evaluated(text: str) -> list[str]:
    """What in `text` an evaluated payload would have produced (empty: none)."""
    found = _EVALUATED.findall(text)
    home = os.environ.get("HOME")
    if home and len(home) > 1 and home in text:
        found.append(f"HOME={home}")
    if "/home" in text:  # a run's HOME is <its private data directory>/home
        found.append("a run's HOME")
    return found
