"""The service that runs a pack (docs/broker/ansible-packs.md).

Each operation is one pass that runs the action's playbook to its end (the worker renews the
lease meanwhile; the description shows the running task). What makes it safe to run again:

- **Where**: the first pass chooses the cloud (the `where` parameter or the pack's default:
  one cloud, a scope, or the most free) and the keystone project (the platform space's in that
  cloud, as for servers), and records both before any playbook runs; a re-run uses them.
- **Convergence**: a pass killed with its broker (the playbook with it) is run again from the
  start by the next worker once the lease expired: the pack's playbooks name (or tag) what they
  build after the instance (``osb_name``, ``osb_tags``), so the re-run finds it instead of
  building it twice. A provision that got a DELETE stops its playbook; the deprovision then
  runs once the provision's pass has ended (the worker runs an instance's operations in
  order) and removes what was built, by the same names.
- **Results**: ``set_stats`` of a provision or update become the instance's metadata (GET,
  ``metadata.attributes``), except ``osb_secrets``, kept encrypted for later runs (a generated
  private key); of a bind, the binding's credentials (with the broker-issued application
  credential when the pack asks for one).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from scoperouter.broker import credentials
from scoperouter.broker.config import BrokerConfigError
from scoperouter.broker.openstack_helpers import instance_tag
from scoperouter.broker.services import placed
from scoperouter.broker.services.ansible import sandbox
from scoperouter.broker.services.ansible.pack import Pack, load_pack
from scoperouter.broker.services.ansible.playbook import (
    Playbooks,
    RunResult,
    RunSpec,
    Scrubber,
    marker,
)
from scoperouter.broker.services.base import (
    Clouds,
    Done,
    Failed,
    Found,
    OperationContext,
    Outcome,
    Pending,
)

SECRETS_KEY = "osb_secrets"  # in set_stats: kept encrypted, never in metadata
RESERVED = ("cloud", "project_id", "scope")  # instance metadata the broker sets
RETRY_SECONDS = 10.0
BROKER_TAG = "osb"

log = logging.getLogger("scoperouter.broker.ansible")


def service_class(name: str) -> type[AnsibleService]:
    """The Service class of the pack enabled as `name` (a subclass per pack: the service
    name is a class attribute of the contract)."""
    return type(f"AnsibleService[{name}]", (AnsibleService,), {"name": name})


def default_work_dir(name: str) -> Path:
    return Path(tempfile.gettempdir()) / f"scoperouter-broker-{os.getuid()}" / "ansible" / name


class AnsibleService(placed.PlacedService):
    """A pack (``settings["pack"]``: its directory) as a broker service."""

    name: ClassVar[str] = "ansible"

    def __init__(self, settings: Mapping[str, Any], clouds: Clouds) -> None:
        super().__init__(settings, clouds)
        if not settings.get("pack"):
            raise BrokerConfigError(f"services.{self.name}: pack: the pack's directory")
        self.pack: Pack = load_pack(Path(str(settings["pack"])))
        if self.pack.name != self.name:
            raise BrokerConfigError(
                f"services.{self.name}: the pack in {settings['pack']} is "
                f"{self.pack.name!r}: enable it under that name"
            )
        self.pack.check_clouds(clouds.names())
        self.placement = self.pack.spec.placement
        self._catalog = self.pack.catalog(clouds.names())
        where = f"services.{self.name}"
        self.playbooks = Playbooks(
            Path(str(settings.get("work_dir") or default_work_dir(self.name))),
            ansible_playbook=settings.get("ansible_playbook"),
            collections_path=settings.get("collections_path"),
            env=sandbox.run_env(settings.get("env"), f"{where}.env"),
            run_as=sandbox.run_as(settings.get("run_as"), where),
            sandbox=sandbox.sandbox(settings, where),
        )
        who = self.playbooks.run_as
        log.info(
            "%s: playbooks run as %s, %s",
            where,
            f"{who.name} (uid {who.uid})" if who else f"the broker's user (uid {os.geteuid()})",
            "in bwrap" if self.playbooks.sandbox else "without a sandbox",
        )
        self.policy = credentials.CredentialPolicy(
            roles=tuple(self.pack.spec.binding.roles or ("member",)),
            lifetime=self.pack.spec.binding.lifetime,
            access_rules=self.pack.spec.binding.access_rules,
        )

    # ------------------------------------------------------------------------ catalog

    # ------------------------------------------------------------------------ passes

    def provision(self, op: OperationContext) -> Outcome:
        if op.cancelled:
            return Failed("stopped: a deprovision request arrived; it removes what was built")
        target = placed.choose(
            op, self.pack.spec.placement, self.pack.spec.project, op.plan.settings.get("demand")
        )
        if isinstance(target, Failed | Pending):
            return target
        result = self._run(op, "provision", target)
        if not result.ok:
            return self._failed(op, "provision", result, target)
        self._publish(op, result.stats)
        return Done(self._done_text("provision", target, result))

    def update(self, op: OperationContext) -> Outcome:
        target = placed.recorded(op)
        if target is None:
            return Failed("the instance has nothing to update (it was not provisioned)")
        result = self._run(op, "update", target)
        if not result.ok:
            return self._failed(op, "update", result, target)
        self._publish(op, result.stats)
        return Done(self._done_text("update", target, result))

    def deprovision(self, op: OperationContext) -> Outcome:
        target = placed.recorded(op)
        if target is None:
            return Done("nothing was built")
        result = self._run(op, "deprovision", target)
        if not result.ok:
            return self._failed(op, "deprovision", result, target)
        text = self._done_text("deprovision", target, result)
        if self.pack.spec.binding.credential:
            revoked = credentials.revoke_instance(op)
            if revoked:
                text += f"; {revoked} binding credential(s) revoked"
        return Done(text)

    def bind(self, op: OperationContext) -> Outcome:
        assert op.binding is not None
        target = placed.recorded(op)
        if target is None:
            return Failed("the instance has nothing to bind to (it was not provisioned)")
        if op.cancelled:
            return Failed("stopped: an unbind request arrived")
        issued: dict[str, Any] = {}
        if self.pack.spec.binding.credential:
            outcome = credentials.issue(
                op,
                cloud=target["cloud"],
                project_id=target["project_id"],
                policy=self._policy(op, target),
                scope=json.loads(target["scope"]) if target.get("scope") else None,
            )
            issued = dict(outcome.result or {})
        result = self._run(op, "bind", target, credential=issued.get("credentials"))
        if not result.ok:
            if issued:
                credentials.revoke(op)  # the binding failed: its credential goes with it
            return self._failed(op, "bind", result, target)
        stats = {k: v for k, v in result.stats.items() if k != SECRETS_KEY}
        merged = {**(issued.get("credentials") or {}), **stats}
        extra: dict[str, Any] = {
            k: issued[k] for k in ("expires_at", "renew_before") if k in issued
        }
        return Done(self._done_text("bind", target, result), {"credentials": merged, **extra})

    def unbind(self, op: OperationContext) -> Outcome:
        target = placed.recorded(op)
        if target is None:
            return Done("nothing was built")
        result = self._run(op, "unbind", target)
        if not result.ok:
            return self._failed(op, "unbind", result, target)
        text = self._done_text("unbind", target, result)
        if self.pack.spec.binding.credential:
            text += "; " + credentials.revoke(op).description
        return Done(text)

    def inventory_clouds(self) -> list[str]:
        """Packs have no inventory (what a playbook built is the pack's to know): `broker
        repair` does not check them."""
        return []

    def inventory(self, cloud: str) -> Iterable[Found]:
        return ()

    # ------------------------------------------------------------------------ helpers

    def _policy(
        self, op: OperationContext, target: Mapping[str, Any]
    ) -> credentials.CredentialPolicy:
        """The pack's credential policy, its access rules filled in with the instance's
        metadata (``{project_id}``, ``{container}``...)."""
        if not self.policy.access_rules:
            return self.policy
        values = {**op.instance.resources, **target}
        rules = tuple(
            {key: str(value).format_map(values) for key, value in rule.items()}
            for rule in self.policy.access_rules
        )
        return credentials.CredentialPolicy(
            roles=self.policy.roles, lifetime=self.policy.lifetime, access_rules=rules
        )

    def _run(
        self,
        op: OperationContext,
        action: str,
        target: Mapping[str, Any],
        *,
        credential: Mapping[str, Any] | None = None,
    ) -> RunResult:
        cloud = str(target["cloud"])
        project_id = target.get("project_id")
        scope = target.get("scope")
        entry = op.clouds.session_entry(cloud, project_id=project_id, scope=scope)
        endpoints = op.clouds.endpoints(cloud, project_id=project_id, scope=scope)
        kept = dict(op.secrets)
        scrub = Scrubber([entry.get("auth", {}).get("token"), kept])
        secret_names = self.pack.secret_names()
        for values in (op.parameters, op.instance.parameters):
            scrub.add(*(v for k, v in values.items() if k in secret_names))
        playbook = self.pack.playbooks[action]
        timeout = (op.deadline.replace(tzinfo=None) - _utcnow()).total_seconds()
        if timeout <= 1:
            return RunResult(status="timeout", rc=None, failure="no time left before the deadline")
        op.log.info("%s: running %s in %s", op.operation_id, playbook, cloud)
        plan_vars = dict(op.plan.settings.get("vars") or {})
        spec = RunSpec(
            run_id=op.operation_id,
            marker=marker(op.instance.id),
            project_dir=self.pack.directory,
            playbook=playbook,
            extravars={
                **plan_vars,
                **self._extravars(op, cloud, target, credential, kept),
                "osb_endpoints": endpoints,
            },
            clouds_yaml={"clouds": {"osb": entry}},
            timeout=timeout,
            scrub=scrub,
            cancelled=lambda: op.stopping,
            on_task=lambda task: op.describe(f"{action}: running {playbook} in {cloud}: {task}"),
        )
        result = self.playbooks.run(spec)
        op.log.info(
            "%s: %s %s (%d task(s), %d changed)",
            op.operation_id,
            playbook,
            result.status,
            result.tasks,
            result.changed,
        )
        return result

    def _extravars(
        self,
        op: OperationContext,
        cloud: str,
        target: Mapping[str, Any],
        credential: Mapping[str, Any] | None,
        kept: Mapping[str, Any],
    ) -> dict[str, Any]:
        """What every playbook gets (docs/broker/ansible-packs.md, "Variables")."""
        instance_id = op.instance.id
        out: dict[str, Any] = {
            "osb_instance_id": instance_id,
            "osb_service": self.name,
            "osb_plan": op.plan.name,
            "osb_plan_id": op.plan.id,
            "osb_operation": op.kind,
            "osb_cloud": cloud,
            "osb_region": op.clouds.region(cloud),
            "osb_project_id": target.get("project_id"),
            "osb_scope": json.loads(target["scope"]) if target.get("scope") else None,
            "osb_name": f"osb-{instance_id}",
            "osb_tags": [BROKER_TAG, instance_tag(instance_id)],
            "osb_parameters": dict(op.parameters if op.binding is None else op.instance.parameters),
            "osb_context": dict(op.context),
            "osb_instance": dict(op.instance.resources),
            "osb_secrets": dict(kept),
        }
        if op.kind == "update":
            out["osb_previous_parameters"] = dict(op.instance.parameters)
        if op.binding is not None:
            out.update(
                {
                    "osb_binding_id": op.binding.id,
                    "osb_binding_name": f"osb-{op.binding.id}",
                    "osb_binding_parameters": dict(op.binding.parameters),
                    "osb_binding": dict(op.binding.resources),
                }
            )
            if credential:
                out["osb_credential"] = {
                    "id": credential.get("application_credential_id"),
                    "user_id": op.binding.resources.get("user_id"),
                    "project_id": credential.get("project_id"),
                }
        return out

    def _publish(self, op: OperationContext, stats: Mapping[str, Any]) -> None:
        """A provision's or update's set_stats: metadata, and osb_secrets kept encrypted."""
        secrets = stats.get(SECRETS_KEY)
        if isinstance(secrets, Mapping) and secrets:
            op.keep_secrets(**secrets)
        public = {k: v for k, v in stats.items() if k != SECRETS_KEY and k not in RESERVED}
        dropped = sorted(k for k in stats if k in RESERVED)
        if dropped:
            op.log.warning("set_stats keys %s are the broker's: ignored", ", ".join(dropped))
        if public:
            op.set_resources(**public)

    def _failed(
        self, op: OperationContext, action: str, result: RunResult, target: Mapping[str, Any]
    ) -> Outcome:
        playbook = self.pack.playbooks[action]
        cloud = target["cloud"]
        if result.status == "canceled":
            what = "a delete request arrived" if op.cancelled else "the lease was lost"
            return Failed(f"stopped: {what} while {playbook} ran in {cloud}")
        if result.status == "timeout":
            return Failed(
                f"{playbook} did not finish in {cloud} before the operation's deadline"
                + (f" ({result.failure})" if result.failure else "")
            )
        why = result.failure or f"ansible-playbook ended with {result.status} (rc {result.rc})"
        failures = int(op.progress.get("failures", 0))
        if failures < self.pack.spec.retries:
            op.save(failures=failures + 1)
            return Pending(
                f"{playbook} failed in {cloud} ({why}); trying again "
                f"({failures + 1} of {self.pack.spec.retries})",
                RETRY_SECONDS * (failures + 1),
            )
        return Failed(f"{playbook} failed in {cloud}: {why}")

    def _done_text(self, action: str, target: Mapping[str, Any], result: RunResult) -> str:
        return (
            f"{self.pack.playbooks[action]} succeeded in {placed.describe(target)}: "
            f"{result.tasks} task(s), {result.changed} changed"
        )


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)
