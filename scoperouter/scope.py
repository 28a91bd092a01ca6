"""The scope language: which cloud serves each service type, for one request.

A scope is a JSON object mapping an OpenStack service type to an *expression* over cloud names::

    {"image": "CloudTwo", "compute": "CloudOne | CloudThree", "network": "(A & B) | C"}

Grammar (``&`` binds tighter than ``|``, parentheses group)::

    expr := and ('|' and)*        AnyOf: use the first cloud that works
    and  := atom ('&' atom)*      AllOf: use every cloud and combine
    atom := NAME | '(' expr ')'
    NAME := [A-Za-z0-9] [A-Za-z0-9_.:-]*

Client input is parsed by a small hand-written recursive-descent parser with bounded size and
depth; it is never given to ``eval`` or ``ast``. The parser returns one canonical form per
meaning (:func:`_combine`): nested operators flattened, a part repeated in one ``&`` or ``|``
kept once (``A & A`` is ``A``, ``A | B | A`` is ``A | B``), and an ``&`` whose parts share a
cloud otherwise (``A & (A | B)``) refused: that cloud's items would be merged twice. Every failure
raises :class:`ScopeError` with a one-line message that says what is wrong and where, so the
router can answer 400 and the CLI can refuse the scope before sending anything.

The scope travels on the token (``X-Auth-Token: <token>!SCOPE!<json>``), because every OpenStack
service forwards the user's token on the calls it makes for the user, and in ``X-Scope``. When
both are present and disagree the token wins: it is what follows the workflow.

This module does no I/O and imports nothing outside the standard library.
"""

from __future__ import annotations

import json
import re
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

SCOPE_SEPARATOR: Final = "!SCOPE!"
MAX_SCOPE_LENGTH: Final = 8192
MAX_SCOPE_ENTRIES: Final = 100  # service types in one scope; OpenStack's registry lists about 50
MAX_EXPRESSION_LENGTH: Final = 1024
MAX_DEPTH: Final = 16

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_PLAIN_NAME: Final = re.compile(r"[ \t]*([A-Za-z0-9][A-Za-z0-9_.:-]*)[ \t]*\Z")
_SERVICE_TYPE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")


BLOCK_STORAGE_TYPES = ("block-storage", "volumev3", "volumev2", "volume", "block-store")
"""Block storage's service type and its aliases (OpenStack's service-types registry): keystone
catalogs list it under any of them (nova looks for ``volumev3`` by default, devstack registers
``block-storage``), and a scope names it as the catalog does."""

WHY_FOLLOWS: Mapping[str, str] = {
    "placement": "compute calls the placement service of its own cloud with its own "
    "credentials (no user token, so no scope)",
    **dict.fromkeys(
        BLOCK_STORAGE_TYPES,
        "a server can only attach volumes of the cloud it runs in (block devices do not "
        "cross clouds: compute connects the volume's storage to its own hosts)",
    ),
}
"""Why each follower cannot be moved away from its leader (the router's 400 says it)."""

FOLLOWS: Mapping[str, str] = dict.fromkeys(WHY_FOLLOWS, "compute")
"""Service types that follow another one: ``follower -> leader``. A request's placement is
always its compute cloud's (see :data:`WHY_FOLLOWS`), and so is its block storage: a scope
``{"compute": "CloudTwo"}`` means CloudTwo's volumes too, which nova in CloudTwo attaches
(it calls cinder with the user's scoped token, so the completed scope must name CloudTwo
there). Completion fills a follower with its leader's entry, and a scope that names them apart
cannot be honoured by the leader's requests (the router answers 400); the follower's own API
honours it (``openstack volume list`` in CloudTwo from CloudOne)."""


class ScopeError(ValueError):
    """A scope or expression that cannot be used. ``message`` is one line for humans."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CloudName(NamedTuple):
    """A single cloud, by name (what the federation config defines is a ``catalog.Cloud``).

    A named tuple rather than a frozen dataclass: one is made per scope entry, and a frozen
    dataclass costs several times more to construct."""

    name: str


@dataclass(frozen=True, slots=True)
class AllOf:
    """``A & B``: every cloud (fan-out, results combined)."""

    parts: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class AnyOf:
    """``A | B``: the first cloud that works (fallback)."""

    parts: tuple[Expr, ...]


Expr = CloudName | AllOf | AnyOf


def clouds_of(expr: Expr) -> Iterator[str]:
    """Every cloud name an expression mentions, left to right."""
    if isinstance(expr, CloudName):
        yield expr.name
    else:
        for part in expr.parts:
            yield from clouds_of(part)


def parts_and_clouds(expr: Expr) -> tuple[int, int]:
    """(cloud names in the expression, distinct clouds among them): what one request using it
    may cost. A request sends at most one request per distinct cloud (the router's executor
    asks each cloud once); the router caps both (``settings.combine``)."""
    names = list(clouds_of(expr))
    return len(names), len(set(names))


def format_expression(expr: Expr) -> str:
    """The canonical text of an expression; ``parse_expression`` reads it back unchanged."""
    if isinstance(expr, CloudName):
        return expr.name
    if isinstance(expr, AllOf):
        return " & ".join(
            f"({format_expression(p)})" if isinstance(p, AnyOf) else format_expression(p)
            for p in expr.parts
        )
    return " | ".join(format_expression(p) for p in expr.parts)


class _Parser:
    """Recursive descent over a pre-tokenised expression; depth-bounded."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = self._tokenize(text)
        self.index = 0

    def _tokenize(self, text: str) -> list[tuple[str, int]]:
        tokens: list[tuple[str, int]] = []
        pos = 0
        while pos < len(text):
            char = text[pos]
            if char in " \t":
                pos += 1
            elif char in "&|()":
                tokens.append((char, pos))
                pos += 1
            elif match := _NAME.match(text, pos):
                tokens.append((match.group(), pos))
                pos = match.end()
            else:
                raise ScopeError(f"unexpected character {char!r} at position {pos} in {text!r}")
        return tokens

    def _peek(self) -> str | None:
        return self.tokens[self.index][0] if self.index < len(self.tokens) else None

    def _where(self) -> str:
        if self.index < len(self.tokens):
            token, pos = self.tokens[self.index]
            return f"{token!r} at position {pos}"
        return "end of expression"

    def parse(self) -> Expr:
        if not self.tokens:
            raise ScopeError("empty expression: name a cloud")
        expr = self._or(0)
        if self.index != len(self.tokens):
            raise ScopeError(f"unexpected {self._where()} in {self.text!r}")
        return expr

    def _or(self, depth: int) -> Expr:
        parts = [self._and(depth)]
        while self._peek() == "|":
            self.index += 1
            parts.append(self._and(depth))
        return parts[0] if len(parts) == 1 else _combine(AnyOf, parts)

    def _and(self, depth: int) -> Expr:
        parts = [self._atom(depth)]
        while self._peek() == "&":
            self.index += 1
            parts.append(self._atom(depth))
        return parts[0] if len(parts) == 1 else _combine(AllOf, parts)

    def _atom(self, depth: int) -> Expr:
        token = self._peek()
        if token == "(":
            if depth >= MAX_DEPTH:
                raise ScopeError(f"expression nested deeper than {MAX_DEPTH} levels")
            self.index += 1
            expr = self._or(depth + 1)
            if self._peek() != ")":
                raise ScopeError(f"expected ')' but found {self._where()} in {self.text!r}")
            self.index += 1
            return expr
        if token is None or token in "&|)":
            raise ScopeError(f"expected a cloud name but found {self._where()} in {self.text!r}")
        self.index += 1
        return CloudName(token)


def _combine(kind: type[AllOf] | type[AnyOf], parts: list[Expr]) -> Expr:
    """One canonical form per meaning, from parts already in theirs:

    * flattened: ``(A | B) | C`` is ``A | B | C``;
    * a part equal to an earlier one dropped (names compare as the federation config spells
      them: case-sensitive): ``A & A`` is ``A`` (every cloud once: each is asked once and its
      items listed once), ``A | A`` is ``A`` (a failover moves on to *another* cloud; trying
      one again is no part of it), ``(A | B) & (A | B)`` is ``A | B``;
    * one part left: that part (``A & A`` is the single cloud ``A``);
    * an ``&`` whose parts still share a cloud (``A & (A | B)``, ``(A | B) & (B | C)``) is
      refused: that cloud's items would be merged twice. An ``|`` may name a cloud again in
      another candidate (``(A & B) | A``: every cloud, else A's alone): a request asks each
      cloud once, and a later candidate reuses its answer (``router.fanout``).
    """
    flat: list[Expr] = []
    seen: set[Expr] = set()
    for part in parts:
        for sub in part.parts if isinstance(part, kind) else (part,):
            if sub not in seen:
                seen.add(sub)
                flat.append(sub)
    if len(flat) == 1:
        return flat[0]
    if kind is AllOf:
        named: set[str] = set()
        for sub in flat:
            clouds = set(clouds_of(sub))
            shared = clouds & named
            if shared:
                raise ScopeError(
                    f"'&' names {min(shared)!r} in more than one of its parts: its items would "
                    "be merged twice (name each cloud once in an '&')"
                )
            named |= clouds
    return kind(tuple(flat))


def parse_expression(text: object) -> Expr:
    """Parse one expression (``"CloudOne"``, ``"A | (B & C)"``); raises ScopeError, whatever
    `text` is (a scope's JSON may hold any value: the compiled build checks a ``str``
    parameter's type itself, with a TypeError)."""
    if not isinstance(text, str):
        raise ScopeError(
            f"an expression must be a string of cloud names, not {type(text).__name__}"
        )
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ScopeError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    plain = _PLAIN_NAME.match(text)  # one cloud, the common case: no tokenizer, no parser
    if plain is not None:
        return CloudName(plain.group(1))
    return _Parser(text).parse()


class Scope:
    """An immutable mapping service type -> expression, kept sorted for a canonical form.

    Lookups are O(1) (an index beside the sorted pairs): a scope may name up to
    ``MAX_SCOPE_ENTRIES`` service types, and Mapping's ``items()`` looks each key up.

    A plain class registered as a :class:`~collections.abc.Mapping` (``isinstance`` holds), not
    a subclass of it: mypyc compiles it as a native class (issue 31), which cannot derive from
    Mapping's ABC. Immutable as the frozen dataclass it was: its attributes are ``Final``
    (mypy refuses an assignment), equal when their entries are, hashable."""

    __slots__ = ("_index", "items_")

    def __init__(self, items_: tuple[tuple[str, Expr], ...] = ()) -> None:
        self.items_: Final = items_
        self._index: Final = dict(items_)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Scope):
            return self.items_ == other.items_
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.items_)

    def __repr__(self) -> str:
        return f"Scope(items_={self.items_!r})"

    def __reduce__(self) -> tuple[type[Scope], tuple[tuple[tuple[str, Expr], ...]]]:
        """Copied and pickled by its entries (compiled, its attributes are read-only)."""
        return Scope, (self.items_,)

    @classmethod
    def of(cls, entries: Mapping[str, Expr] | Iterable[tuple[str, Expr]]) -> Scope:
        pairs = entries.items() if isinstance(entries, Mapping) else entries
        return cls(tuple(sorted(dict(pairs).items())))

    @classmethod
    def parse(cls, text: str) -> Scope:
        """Parse the JSON text of a scope; raises ScopeError with a one-line reason.

        Cheap checks come first: the length, then the number of entries (every entry has at
        least four quotes, and quotes have no place inside service types or cloud names), so
        an oversized scope is refused before it is decoded."""
        if len(text) > MAX_SCOPE_LENGTH:
            raise ScopeError(f"scope longer than {MAX_SCOPE_LENGTH} characters")
        if text.count('"') > 4 * MAX_SCOPE_ENTRIES:
            raise ScopeError(
                f"scope names more than {MAX_SCOPE_ENTRIES} service types; at most "
                f"{MAX_SCOPE_ENTRIES} are accepted"
            )
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            # json's messages carry the position ("Expecting value: line 1 column 9 (char 8)")
            raise ScopeError(f"scope is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ScopeError(
                'scope must be a JSON object like {"image": "CloudTwo"}, '
                f"not a JSON {type(data).__name__}"
            )
        if len(data) > MAX_SCOPE_ENTRIES:  # escaped quotes can hide entries from the count
            raise ScopeError(
                f"scope names {len(data)} service types; at most {MAX_SCOPE_ENTRIES} are accepted"
            )
        entries: dict[str, Expr] = {}
        service_type_ok, plain = _SERVICE_TYPE.match, _PLAIN_NAME.match
        for service_type, value in data.items():
            if not service_type_ok(service_type):
                raise ScopeError(f"{service_type!r} is not a service type (e.g. image, compute)")
            # One cloud (the common case) is read here; anything else by the parser.
            name = plain(value) if type(value) is str and len(value) <= 256 else None
            if name is not None:
                entries[service_type] = CloudName(name.group(1))
                continue
            try:
                entries[service_type] = parse_expression(value)
            except ScopeError as exc:
                raise ScopeError(f"scope for {service_type!r}: {exc.message}") from None
        return cls.of(entries)

    def to_json(self) -> str:
        """Canonical compact JSON (sorted keys, canonical expressions): safe in a header."""
        payload = {k: format_expression(v) for k, v in self.items_}
        return json.dumps(payload, separators=(",", ":"), sort_keys=True)

    def complete(self, service_types: Iterable[str], cloud: str) -> Scope:
        """Name `cloud` for every service type this scope leaves out, except that a service
        that follows another (see :data:`FOLLOWS`) gets that service's entry when it has one."""
        entries = dict(self._index)
        missing: dict[str, Expr] = {
            st: CloudName(cloud) for st in service_types if st not in entries
        }
        if not missing:
            return self
        for follower in missing.keys() & FOLLOWS.keys():
            leader = entries.get(FOLLOWS[follower])
            if leader is not None:
                missing[follower] = leader
        return Scope.of({**entries, **missing})

    def unfollowed(self) -> frozenset[str]:
        """The service types whose workflow cannot honour this scope: those a follower is
        named elsewhere than (``{"compute": "A", "placement": "B"}`` -> ``{"compute"}``)."""
        entries = self._index
        return frozenset(
            leader
            for follower, leader in FOLLOWS.items()
            if follower in entries and leader in entries and entries[follower] != entries[leader]
        )

    def __getitem__(self, key: str) -> Expr:
        return self._index[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._index.get(key, default)

    def items(self) -> ItemsView[str, Expr]:
        return self._index.items()

    def keys(self) -> KeysView[str]:
        return self._index.keys()

    def values(self) -> ValuesView[Expr]:
        return self._index.values()

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    def __str__(self) -> str:
        return self.to_json()


Mapping.register(Scope)


def split_token(value: str) -> tuple[str, str | None]:
    """``"<token>!SCOPE!<json>"`` -> ``("<token>", "<json>")``; no scope -> ``(value, None)``."""
    token, sep, scope_text = value.partition(SCOPE_SEPARATOR)
    return (token, scope_text) if sep else (value, None)


def join_token(token: str, scope: Scope) -> str:
    """The token with the scope appended, as clients and routers send it."""
    return f"{token}{SCOPE_SEPARATOR}{scope.to_json()}"
