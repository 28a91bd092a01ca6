"""A plan's JSON-schema violations as 400 descriptions (runtime.describe_error): the field and
the rule, for every keyword, never the value sent."""

from __future__ import annotations

from typing import Any

import pytest

from scoperouter.broker.runtime import compile_schema, describe_error
from scoperouter.broker.services.server import MAX_USER_DATA_BYTES, ServerService

SECRET = "pw=Tr0ub4dor&3"
SCHEMA = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2},
        "size": {"type": "integer", "minimum": 1, "multipleOf": 2},
        "colour": {"enum": ["red", "blue"]},
        "tags": {"type": "array", "maxItems": 1, "uniqueItems": True},
        "nested": {
            "type": "object",
            "properties": {"inner": {"type": "string", "maxLength": 3}},
        },
    },
}


@pytest.mark.parametrize(
    ("parameters", "field", "message"),
    [
        ({}, "parameters.name", "required"),
        ({"name": SECRET}, "parameters.name", "does not match the pattern ^[a-z]+$"),
        ({"name": "ab", "size": SECRET}, "parameters.size", "expected integer"),
        ({"name": "ab", "size": 3}, "parameters.size", "not a multiple of 2"),
        ({"name": "ab", "colour": SECRET}, "parameters.colour", 'not one of "red", "blue"'),
        ({"name": "ab", "tags": [SECRET, "b"]}, "parameters.tags", "more than 1 items"),
        ({"name": "ab", "nested": {"inner": SECRET}}, "parameters.nested.inner",
         "longer than 3 characters"),
        ({"name": "ab", SECRET: 1}, f"parameters.{SECRET}", "not a parameter of this plan"),
    ],
)  # fmt: skip
def test_violations_name_the_field_and_the_rule(
    parameters: dict[str, Any], field: str, message: str
) -> None:
    validator = compile_schema(SCHEMA, "test")
    errors = sorted(validator.iter_errors(parameters), key=lambda e: len(list(e.absolute_path)))
    got_field, got_message = describe_error(errors[0])
    assert (got_field, got_message) == (field, message)
    if SECRET not in field:  # an unexpected property's *name* is what it names
        assert SECRET not in got_message


def test_user_data_one_byte_over_nova_s_limit_is_named_not_quoted() -> None:
    class Clouds:
        def names(self) -> tuple[str, ...]:
            return ("CloudOne",)

    service = ServerService({"plans": [{"name": "tiny", "flavor": "m1.tiny"}]}, Clouds())  # type: ignore[arg-type]
    schema = service.catalog().plans[0].schemas.instance_create
    assert schema is not None
    validator = compile_schema(schema, "openstack-server")
    user_data = "#cloud-config\npassword: " + SECRET + "x" * MAX_USER_DATA_BYTES
    [error] = list(validator.iter_errors({"image": "cirros", "user_data": user_data}))
    field, message = describe_error(error)
    assert (field, message) == (
        "parameters.user_data",
        f"longer than {MAX_USER_DATA_BYTES} characters",
    )
