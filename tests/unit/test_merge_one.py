"""``A & B`` on a read of one resource (scoperouter.merge, pure): what counts as one (per
service, :data:`RESOURCES`), and the answer from the clouds' answers: the one that has it,
marked with its cloud; 404 when none has it, 409 when several do; a failing cloud named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scoperouter.errors import Reject
from scoperouter.merge import (
    COLLECTIONS,
    MISSING_HEADER,
    ORIGIN_HEADER,
    ORIGIN_KEY,
    RESOURCES,
    CloudAnswer,
    CloudFailure,
    ListPlan,
    Merged,
    ResourcePlan,
    find_one,
    plan_read,
    resource_of,
)

CLOUDS = ("CloudOne", "CloudTwo")


def plan(service_type: str, path: str, **headers: str) -> ResourcePlan:
    found = plan_read(service_type, "GET", path, CLOUDS, headers)
    assert isinstance(found, ResourcePlan), found
    return found


def answer(status: int, body: Any, **headers: str) -> CloudAnswer:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return CloudAnswer(status, {"content-type": "application/json", **headers}, data)


NOT_FOUND = answer(404, {"itemNotFound": {"code": 404, "message": "Instance x not found"}})
SERVER = {"server": {"id": "x", "name": "vm"}}


def error_of(merged: Merged) -> str:
    data = json.loads(merged.body)
    assert data["error"]["code"] == merged.status
    message = data["error"]["message"]
    assert isinstance(message, str)
    return message


def test_every_resource_is_one_of_a_merged_collection() -> None:
    for service_type, resources in RESOURCES.items():
        suffixes = {c.suffix for c in COLLECTIONS[service_type]}
        for resource in resources:
            assert resource.suffix in suffixes, (service_type, resource)
            path = "/prefix/" + "/".join(resource.suffix) + "/an-id"
            assert resource_of(service_type, "GET", path) == resource
            assert resource_of(service_type, "GET", path + "/") == resource
            assert resource_of(service_type, "GET", path + "?fields=id") == resource
            assert resource_of(service_type, "GET", path + "/sub") is None
            assert resource_of(service_type, "DELETE", path) is None
            assert resource_of(service_type, "GET", "/" + "/".join(resource.suffix)) is None


@pytest.mark.parametrize(
    ("service_type", "path", "kind"),
    [
        ("compute", "/v2.1/servers/detail", ListPlan),  # a list, not the server "detail"
        ("compute", "/v2.1/servers/abc", ResourcePlan),
        ("compute", "/v2.1/flavors/detail?is_public=None", ListPlan),
        ("image", "/v2/images/abc", ResourcePlan),
        ("identity", "/v3/projects/p1", ResourcePlan),
        ("identity", "/v3/auth/projects", ListPlan),
        ("block-storage", "/v3/proj/volumes/v1", ResourcePlan),
        ("network", "/v2.0/ports/p", ResourcePlan),
        ("placement", "/resource_providers/rp", ResourcePlan),
    ],
)
def test_a_read_is_a_list_or_one_resource(service_type: str, path: str, kind: type) -> None:
    assert isinstance(plan_read(service_type, "GET", path, CLOUDS, {}), kind)


def test_anything_else_is_a_400_saying_what_and_reads() -> None:
    for method, path in (("POST", "/v2/images"), ("GET", "/v2/images/a/file")):
        refused = plan_read("image", method, path, CLOUDS, {})
        assert isinstance(refused, Reject) and refused.status == 400
        assert refused.message == (
            "CloudOne & CloudTwo for 'image': '&' only reads, a list (GET of a collection, "
            "merged) or one resource (GET by id, found in the cloud that has it), not "
            f"{method} {path}; name one cloud for it (or use '|')"
        )


def test_the_cloud_that_has_it_answers_marked_with_its_cloud() -> None:
    found = plan("compute", "/v2.1/servers/x?fields=id")
    two = answer(200, SERVER, **{"content-length": "99", "x-openstack-request-id": "req-2"})
    merged = found_one(found, {"CloudOne": NOT_FOUND, "CloudTwo": two})
    assert merged.status == 200
    assert json.loads(merged.body) == {"server": {"id": "x", "name": "vm", ORIGIN_KEY: "CloudTwo"}}
    assert merged.headers[ORIGIN_HEADER] == "CloudTwo"
    assert merged.headers["x-openstack-request-id"] == "req-2"  # the cloud's own answer
    assert "content-length" not in merged.headers  # the body changed: the engine frames it
    # glance's answer is the image itself
    image = {"id": "i", "name": "cirros", "self": "/v2/images/i"}
    merged = found_one(plan("image", "/v2/images/i"), {"CloudOne": answer(200, image)})
    assert json.loads(merged.body) == {**image, ORIGIN_KEY: "CloudOne"}


def found_one(found: ResourcePlan, answers: dict[str, CloudAnswer | CloudFailure]) -> Merged:
    full: dict[str, CloudAnswer | CloudFailure] = {c: NOT_FOUND for c in found.asked}
    full.update(answers)
    return find_one(found, full)


def test_none_has_it_404_several_have_it_409() -> None:
    found = plan("compute", "/v2.1/servers/x")
    merged = found_one(found, {})
    assert merged.status == 404 and merged.headers["content-type"] == "application/json"
    assert error_of(merged) == (
        "CloudOne & CloudTwo for 'compute': GET /v2.1/servers/x: not found in CloudOne or CloudTwo"
    )
    merged = found_one(found, {"CloudOne": answer(200, SERVER), "CloudTwo": answer(200, SERVER)})
    assert merged.status == 409
    assert error_of(merged) == (
        "CloudOne & CloudTwo for 'compute': GET /v2.1/servers/x is in more than one cloud "
        "(CloudOne, CloudTwo): name the one to use"
    )


@pytest.mark.parametrize(
    ("failure", "status", "why"),
    [
        (CloudFailure(502, "it refused the connection"), 502, "it refused the connection"),
        (CloudFailure(504, "it did not answer within 2s"), 504, "it did not answer within 2s"),
        (answer(500, {"computeFault": {"message": "boom"}}), 502, "it answered 500: boom"),
        (answer(403, {"forbidden": {"message": "policy"}}), 403, "it answered 403: policy"),
    ],
)
def test_a_failing_cloud_is_named_unless_partial(failure: Any, status: int, why: str) -> None:
    found = plan("compute", "/v2.1/servers/x")
    for other in (answer(200, SERVER), NOT_FOUND):
        merged = found_one(found, {"CloudOne": failure, "CloudTwo": other})
        assert merged.status == status
        assert error_of(merged) == (
            f"CloudOne & CloudTwo for 'compute': CloudOne failed (CloudOne: {why}) (send "
            "X-Scope-Partial: allow to look in the others only)"
        )
    partial = plan("compute", "/v2.1/servers/x", **{"x-scope-partial": "allow"})
    merged = found_one(partial, {"CloudOne": failure, "CloudTwo": answer(200, SERVER)})
    assert merged.status == 200 and merged.headers[MISSING_HEADER] == "CloudOne"
    merged = found_one(partial, {"CloudOne": failure})
    assert merged.status == 404 and merged.headers[MISSING_HEADER] == "CloudOne"
    assert error_of(merged).endswith("not found in CloudTwo")
    merged = found_one(partial, {"CloudOne": failure, "CloudTwo": failure})
    assert merged.status == status  # none answered: nothing to say it is absent


def test_an_answer_that_is_not_the_apis_json_is_passed_on_named_by_its_header() -> None:
    for body in (b"not json", b"[1, 2]", {"server": "x"}):
        merged = found_one(plan("compute", "/v2.1/servers/x"), {"CloudTwo": answer(200, body)})
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        assert (merged.status, merged.body) == (200, raw)
        assert merged.headers[ORIGIN_HEADER] == "CloudTwo"


def test_openstacksdk_reads_the_answer_as_a_cloud_s_own() -> None:
    """`openstack image show` keeps the origin as an image property; a server ignores it."""
    from openstack.compute.v2.server import Server
    from openstack.image.v2.image import Image

    image = {"id": "i", "name": "cirros", "status": "active", "visibility": "public"}
    merged = find_one(
        plan("image", "/v2/images/i"), {"CloudOne": NOT_FOUND, "CloudTwo": answer(200, image)}
    )
    found = Image.existing(**json.loads(merged.body))
    assert (found.id, found.properties[ORIGIN_KEY]) == ("i", "CloudTwo")
    merged = find_one(
        plan("compute", "/v2.1/servers/x"), {"CloudOne": answer(200, SERVER), "CloudTwo": NOT_FOUND}
    )
    server = Server.existing(**json.loads(merged.body)["server"])
    assert server.id == "x" and ORIGIN_KEY not in server.to_dict()
