"""The scope language: parsing, precedence, canonical form, token codec, and robustness."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoperouter.scope import (
    MAX_DEPTH,
    AllOf,
    AnyOf,
    CloudName,
    Scope,
    ScopeError,
    clouds_of,
    format_expression,
    join_token,
    parse_expression,
    parts_and_clouds,
    split_token,
)

A, B, C = CloudName("A"), CloudName("B"), CloudName("C")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CloudOne", CloudName("CloudOne")),
        ("  CloudOne ", CloudName("CloudOne")),
        ("A | B", AnyOf((A, B))),
        ("A & B", AllOf((A, B))),
        ("A | B & C", AnyOf((A, AllOf((B, C))))),  # & binds tighter than |
        ("A & B | C", AnyOf((AllOf((A, B)), C))),
        ("(A | B) & C", AllOf((AnyOf((A, B)), C))),
        ("A | (B | C)", AnyOf((A, B, C))),  # flattened: one form per meaning
        ("((A))", A),
        ("region-1.east:x_y", CloudName("region-1.east:x_y")),
    ],
)
def test_parse_expression(text: str, expected: object) -> None:
    assert parse_expression(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("A |", "expected a cloud name but found end of expression"),
        ("| A", "expected a cloud name but found '|' at position 0"),
        ("A B", "unexpected 'B' at position 2"),
        ("(A | B", "expected ')' but found end of expression"),
        ("A)", "unexpected ')' at position 1"),
        ("A & !B", "unexpected character '!' at position 4"),
        ("A;rm -rf /", "unexpected character ';'"),
        ("__import__('os')", "unexpected character '_' at position 0"),
    ],
)
def test_parse_expression_errors_say_what_and_where(text: str, fragment: str) -> None:
    with pytest.raises(ScopeError) as info:
        parse_expression(text)
    assert fragment in info.value.message
    assert "\n" not in info.value.message


def test_depth_is_bounded() -> None:
    parse_expression("(" * MAX_DEPTH + "A" + ")" * MAX_DEPTH)
    with pytest.raises(ScopeError, match="nested deeper"):
        parse_expression("(" * (MAX_DEPTH + 1) + "A" + ")" * (MAX_DEPTH + 1))


def test_non_string_expression_is_refused() -> None:
    with pytest.raises(ScopeError, match="must be a string"):
        parse_expression(42)


def test_scope_parse_and_canonical_json() -> None:
    scope = Scope.parse('{"image": "CloudTwo", "compute": "A | B&C"}')
    assert dict(scope) == {"compute": AnyOf((A, AllOf((B, C)))), "image": CloudName("CloudTwo")}
    assert scope.to_json() == '{"compute":"A | B & C","image":"CloudTwo"}'
    assert Scope.parse(scope.to_json()) == scope


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ('["image"]', "must be a JSON object"),
        ('"CloudTwo"', "must be a JSON object"),
        ('{"image": 3}', "scope for 'image': an expression must be a string"),
        ('{"image": ""}', "scope for 'image': empty expression"),
        ('{"": "A"}', "is not a service type"),
        ('{"im age": "A"}', "is not a service type"),
        ('{"image": "A |"}', "scope for 'image': expected a cloud name"),
        ("[" * 100000, "scope longer than"),
    ],
)
def test_scope_errors(text: str, fragment: str) -> None:
    with pytest.raises(ScopeError) as info:
        Scope.parse(text)
    assert fragment in info.value.message


def test_complete_fills_only_missing_services() -> None:
    scope = Scope.parse('{"image": "CloudTwo"}')
    done = scope.complete(["compute", "identity", "image"], "CloudOne")
    assert done.to_json() == '{"compute":"CloudOne","identity":"CloudOne","image":"CloudTwo"}'
    assert done.complete(["compute", "identity", "image"], "Elsewhere") == done


def test_token_codec() -> None:
    scope = Scope.parse('{"image": "CloudTwo"}')
    value = join_token("gAAAA-token", scope)
    assert value == 'gAAAA-token!SCOPE!{"image":"CloudTwo"}'
    assert split_token(value) == ("gAAAA-token", '{"image":"CloudTwo"}')
    assert split_token("gAAAA-token") == ("gAAAA-token", None)


# ----------------------------------------------------------------- property-based tests

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,12}", fullmatch=True)
expressions = st.recursive(
    names.map(CloudName),
    lambda children: st.one_of(
        st.lists(children, min_size=2, max_size=4).map(lambda p: AllOf(tuple(p))),
        st.lists(children, min_size=2, max_size=4).map(lambda p: AnyOf(tuple(p))),
    ),
    max_leaves=12,
)


def _normal(expr: object) -> object:
    """What the parser produces for a tree: nested same-operator nodes flattened, a part equal
    to an earlier one of the same node dropped, a node left with one part replaced by it;
    None when an '&' has parts that share a cloud (refused)."""
    if isinstance(expr, CloudName):
        return expr
    kind = type(expr)
    flat: list[object] = []
    for part in expr.parts:  # type: ignore[attr-defined]
        part = _normal(part)
        if part is None:
            return None
        for sub in part.parts if isinstance(part, kind) else (part,):  # type: ignore[attr-defined]
            if sub not in flat:
                flat.append(sub)
    if len(flat) == 1:
        return flat[0]
    if kind is AllOf:
        names = [set(clouds_of(p)) for p in flat]  # type: ignore[arg-type]
        if sum(map(len, names)) != len(set().union(*names)):
            return None
    return kind(tuple(flat))


@given(expressions)
def test_format_then_parse_round_trips(expr: object) -> None:
    text = format_expression(expr)  # type: ignore[arg-type]
    expected = _normal(expr)
    if expected is None:
        with pytest.raises(ScopeError, match="in more than one of its parts"):
            parse_expression(text)
        return
    parsed = parse_expression(text)
    assert parsed == expected
    assert parse_expression(format_expression(parsed)) == parsed  # canonical: a fixed point
    names = list(clouds_of(parsed))
    assert parts_and_clouds(parsed) == (len(names), len(set(names)))


# --------------------------------------------------- repeats: each cloud once (issue 30)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A & A", A),  # every cloud once: one request, its items listed once
        ("A | A", A),  # a failover moves on to another cloud, never the same again
        (" & ".join(["CloudOne"] * 90), CloudName("CloudOne")),
        ("A & B & A & B", AllOf((A, B))),
        ("A | B | A", AnyOf((A, B))),
        ("(A | B) & (A | B)", AnyOf((A, B))),
        ("(A & B) | (A & B)", AllOf((A, B))),
        ("C & ((A & B) | (A & B))", AllOf((C, A, B))),  # flattened once the repeat is gone
        ("(A & B) | A", AnyOf((AllOf((A, B)), A))),  # kept: every cloud, else A's alone
        ("A | (A & B)", AnyOf((A, AllOf((A, B))))),
        ("(A & B) | (B & A)", AnyOf((AllOf((A, B)), AllOf((B, A))))),  # another order
        ("a & A", AllOf((CloudName("a"), A))),  # names are case-sensitive, as in the config
    ],
)
def test_repeated_parts_are_kept_once(text: str, expected: object) -> None:
    assert parse_expression(text) == expected


@pytest.mark.parametrize(
    ("text", "cloud"),
    [
        ("A & (A | B)", "A"),
        ("(A | B) & (B | C)", "B"),
        ("(A | B) & (C | (B & D))", "B"),
        ("C & (A | B) & (D | A)", "A"),
    ],
)
def test_an_and_naming_a_cloud_in_two_parts_is_refused(text: str, cloud: str) -> None:
    with pytest.raises(ScopeError) as caught:
        parse_expression(text)
    assert caught.value.message == (
        f"'&' names {cloud!r} in more than one of its parts: its items would be merged twice "
        "(name each cloud once in an '&')"
    )


def test_a_scope_with_repeats_travels_in_its_canonical_form() -> None:
    scope = Scope.parse(json.dumps({"image": " & ".join(["CloudOne"] * 90)}))
    assert scope.to_json() == '{"image":"CloudOne"}'
    with pytest.raises(ScopeError, match="scope for 'image': '&' names 'A'"):
        Scope.parse('{"image": "A & (A | B)"}')


def test_parts_and_clouds() -> None:
    assert parts_and_clouds(A) == (1, 1)
    assert parts_and_clouds(parse_expression("(A & B) | (A & C) | C")) == (5, 3)


@settings(max_examples=500)
@given(
    st.text(alphabet=st.sampled_from(list("AB1 ()&|!_-.:\t\"'{}[]")) | st.characters(), max_size=60)
)
def test_random_expressions_parse_or_fail_cleanly(text: str) -> None:
    try:
        parse_expression(text)
    except ScopeError as exc:
        assert exc.message and "\n" not in exc.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)


@settings(max_examples=300)
@given(json_values)
def test_random_json_scopes_parse_or_fail_cleanly(value: object) -> None:
    try:
        scope = Scope.parse(json.dumps(value))
    except ScopeError as exc:
        assert exc.message
    else:
        assert Scope.parse(scope.to_json()) == scope


@settings(max_examples=300)
@given(st.text(max_size=200))
def test_random_text_scopes_parse_or_fail_cleanly(text: str) -> None:
    try:
        Scope.parse(text)
    except ScopeError as exc:
        assert exc.message
