"""The example packs shipped in broker-packs/ (a server with its own key pair and security
group; an object storage container with a per-binding credential): they load and make valid
catalogs, their playbooks pass ``ansible-playbook --syntax-check`` with the openstack.cloud
collection, every task gives its module only options the module has (``ansible-doc``), and
ansible-lint's production profile passes (with ``-m deploy``: ansible-lint lives in the
operator's virtualenv, .venv-deploy, whose pins clash with the broker's).

Their end-to-end tests against the lab wait for the lab's swift, neutron security groups and
cinder (docs/broker/ansible-packs.md says so)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.broker.runtime import compile_schema
from scoperouter.broker.services.ansible.pack import load_pack

ROOT = Path(__file__).resolve().parents[2]
PACKS = sorted(p for p in (ROOT / "broker-packs").iterdir() if (p / "service.yml").exists())
CLOUDS = ("CloudOne", "CloudTwo")
BIN = Path(sys.executable).parent


def _collections_path() -> str:
    """Where the openstack.cloud collection is installed (the `ansible` package's
    ansible_collections, in this Python's site-packages)."""
    import ansible_collections  # type: ignore[import-not-found]

    return str(Path(next(iter(ansible_collections.__path__))).parent)


def test_there_are_the_two_example_packs() -> None:
    assert [p.name for p in PACKS] == ["openstack-object-storage", "openstack-server-keypair"]


@pytest.mark.parametrize("directory", PACKS, ids=lambda p: p.name)
def test_an_example_pack_loads_and_makes_a_valid_catalog(directory: Path) -> None:
    pack = load_pack(directory)
    assert pack.name == directory.name
    pack.check_clouds(CLOUDS)
    entry = pack.catalog(CLOUDS)
    assert entry.bindable and entry.plans
    for plan in entry.plans:
        for which in ("instance_create", "instance_update", "binding_create"):
            schema = getattr(plan.schemas, which)
            if schema is not None:
                compile_schema(schema, f"{pack.name} {plan.name} {which}")
    assert set(pack.playbooks) == {"provision", "update", "deprovision", "bind", "unbind"}


@pytest.mark.parametrize("directory", PACKS, ids=lambda p: p.name)
def test_an_example_pack_s_playbooks_pass_syntax_check(directory: Path) -> None:
    pack = load_pack(directory)
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
         *sorted(pack.playbooks.values())],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    """Every task of a playbook (blocks included)."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            if key in node:
                yield from _tasks(node[key])
        if "hosts" not in node and not any(k in node for k in ("block", "rescue", "always")):
            yield node


TASK_KEYWORDS = {
    "name", "when", "register", "loop", "loop_control", "no_log", "changed_when",
    "failed_when", "vars", "tags", "notify", "until", "retries", "delay", "become",
}  # fmt: skip


def test_every_task_of_the_example_packs_uses_options_its_module_has() -> None:
    """What ansible-lint's args rule cannot check without openstacksdk in its environment:
    each task's arguments against its module's documented options and aliases."""
    uses: list[tuple[str, str, str, set[str]]] = []
    for directory in PACKS:
        for playbook in sorted(directory.glob("*.yml")):
            if playbook.name == "service.yml":
                continue
            for task in _tasks(yaml.safe_load(playbook.read_text())):
                [module] = [k for k in task if k not in TASK_KEYWORDS]
                args = task[module] if isinstance(task[module], dict) else {}
                uses.append((f"{directory.name}/{playbook.name}", task["name"], module, set(args)))
    modules = sorted({module for _, _, module, _ in uses})
    done = subprocess.run(
        [str(BIN / "ansible-doc"), "--json", *modules],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )
    assert done.returncode == 0, done.stderr
    docs = json.loads(done.stdout)
    for where, name, module, args in uses:
        options = docs[module]["doc"].get("options") or {}
        known = set(options)
        for option in options.values():
            known.update(option.get("aliases") or ())
        if module.endswith(".set_stats"):
            known.update({"data", "per_host", "aggregate"})
        unknown = args - known
        assert not unknown, f"{where}: task {name!r}: {module} has no option {sorted(unknown)}"


def _ansible_lint() -> str | None:
    for candidate in (ROOT / ".venv-deploy" / "bin" / "ansible-lint", shutil.which("ansible-lint")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    return None


@pytest.mark.deploy
def test_the_example_packs_pass_ansible_lint_production() -> None:
    lint = _ansible_lint()
    if lint is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: ansible-lint not found (.venv-deploy: playbooks/requirements.txt)")
        pytest.skip("ansible-lint not installed (.venv-deploy: playbooks/requirements.txt)")
    done = subprocess.run(
        [lint, "--profile", "production", "--nocolor", *(p.name for p in PACKS)],
        cwd=ROOT / "broker-packs",
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": _collections_path()},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
