"""A fake service for the broker's own tests: its "cloud" is a folder of files, one per
resource, named by the instance or binding id (the tag a real service puts on what it builds).

It behaves like a real service where the broker's correctness depends on it: every pass looks
up before it creates (so a re-run after a crash finds what a dead pass built), a provision takes
several passes (``parameters.steps``), a pass can be slow (``parameters.sleep``: seconds, so a
test can SIGKILL the broker in the middle; ``sleep_after`` once the resource exists,
``deprovision_sleep``, a binding's ``unbind_sleep``) and can fail (``parameters.fail``). The
folder's ``journal`` has a line per create and delete (``create``/``delete`` of an instance,
``create-binding``/``delete-binding``) and per provision pass.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from scoperouter.broker.contract import (
    CatalogEntry,
    Done,
    Failed,
    Found,
    InstanceLookup,
    InstanceView,
    InvalidParameters,
    OperationContext,
    OperationKind,
    Outcome,
    Pending,
    PlanEntry,
    Schemas,
    Service,
)

SERVICE_ID = "8c1f4b1e-fake-4c43-9f0e-000000000001"
PLAN_ID = "8c1f4b1e-fake-4c43-9f0e-000000000002"
PLAN2_ID = "8c1f4b1e-fake-4c43-9f0e-000000000003"

CREATE_SCHEMA = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "steps": {"type": "integer", "minimum": 1, "maximum": 100},
        "sleep": {"type": "number", "minimum": 0},
        "fail": {"type": "boolean"},
        "size": {"type": "integer", "minimum": 1},
        "name": {"type": "string", "maxLength": 20},
        "sleep_after": {"type": "number", "minimum": 0},
        "deprovision_sleep": {"type": "number", "minimum": 0},
    },
}
UPDATE_SCHEMA = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "type": "object",
    "properties": {"size": {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}
BIND_SCHEMA = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "type": "object",
    "properties": {
        "peer": {"type": "string"},
        "sleep": {"type": "number", "minimum": 0},
        "sleep_after": {"type": "number", "minimum": 0},
        "unbind_sleep": {"type": "number", "minimum": 0},
        "fail": {"type": "boolean"},
    },
    "additionalProperties": False,
}


class FakeService(Service):
    name = "fake"

    @property
    def root(self) -> Path:
        path = Path(self.settings["state_dir"])
        path.mkdir(parents=True, exist_ok=True)
        return path

    def catalog(self) -> CatalogEntry:
        # `updatable: false` in its settings: a service that cannot update its instances
        # (no update schema, plans fixed), as openstack-server and openstack-image
        updatable = bool(self.settings.get("updatable", True))
        schemas = Schemas(
            instance_create=CREATE_SCHEMA,
            instance_update=UPDATE_SCHEMA if updatable else None,
            binding_create=BIND_SCHEMA,
        )
        return CatalogEntry(
            id=SERVICE_ID,
            name="fake",
            description="A fake service for the broker's tests",
            bindable=True,
            plan_updateable=updatable,
            binding_rotatable=True,
            allow_context_updates=True,
            plans=(
                PlanEntry(
                    id=PLAN_ID,
                    name="small",
                    description="small",
                    schemas=schemas,
                    maintenance_info={"version": "1.0.0"},
                ),
                PlanEntry(id=PLAN2_ID, name="large", description="large", schemas=schemas),
            ),
        )

    def check_references(
        self,
        kind: OperationKind,
        plan: PlanEntry,
        parameters: Mapping[str, Any],
        *,
        instance: InstanceView | None,
        lookup: InstanceLookup,
    ) -> None:
        """A bind's `peer` names another provisioned instance, in the same "cloud"."""
        peer = parameters.get("peer")
        if kind == "bind" and peer is not None:
            found = lookup(str(peer))
            if found is None or instance is None or found.cloud != instance.cloud:
                raise InvalidParameters("parameters.peer", f"no instance {peer} beside this one")

    def _file(self, kind: str, ident: str) -> Path:
        return self.root / f"{kind}-{ident}"

    def _slow(self, parameters: Mapping[str, Any]) -> None:
        time.sleep(float(parameters.get("sleep", 0)))

    def provision(self, op: OperationContext) -> Outcome:
        params = op.parameters
        step = int(op.progress.get("step", 0))
        steps = int(params.get("steps", 1))
        started = time.time()
        self._slow(params)
        if params.get("fail"):
            return Failed("asked to fail")
        if op.cancelled:
            return Failed("cancelled")
        if op.instance.cloud is None:
            op.set_cloud("FakeCloud")
        path = self._file("instance", op.instance.id)
        if not path.exists():  # look up before create: a re-run finds what a dead run built
            path.write_text(json.dumps({"size": params.get("size", 1), "plan": op.plan.id}))
            self._log("create", op.instance.id)
            time.sleep(float(params.get("sleep_after", 0)))
        op.set_resources(fake_id=f"fake-{op.instance.id}")
        # every pass that got this far, with when it ran and in which process: tests check
        # that no two passes of one operation overlapped and no step ran twice
        self._log("pass", f"{op.instance.id} {step} {os.getpid()} {started:.6f} {time.time():.6f}")
        if step + 1 < steps:
            op.save(step=step + 1)
            return Pending(f"step {step + 1} of {steps}", retry_after=0.01)
        return Done(f"built fake {op.instance.id} in FakeCloud")

    def update(self, op: OperationContext) -> Outcome:
        self._slow(op.parameters)
        path = self._file("instance", op.instance.id)
        kept = {k: v for k, v in self._read(path).items() if k == "bindings"}
        data = {"size": op.parameters.get("size", 1), "plan": op.plan.id, **kept}
        path.write_text(json.dumps(data))
        return Done("updated")

    def deprovision(self, op: OperationContext) -> Outcome:
        """The instance and the credentials of the bindings the platform did not unbind (as
        the real services do: `credentials.revoke_instance`), each named in the instance's
        file by the bind that made it."""
        time.sleep(float(op.instance.parameters.get("deprovision_sleep", 0)))
        path = self._file("instance", op.instance.id)
        for binding_id in self._read(path).get("bindings", []):
            credential = self._file("binding", binding_id)
            if credential.exists():
                credential.unlink()
                self._log("delete-binding", binding_id)
        if path.exists():
            path.unlink()
            self._log("delete", op.instance.id)
        return Done("removed")

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _name_binding(self, instance_id: str, binding_id: str, keep: bool) -> None:
        """Name (or stop naming) a binding in its instance's file: what a real service's tag
        on a credential is (a credential's description names its instance)."""
        path = self._file("instance", instance_id)
        data = self._read(path)
        if not data:
            return
        names = [b for b in data.get("bindings", []) if b != binding_id]
        if keep:
            names.append(binding_id)
        if names:
            data["bindings"] = names
        else:
            data.pop("bindings", None)
        path.write_text(json.dumps(data))

    def bind(self, op: OperationContext) -> Outcome:
        assert op.binding is not None
        self._slow(op.parameters)
        if op.parameters.get("fail"):
            return Failed("asked to fail")
        path = self._file("binding", op.binding.id)
        if path.exists():  # a dead pass made one whose secret is lost: replace it
            path.unlink()
            self._log("delete-binding", op.binding.id)
        self._name_binding(op.instance.id, op.binding.id, True)  # before it exists
        secret = secrets.token_hex(16)
        path.write_text(secret)
        self._log("create-binding", op.binding.id)
        time.sleep(float(op.parameters.get("sleep_after", 0)))
        op.set_resources(credential_id=f"cred-{op.binding.id}")
        return Done(
            "bound",
            {"credentials": {"username": op.binding.id, "password": secret}},
        )

    def unbind(self, op: OperationContext) -> Outcome:
        assert op.binding is not None
        time.sleep(float(op.parameters.get("unbind_sleep", 0)))
        path = self._file("binding", op.binding.id)
        if path.exists():
            path.unlink()
            self._log("delete-binding", op.binding.id)
        self._name_binding(op.instance.id, op.binding.id, False)
        return Done("unbound")

    def inventory_clouds(self) -> list[str]:
        """FakeCloud, plus every cloud a test marked unreachable with a `down-<cloud>` file."""
        down = sorted(p.name[len("down-") :] for p in self.root.glob("down-*"))
        return ["FakeCloud", *(c for c in down if c != "FakeCloud")]

    def inventory(self, cloud: str) -> Iterable[Found]:
        if (self.root / f"down-{cloud}").exists():
            raise ConnectionError(f"{cloud} unreachable")
        if cloud != "FakeCloud":
            return
        for path in sorted(self.root.glob("instance-*")):
            ident = path.name[len("instance-") :]
            yield Found(cloud="FakeCloud", kind="fake", id=f"fake-{ident}", instance_id=ident)
        for path in sorted(self.root.glob("binding-*")):
            ident = path.name[len("binding-") :]
            yield Found(
                cloud="FakeCloud",
                kind="credential",
                id=f"cred-{ident}",
                instance_id=None,
                binding_id=ident,
            )

    def _log(self, what: str, ident: str) -> None:
        with (self.root / "journal").open("a") as f:
            f.write(f"{what} {ident}\n")


def journal(state_dir: Path) -> list[str]:
    path = state_dir / "journal"
    return path.read_text().splitlines() if path.exists() else []
