"""The head the reverse server sends upstream (scoperouter.proxy.reverse._request_head), built
cheaply, is byte for byte the head built field by field: the client's fields as received but
the dropped ones, Host when missing, the plan's fields (values as UTF-8, their undecodable
bytes kept), the framing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scoperouter.http.request import Body, Request
from scoperouter.proxy.reverse import _NOT_FORWARDED, _request_head
from scoperouter.router.pipeline import Plan
from scoperouter.router.state import REQUEST_ID_HEADER, RequestState
from scoperouter.routing import Forward
from scoperouter.semantics import header_map

NAMES = [b"Host", b"X-Auth-Token", b"x-scope", b"Accept", b"Connection", b"Content-Length",
         b"Keep-Alive", b"X-Other", b"x-scope-request-id", b"User-Agent"]  # fmt: skip
# (routing sets no request id among its edits; the head must still be right if one did)
EDITS = ["x-scope", "x-auth-token", "x-scope-hops", "x-service-token", "host",
         "x-scope-request-id"]  # fmt: skip

# values as the HTTP layer decodes them (UTF-8, other bytes as surrogates), no CR/LF
raw_values = st.binary(max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b)
values = raw_values.map(lambda b: b.decode("utf-8", "surrogateescape"))


class _Gone:
    """A connection that is closed (a body's, which the head never reads)."""

    closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _field_by_field(request: Request, plan: Plan) -> bytes:
    """The head as it was built before (one name and one value encoded per field)."""
    edits = {**plan.decision.set_headers, **plan.edits, REQUEST_ID_HEADER: plan.state.request_id}
    drop = _NOT_FORWARDED | {name.encode() for name in edits} | request.connection
    lines = [f"{request.method} {plan.target} HTTP/1.1\r\n".encode("latin-1")]
    lines += [b"%s: %s\r\n" % f for f in request.fields if f[0].lower() not in drop]
    if "host" not in request.headers and "host" not in edits:
        lines.append(f"Host: {plan.host}:{plan.port}\r\n".encode("latin-1"))
    for name, value in edits.items():
        lines.append(b"%s: %s\r\n" % (name.encode(), value.encode("utf-8", "surrogateescape")))
    if request.chunked:
        lines.append(b"Transfer-Encoding: chunked\r\n")
    elif request.length is not None:
        lines.append(b"Content-Length: %d\r\n" % request.length)
    lines.append(b"\r\n")
    return b"".join(lines)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(st.tuples(st.sampled_from(NAMES), raw_values), max_size=8),
    set_headers=st.dictionaries(st.sampled_from(EDITS), values, max_size=4),
    edits=st.dictionaries(st.sampled_from(EDITS), values, max_size=2),
    connection=st.sampled_from([frozenset(), frozenset({b"x-other"}), frozenset({b"accept"})]),
    framing=st.sampled_from(["none", "chunked", "length"]),
    request_id=st.sampled_from(["req-1", "req-abcdef0123-ff"]),
)
def test_the_head_sent_upstream_is_the_one_built_field_by_field(
    fields: list[tuple[bytes, bytes]],
    set_headers: dict[str, str],
    edits: dict[str, str],
    connection: frozenset[bytes],
    framing: str,
    request_id: str,
) -> None:
    request = Request(
        method="GET",
        target=b"/v2/images",
        authority=None,
        version="1.1",
        fields=fields,
        headers=header_map(fields),
        connection=connection,
        keep_alive=True,
        chunked=framing == "chunked",
        length=12 if framing == "length" else None,
        body=Body(_Gone()),  # not read by the head
        started=0.0,
        has_body=framing != "none",
    )
    decision = Forward(
        cloud="CloudOne", service_type="image", interface="public", remote=False,
        url="http://127.0.1.2:9292/v2/images?limit=1", set_headers=set_headers,
    )  # fmt: skip
    state = RequestState(request_id=request_id, headers={}, method="GET", path="/", started=0.0)
    plan = Plan(
        state=state, decision=decision, edits=edits, scheme="http", host="127.0.1.2",
        port=9292, target="/v2/images?limit=1", connect_timeout=1.0, response_timeout=1.0,
    )  # fmt: skip
    assert _request_head(request, plan) == _field_by_field(request, plan)
