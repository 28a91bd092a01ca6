"""The catalog's URLs read without a regular expression, and its objects built by hand-written
``__init__`` methods (issue 31: the catalog of 10,000 clouds x 10 services in 1 s): the same
URLs, the same refusals, the same frozen objects, on both builds."""

from __future__ import annotations

import dataclasses
import re
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoperouter import catalog as catalog_module
from scoperouter.catalog import URL, Endpoint, Frontend, parse_url, strip_version


def _reading(text: str) -> URL | str:
    """parse_url's answer: the URL, or the refusal's message."""
    try:
        return parse_url(text)
    except ValueError as exc:
        return str(exc)


def _urlsplits(text: str) -> URL | str:
    """The reference: the same URL as urlsplit reads it, or its refusal."""
    try:
        return catalog_module._parse_any_url(text)
    except ValueError as exc:
        return str(exc)


# Beyond the common form: what a hostile or careless config may hold (upper case, IPv6 and
# user info, whitespace of every kind, control characters, non-ASCII digits and letters,
# percent-escapes, a query, a fragment).
_HOSTILE_PIECES = st.sampled_from(
    [
        *"aZ09.-_:/?#@[]%",
        " ",
        "\t",
        "\n",
        "\r",
        "\x00",
        "\x0b",
        "\x1f",
        "\x7f",
        "\x85",
        "\xa0",
        "\u2028",
        "\u3000",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: a decimal digit, not an ASCII one
        "\u00b2",  # SUPERSCRIPT TWO: isdigit(), not a port digit
        "\u212a",  # KELVIN SIGN: lower() is "k"
        "é",
        "v",
        "1",
        "65535",
        "65536",
        "99999",
        "0",
    ]
)


@settings(max_examples=1500, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "HTTP", "Https", "ftp", "", "http:", " http"]),
    host=st.lists(_HOSTILE_PIECES, max_size=8).map("".join),
    port=st.one_of(
        st.just(""), st.lists(_HOSTILE_PIECES, max_size=3).map(lambda p: ":" + "".join(p))
    ),
    path=st.lists(_HOSTILE_PIECES, max_size=8).map("".join),
)
def test_parse_url_reads_hostile_urls_as_urlsplit_does(
    scheme: str, host: str, port: str, path: str
) -> None:
    """Whatever the text, parse_url's answer is urlsplit's reading of it: the same URL or the
    same refusal (its fast path reads only the common form, the rest goes to urlsplit)."""
    text = f"{scheme}://{host}{port}{path}"
    assert _reading(text) == _urlsplits(text)


@pytest.mark.parametrize(
    "text",
    [
        "http://router.cloud0001.example:9292",
        "http://router.cloud0001.example:8774/v2.1",
        "https://127.0.0.2:8443/v1/AUTH_%(project_id)s",
        "http://h/a/b/",
        "http://h:0/x",  # port 0: the scheme's default, as urlsplit's reading gives
        "https://a-b.c:65535",
    ],
)
def test_the_common_form_is_read_without_urlsplit(text: str) -> None:
    """The fast path reads the URLs a config is made of (else the 300,000 of a 10,000-cloud
    config would each cost urlsplit), and reads them as urlsplit does."""
    fast = catalog_module._parse_simple_url(text)
    assert fast is not None
    assert fast == catalog_module._parse_any_url(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("http://", "has no host"),
        ("http://:80/x", "has no host"),
        ("http://h:99999", "invalid port"),
        ("http://h:65536/v2", "invalid port"),
        ("http://h/?q=1", "query or fragment"),
        ("http://h/v2#top", "query or fragment"),
        ("ftp://h/x", "not an http:// or https:// URL"),
        ("h:80", "not an http:// or https:// URL"),
        ("http://h:1:2/", "invalid port"),
    ],
)
def test_bad_urls_are_refused_with_urlsplits_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_url(text)
    assert catalog_module._parse_simple_url(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "http://Router.example:80/a",  # upper case: urlsplit lower-cases the host
        "http://[::1]:5000/v3",
        "http://user:pw@h:80/",
        "http://h:80/a b",
        "http://h:80/a\tb",
        "http://h:80/a\u3000b",
        "http://h:80/caf\u00e9",
        "http://h\u212a:80/",
        "http://h:\u0663\u0663/",  # decimal digits, not ASCII ones
        "http://...:80",
        "http://h:/x",
        "http://h:+80/",
    ],
)
def test_other_forms_go_to_urlsplit(text: str) -> None:
    """What the fast path does not read exactly as urlsplit does is left to urlsplit."""
    assert catalog_module._parse_simple_url(text) is None
    assert _reading(text) == _urlsplits(text)


def test_urls_read_by_either_path_are_alike() -> None:
    """The objects are the same whichever path read them: equal, same hash, same base."""
    fast = parse_url("http://h:8080/v1")
    slow = catalog_module._parse_any_url("http://H:8080/v1/")
    assert fast == slow and hash(fast) == hash(slow)
    assert fast.base == "http://h:8080" and str(fast) == "http://h:8080/v1"
    assert repr(fast) == "URL(scheme='http', host='h', port=8080, path='/v1')"
    assert parse_url("http://[::1]:5000").base == "http://[::1]:5000"
    assert urlsplit(str(fast)).path == fast.path


def _objects() -> list[object]:
    url = parse_url("http://router.example:9292/v2")
    backend = parse_url("http://ctl.example:9292/v2")
    return [
        url,
        Endpoint("One", "image", "public", url, backend),
        Frontend(parse_url("http://router.example:9292"), "0.0.0.0", 9292),
    ]


@pytest.mark.parametrize("obj", _objects(), ids=lambda o: type(o).__name__)
def test_the_catalogs_objects_stay_frozen(obj: object) -> None:
    """Their __init__ is written out (compiled, it stores into the object), yet they are as
    frozen as the dataclasses were: no attribute can be set, changed or deleted."""
    for name in [f.name for f in dataclasses.fields(obj)]:  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(obj, name)
    with pytest.raises((AttributeError, TypeError)):
        obj.colour = "blue"  # type: ignore[attr-defined]


def test_written_out_inits_keep_the_dataclasses_signatures() -> None:
    """Keyword arguments, defaults, fields, equality and replace() as before."""
    url = parse_url("http://router.example:9292")
    backend = parse_url("http://ctl.example:9292")
    ep = Endpoint(cloud="One", service_type="image", interface="public", url=url, backend=backend)
    assert ep == Endpoint("One", "image", "public", url, backend)
    assert dataclasses.replace(ep, interface="admin").interface == "admin"
    fe = Frontend(url=url, listen_host="0.0.0.0", listen_port=9292)
    assert (fe.cert, fe.key) == (None, None)
    assert Frontend(url, "h", 1, cert="c", key="k").key == "k"
    moved = dataclasses.replace(url, port=9293)
    assert moved.base == "http://router.example:9293"  # base follows, not copied
    assert [f.name for f in dataclasses.fields(URL)] == ["scheme", "host", "port", "path", "base"]
    assert URL("http", "h", 80) == URL("http", "h", 80, "")


_VERSION_SEGMENT = re.compile(r"/v\d+(\.\d+)?\Z")  # what strip_version matched before


@settings(max_examples=1000, deadline=None)
@given(st.text(st.sampled_from([*"/v1.2x", "\u0663", "\u00b2", "\n", "V"]), max_size=14))
def test_strip_version_strips_what_the_regular_expression_did(path: str) -> None:
    assert strip_version(path) == _VERSION_SEGMENT.sub("", path)


@pytest.mark.parametrize(
    ("path", "stripped"),
    [
        ("/compute/v2.1", "/compute"),
        ("/v3", ""),
        ("/identity/v3/", "/identity/v3/"),
        ("/v2.1.3", "/v2.1.3"),
        ("/v2.", "/v2."),
        ("/v", "/v"),
        ("/v1/v2", "/v1"),
        ("/version", "/version"),
        ("/v2\n", "/v2\n"),
        ("", ""),
    ],
)
def test_strip_version(path: str, stripped: str) -> None:
    assert strip_version(path) == stripped


@pytest.mark.parametrize("paths", [("", "/image"), ("/image", ""), ("/a", "/b"), ("/b", "/a")])
def test_two_prefixes_at_one_address_are_tried_longest_first(paths: tuple[str, str]) -> None:
    """An address with two prefixes (the common case after one) is ordered without a sort:
    longest first whatever the order they were published in, and each still matches."""
    from scoperouter.catalog import Catalog, Cloud

    endpoints = tuple(
        Endpoint(
            "One",
            f"s{i}",
            "public",
            parse_url(f"http://gw.example{path}"),
            parse_url(f"http://127.0.1.2:{9000 + i}{path}"),
        )
        for i, path in enumerate(paths)
    )
    cat = Catalog({"One": Cloud(name="One", region="R", frontends=(), endpoints=endpoints)})
    for i, path in enumerate(paths):
        m = cat.match("gw.example", 80, f"{path}/x?y")
        assert m is not None and m.endpoint.service_type == f"s{i}" and m.rest == "/x?y"
    assert cat.service_types_of("One") == {"s0", "s1"} == cat.service_types


def test_building_a_catalog_lets_other_threads_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker builds a reloaded catalog in a thread while its event loop serves; compiled,
    that code would keep the GIL from start to end (no bytecode to switch at), so it hands
    the GIL over every 128 clouds (time.sleep(0)) while it validates, checks the backends and
    indexes."""
    import threading
    import time

    from scoperouter.config import build_catalog

    clouds = {
        f"C{i}": {
            "frontends": [{"url": f"http://r{i}.example:{port}"} for port in (5000, 9292)],
            "services": {
                "identity": {"public": {"url": f"http://r{i}.example:5000/v3",
                                        "backend": f"http://b{i}.example:5000/v3"}},
                "image": {"public": {"url": f"http://r{i}.example:9292",
                                     "backend": f"http://b{i}.example:9292"}},
            },
        }
        for i in range(320)
    }  # fmt: skip
    slept: list[float] = []
    real_sleep, this_thread = time.sleep, threading.get_ident()

    def sleep(seconds: float) -> None:
        # this thread's sleeps are counted; any other thread of this pytest worker still sleeps
        # (a log handler's flusher left by an earlier test loops on time.sleep: given a bare
        # list.append, its compiled loop held the GIL and grew the list until the OOM killer)
        if threading.get_ident() == this_thread:
            slept.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    build_catalog({"clouds": clouds})
    # validation, the backends' check, the index: at clouds 0, 128 and 256 each (and 1 more
    # for the index's 1,280 addresses)
    assert slept.count(0) >= 9, slept
