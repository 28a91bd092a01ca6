"""``openstack-server``: a nova server in the cloud the placement strategy picks, booted from an
image of any cloud of the federation, reached through the routers.

Plans map to flavors (the ``flavor`` setting of each plan in the broker config). Parameters:

- ``image`` (required): a name or id; looked up through the routers from the candidate cloud,
  in that cloud first, then in the others (config order): when it lives elsewhere, the broker
  enters the compute cloud with the scope ``{"image": <its cloud>}`` and nova fetches it through
  the routers, exactly as ``openstack --os-scope`` would.
- ``where`` (optional, default ``{"strategy": "most-free"}``): ``{"cloud": NAME}``,
  ``{"scope": {"compute": NAME, ...}}`` or ``{"strategy": "most-free" | "spread"}``
  (:mod:`scoperouter.broker.placement`).
- ``key_name``: a key pair of the broker's user in the chosen cloud; ``user_data``: text
  (cloud-init), base64-encoded by the broker.

Provision is a sequence of short passes (docs/broker.md): choose and save the candidates, then
for the current candidate ensure the instance's project there, find the server tagged with the
instance id or create it, and poll it to ACTIVE with ``Pending``. A refusal (a 4xx answer to the
create: quota, a flavor too big for the image, a missing key pair; or the server going to ERROR:
no valid host) deletes that server and moves on to the next candidate; the final description
says where the server went and why the other clouds did not take it.

Every server carries the tags ``<tag>`` (the broker's, ``osb`` by default: ``spread`` counts
them) and ``osb-instance-<instance id>`` plus the metadata ``osb_instance_id``; a pass looks the
server up by tag before creating one, so a pass re-run after a crash never makes a second
server, and deprovision removes whatever carries the instance's tag in every cloud (also what a
cancelled or refused attempt left). Listing servers across projects by tag needs nova's admin
policy for the broker's account (what it has in the lab; the sample config says so).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from scoperouter.broker import credentials, placement
from scoperouter.broker.contract import (
    DRAFT4,
    CatalogEntry,
    Clouds,
    Done,
    Failed,
    Found,
    InvalidParameters,
    OperationContext,
    OperationKind,
    Outcome,
    Pending,
    PlanEntry,
    Service,
)
from scoperouter.broker.offerings import IMAGE_REF, offering
from scoperouter.broker.openstack_helpers import (
    DEFAULT_BROKER_TAG,
    METADATA_KEY,
    bind_credentials,
    error_text,
    find_image,
    instance_tag,
    refusal,
    short,
    space_project,
)
from scoperouter.scope import CloudName, Scope

if TYPE_CHECKING:
    from openstack.compute.v2.server import Server
    from openstack.connection import Connection

# nova: user_data is base64 of at most 65535 bytes -> 49149 bytes of text
MAX_USER_DATA_BYTES = 49149
TRANSIENT_RETRIES = 3  # transient errors (5xx, network) tolerated per candidate before moving on
POLL_SECONDS = 2.0
RETRY_SECONDS = 15.0  # no cloud could be asked: ask again this much later


# ------------------------------------------------------------------------ the service


class ImageNotVisible(LookupError):
    """No candidate copy of the image; `transient`: a lookup failed (rather than answered)."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True, slots=True)
class Target:
    """One candidate, resolved: where to enter, with which scope, which flavor and image."""

    cloud: str
    scope: str | None  # JSON text; None: every service in `cloud`
    flavor_id: str
    image_id: str
    image_cloud: str

    def as_progress(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "scope": self.scope,
            "flavor_id": self.flavor_id,
            "image_id": self.image_id,
            "image_cloud": self.image_cloud,
        }

    @classmethod
    def from_progress(cls, data: Mapping[str, Any]) -> Target:
        return cls(
            cloud=data["cloud"],
            scope=data.get("scope"),
            flavor_id=data["flavor_id"],
            image_id=data["image_id"],
            image_cloud=data["image_cloud"],
        )


class ServerService(Service):
    """``openstack-server`` (see the module docstring)."""

    name: ClassVar[str] = "openstack-server"

    def __init__(self, settings: Mapping[str, Any], clouds: Clouds) -> None:
        super().__init__(settings, clouds)
        self.broker_tag = str(settings.get("tag", DEFAULT_BROKER_TAG))
        self.networks = settings.get("networks", "auto")
        if not (self.networks in ("auto", "none") or isinstance(self.networks, list)):
            raise ValueError(
                f"{self.name}: networks: expected auto, none or a list of nova network "
                f"objects, got {self.networks!r}"
            )
        self._catalog = offering(
            self.name,
            settings,
            self.parameters_schema(),
            description="An OpenStack server in the cloud of the federation that fits best, "
            "booted from an image of any of its clouds",
            display_name="OpenStack server (federation)",
            tags=("openstack", "compute", "server"),
            required=("flavor",),
        )

    # ------------------------------------------------------------------------- catalog

    def catalog(self) -> CatalogEntry:
        return self._catalog

    def parameters_schema(self) -> dict[str, Any]:
        clouds = list(self.clouds.names())
        return {
            "$schema": DRAFT4,
            "type": "object",
            "additionalProperties": False,
            "required": ["image"],
            "properties": {
                "image": {**IMAGE_REF, "description": "name or id, in any cloud of the federation"},
                "where": {
                    "type": "object",
                    "description": "where the server goes: one of cloud, scope, strategy "
                    "(default: strategy most-free)",
                    "minProperties": 1,
                    "maxProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        "cloud": {"type": "string", "enum": clouds},
                        "scope": {
                            "type": "object",
                            "required": ["compute"],
                            "additionalProperties": {"type": "string", "enum": clouds},
                        },
                        "strategy": {"type": "string", "enum": list(placement.STRATEGIES)},
                    },
                },
                "key_name": {"type": "string", "minLength": 1, "maxLength": 255},
                "user_data": {"type": "string", "maxLength": MAX_USER_DATA_BYTES},
            },
        }

    def validate(self, kind: OperationKind, plan: PlanEntry, parameters: Mapping[str, Any]) -> None:
        if kind not in ("provision", "update"):
            return
        try:
            placement.parse_where(parameters.get("where"), self.clouds.names())
        except placement.PlacementError as exc:
            raise InvalidParameters(f"parameters.{exc.field}", exc.message) from None
        user_data = parameters.get("user_data")
        if isinstance(user_data, str) and len(user_data.encode()) > MAX_USER_DATA_BYTES:
            raise InvalidParameters(
                "parameters.user_data", f"longer than {MAX_USER_DATA_BYTES} bytes (UTF-8)"
            )

    # ----------------------------------------------------------------------- provision

    def provision(self, op: OperationContext) -> Outcome:
        if op.cancelled:
            return Failed("stopped: a deprovision request arrived; it removes what was built")
        if "targets" not in op.progress:
            chosen = self._choose(op)
            if isinstance(chosen, Failed | Pending):
                return chosen
            op.save(targets=chosen[0], excluded=chosen[1], attempt=0, refused=[], transient=0)
        while True:
            attempt = int(op.progress["attempt"])
            targets = [Target.from_progress(t) for t in op.progress["targets"]]
            if attempt >= len(targets):
                return Failed("no cloud took the server: " + self._why_not(op))
            outcome = self._attempt(op, targets[attempt])
            if outcome is not None:
                return outcome
            # the candidate refused and the next one is up: go on in this pass

    def _choose(self, op: OperationContext) -> tuple[list[dict[str, Any]], str] | Failed | Pending:
        """Rank the clouds and resolve flavor and image for each candidate. No candidate while
        a cloud could not be asked (an error, not an answer): Pending, to ask again (until the
        operation's deadline), rather than failing on a cloud's bad minute."""
        names = op.clouds.names()
        strategy = placement.parse_where(op.parameters.get("where"), names)
        flavor_name = str(op.plan.settings["flavor"])
        image_ref = str(op.parameters["image"])
        if isinstance(strategy, placement.Explicit | placement.Scoped):
            considered: Sequence[str] = (strategy.cloud,)
        else:
            considered = names
        snapshots: dict[str, placement.Snapshot] = {}
        demands: dict[str, placement.Demand] = {}
        flavors: dict[str, str] = {}
        unreachable: set[str] = set()  # excluded by an error rather than by an answer
        for cloud in considered:
            try:
                capacity = op.clouds.capacity(cloud)
                flavor = op.clouds.connect(cloud).compute.find_flavor(
                    flavor_name, ignore_missing=True
                )
            except Exception as exc:
                snapshots[cloud] = placement.Unavailable(cloud, error_text(exc))
                unreachable.add(cloud)
                continue
            if flavor is None:
                snapshots[cloud] = placement.Unavailable(cloud, f"no flavor {flavor_name!r}")
                continue
            snapshots[cloud] = capacity
            flavors[cloud] = flavor.id
            demands[cloud] = placement.Demand.of_flavor(
                vcpus=flavor.vcpus,
                ram_mb=flavor.ram,
                disk_gb=flavor.disk,
                ephemeral_gb=flavor.ephemeral or 0,
                swap_mb=int(flavor.swap or 0),
            )
        placed = (
            self._placed(op.clouds, snapshots, unreachable)
            if isinstance(strategy, placement.Spread)
            else {}
        )
        ranking = placement.rank(snapshots, strategy, demands, placed)
        excluded = [f"{u.cloud}: {u.reason}" for u in ranking.excluded]
        targets = []
        for candidate in ranking.candidates:
            try:
                target = self._resolve_image(
                    op.clouds, candidate, image_ref, flavors[candidate.cloud]
                )
            except ImageNotVisible as exc:
                excluded.append(f"{candidate.cloud}: {exc}")
                if exc.transient:
                    unreachable.add(candidate.cloud)
                continue
            targets.append(target.as_progress())
        why = "; ".join(excluded)
        if not targets and unreachable:
            return Pending(f"no cloud can take the server now ({why}); asking again", RETRY_SECONDS)
        if not targets:
            return Failed("no cloud can take the server: " + (why or "no cloud is configured"))
        op.log.info("candidates for %s: %s", op.instance.id, ", ".join(t["cloud"] for t in targets))
        return targets, why

    def _placed(
        self, clouds: Clouds, snapshots: dict[str, placement.Snapshot], unreachable: set[str]
    ) -> dict[str, int]:
        """Servers of this broker in each cloud (``spread``); a cloud where they cannot be
        counted is marked unavailable (and unreachable)."""
        placed: dict[str, int] = {}
        for cloud, snapshot in list(snapshots.items()):
            if isinstance(snapshot, placement.Unavailable):
                continue
            try:
                placed[cloud] = sum(1 for _ in _tagged(clouds, cloud, self.broker_tag))
            except Exception as exc:
                reason = f"cannot count its servers: {error_text(exc)}"
                snapshots[cloud] = placement.Unavailable(cloud, reason)
                unreachable.add(cloud)
        return placed

    def _resolve_image(
        self, clouds: Clouds, candidate: placement.Candidate, ref: str, flavor_id: str
    ) -> Target:
        """Find the image as nova in `candidate.cloud` will: through its router, with the scope
        that sends image calls to the cloud holding it (the candidate's own first)."""
        cloud = candidate.cloud
        if candidate.scope is not None:  # the scope says where the image is
            image_cloud = _cloud_of(candidate.scope, "image", cloud)
            search: list[tuple[str, str | None]] = [(image_cloud, candidate.scope.to_json())]
        else:
            others = [c for c in clouds.names() if c != cloud]
            search = [(cloud, None)] + [(c, _scope_json(image=c)) for c in others]
        problems = []
        failed = False
        for image_cloud, scope in search:
            try:
                image = find_image(clouds.connect(cloud, scope=scope), ref)
            except ValueError as exc:
                problems.append(f"{image_cloud}: {exc}")
                continue
            except Exception as exc:
                problems.append(f"{image_cloud}: image lookup failed: {error_text(exc)}")
                failed = True
                continue
            if image is not None:
                return Target(cloud, scope, flavor_id, str(image.id), image_cloud)
        looked = ", ".join(c for c, _ in search)
        detail = f" ({'; '.join(problems)})" if problems else ""
        raise ImageNotVisible(
            f"no active image {ref!r} visible from it (looked in {looked}){detail}", failed
        )

    def _attempt(self, op: OperationContext, target: Target) -> Outcome | None:
        """One step with the current candidate: an Outcome, or None when it refused (the
        refusal is saved and the attempt counter moved on)."""
        pending = op.progress.get("refusing")
        if pending:  # a refused server whose delete a dead pass may not have sent
            _delete(op.clouds, target.cloud, pending["server_id"], pending.get("project_id"))
            return self._refused(op, target, pending["reason"])
        try:
            project_id = space_project(op, target.cloud)
            conn = op.clouds.connect(target.cloud, project_id=project_id, scope=target.scope)
            # the id saved by an earlier pass, else a look-up by tag (a pass that died between
            # the create and its save), else a new server
            known = op.progress.get("server_id")
            server = _get_server(conn, known) if known else None
            if server is None:
                server = self._find(conn, op.instance.id)
                if server is not None:
                    op.save(server_id=server.id, project_id=project_id)
            if server is None:
                if op.cancelled:
                    return Failed("stopped: a deprovision request arrived")
                server = conn.compute.create_server(**self._server_body(op, target))
                op.log.info("created server %s in %s", server.id, target.cloud)
                op.save(server_id=server.id, project_id=project_id)
                return Pending(f"creating server {server.id} in {target.cloud}", POLL_SECONDS)
        except Exception as exc:
            reason = refusal(exc)
            if reason is None:
                return self._transient(op, target, exc)
            key_name = op.parameters.get("key_name")
            if key_name and "key_name" in reason:  # nova's 400 does not name the key pair
                reason = (
                    f"key pair {key_name!r} is not the broker user's in {target.cloud} ({reason})"
                )
            return self._refused(op, target, reason)
        if server.status == "ACTIVE":
            return self._active(op, target, project_id, server)
        if server.status == "ERROR":
            fault = (server.fault or {}).get("message") or "the server went to ERROR"
            op.save(refusing={"server_id": server.id, "project_id": project_id, "reason": fault})
            _delete(op.clouds, target.cloud, server.id, project_id)
            return self._refused(op, target, short(fault))
        return Pending(
            f"server {server.id} is {server.status} in {target.cloud}{self._image_note(target)}",
            POLL_SECONDS,
        )

    def _server_body(self, op: OperationContext, target: Target) -> dict[str, Any]:
        params = op.parameters
        body: dict[str, Any] = {
            "name": f"osb-{op.instance.id}"[:255],
            "flavor_id": target.flavor_id,
            "image_id": target.image_id,
            "networks": self.networks,
            "tags": [self.broker_tag, instance_tag(op.instance.id)],
            "metadata": {METADATA_KEY: op.instance.id[:255]},
        }
        if params.get("key_name"):
            body["key_name"] = params["key_name"]
        if params.get("user_data"):
            body["user_data"] = base64.b64encode(params["user_data"].encode()).decode()
        return body

    def _active(
        self, op: OperationContext, target: Target, project_id: str, server: Server
    ) -> Outcome:
        op.set_cloud(target.cloud)
        op.set_resources(
            cloud=target.cloud,
            project_id=project_id,
            server_id=server.id,
            image_id=target.image_id,
            image_cloud=target.image_cloud,
            scope=target.scope,
        )
        text = f"server {server.id} is ACTIVE in {target.cloud}{self._image_note(target)}"
        why = self._why_not(op)
        return Done(f"{text}; {why}" if why else text)

    def _refused(self, op: OperationContext, target: Target, reason: str) -> Outcome | None:
        """Record that `target` refused and move on to the next candidate (None: go on)."""
        refused = [*op.progress.get("refused", []), f"{target.cloud} refused it: {reason}"]
        op.log.info("%s refused %s: %s", target.cloud, op.instance.id, reason)
        op.save(
            refused=refused,
            attempt=int(op.progress["attempt"]) + 1,
            refusing=None,
            server_id=None,
            transient=0,
        )
        return None

    def _transient(
        self, op: OperationContext, target: Target, exc: BaseException
    ) -> Outcome | None:
        count = int(op.progress.get("transient", 0)) + 1
        text = error_text(exc)
        if count > TRANSIENT_RETRIES:
            return self._refused(op, target, f"kept failing: {text}")
        op.save(transient=count)
        op.log.warning("%s: transient error (%d): %s", target.cloud, count, text)
        return Pending(f"{target.cloud} failed ({text}); trying again", 5.0)

    def _why_not(self, op: OperationContext) -> str:
        parts = [*op.progress.get("refused", [])]
        if op.progress.get("excluded"):
            parts.append("not candidates: " + op.progress["excluded"])
        return "; ".join(parts)

    @staticmethod
    def _image_note(target: Target) -> str:
        if target.image_cloud == target.cloud:
            return ""
        return f", image {target.image_id} from {target.image_cloud} through the routers"

    # -------------------------------------------------------------------- deprovision

    def deprovision(self, op: OperationContext) -> Outcome:
        tag = instance_tag(op.instance.id)
        left: list[str] = []
        problems: list[str] = []
        for cloud in op.clouds.names():
            try:
                for server in _tagged(op.clouds, cloud, tag):
                    left.append(f"{server.id} in {cloud} ({server.status})")
                    if (server.task_state or "") != "deleting":
                        _delete(op.clouds, cloud, server.id, None)
            except Exception as exc:
                problems.append(f"{cloud}: {error_text(exc)}")
        if problems:
            return Pending("cannot check every cloud yet: " + "; ".join(problems), 5.0)
        if left:
            return Pending("deleting server " + ", ".join(left), POLL_SECONDS)
        revoked = credentials.revoke_instance(op)
        text = "no server of this instance is left in any cloud"
        return Done(f"{text}; {revoked} binding credential(s) revoked" if revoked else text)

    # -------------------------------------------------------------------------- bind

    def bind(self, op: OperationContext) -> Outcome:
        """An application credential on the server's project; the credentials also say the
        server's cloud, id, name and addresses (read now: they may have changed)."""
        res = op.instance.resources
        if not op.instance.cloud or not res.get("server_id"):
            return Failed("the instance has no server to bind to")
        conn = op.clouds.connect(op.instance.cloud, project_id=res.get("project_id"))
        server = conn.compute.get_server(res["server_id"])
        extra = {
            "server_id": server.id,
            "server_name": server.name,
            "addresses": dict(server.addresses or {}),
            "image_id": res.get("image_id"),
            "image_cloud": res.get("image_cloud"),
        }
        return bind_credentials(op, self.settings, extra)

    def unbind(self, op: OperationContext) -> Outcome:
        return credentials.revoke(op)

    # ---------------------------------------------------------------------- inventory

    def inventory(self, cloud: str) -> Iterable[Found]:
        for server in _tagged(self.clouds, cloud, self.broker_tag):
            yield Found(
                cloud=cloud,
                kind="server",
                id=server.id,
                instance_id=(server.metadata or {}).get(METADATA_KEY),
                name=server.name,
            )

    # ------------------------------------------------------------------------ helpers

    def _find(self, conn: Connection, instance_id: str) -> Server | None:
        """The instance's server in the connection's project (the oldest, should a second
        exist)."""
        found = list(conn.compute.servers(tags=instance_tag(instance_id)))
        found.sort(key=lambda s: s.created_at or "")
        return found[0] if found else None


def _tagged(clouds: Clouds, cloud: str, tag: str) -> Iterator[Server]:
    """Servers carrying `tag` in every project of `cloud` (the broker account's view)."""
    yield from clouds.connect(cloud).compute.servers(all_projects=True, tags=tag)


def _delete(clouds: Clouds, cloud: str, server_id: str, project_id: str | None) -> None:
    conn = clouds.connect(cloud, project_id=project_id)
    conn.compute.delete_server(server_id, ignore_missing=True)


def _get_server(conn: Connection, server_id: str) -> Server | None:
    from openstack import exceptions

    try:
        return conn.compute.get_server(server_id)
    except exceptions.NotFoundException:
        return None


def _cloud_of(scope: Scope, service_type: str, default: str) -> str:
    """The cloud a scope names for `service_type` (a single cloud: parse_where checked it)."""
    expr = scope.get(service_type)
    return expr.name if isinstance(expr, CloudName) else default


def _scope_json(**entries: str) -> str:
    return json.dumps(entries, separators=(",", ":"), sort_keys=True)
