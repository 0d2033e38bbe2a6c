"""RocketMQ's SQL92 message filter (``MessageSelector.bySql``): a tokenizer, a recursive-descent
parser, and predicates compiled once into nested closures. Pure (the state machine's side); owns
the language, not which messages a pull reads. A filter sees a message's user properties and
``TAGS``, its tag (NULL when it has none; a user property named TAGS is never seen). Keywords are
case-insensitive, names case-sensitive; ``--`` and ``/* */`` comments are skipped, as RocketMQ::

    expr    := and (OR and)*          and := cond (AND cond)*
    cond    := NOT cond | '(' expr ')' | TRUE | FALSE | NULL | operand test
    operand := NAME | 'str''ing' | ('+'|'-')* number | TRUE | FALSE | NULL
    test    := ('=' | '<>' | '<' | '<=' | '>' | '>=') operand | IS [NOT] NULL
             | [NOT] BETWEEN operand AND operand | [NOT] IN ('s' (, 's')*)
             | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) 's'

NAME is ``[A-Za-z_$][A-Za-z0-9_$]*`` (no dots, as RocketMQ); numbers are 64-bit integers (``L``
optional) or finite decimals. NOT must be followed by '(': RocketMQ's grammar reads ``NOT a = 1``
as ``(NOT a) = 1``, never true, so refusing that form keeps every accepted expression's meaning.

Logic is RocketMQ's three-valued one: a comparison with a missing property is UNKNOWN, NOT UNKNOWN
is UNKNOWN, AND/OR are Kleene's, and only TRUE matches. Against a number a property is read as the
literal's type (a long for an integer, a double for a decimal); against TRUE/FALSE it must read
'true' or 'false'. A value that does not read is UNKNOWN too (RocketMQ throws and drops the
message; so a filter here matches exactly when RocketMQ's does for some order of AND/OR operands).
Strings compare with =, <> and IN only; <, >, BETWEEN take numbers (two properties: both read as
doubles). CONTAINS and its kin are FALSE, not UNKNOWN, on a missing property, as in RocketMQ.
RocketMQ's = treats NULL by side ('x' <> a matches a missing a; a = b two missing ones): here any
comparison with a NULL side is UNKNOWN.
Malformed input raises :class:`SqlFilterError`, naming a 0-based character offset.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.broker_errors import BadRequestError

__all__ = ["EXPRESSION_MAX_CHARS", "NESTING_MAX", "SqlFilter", "SqlFilterError", "compile_sql"]

EXPRESSION_MAX_CHARS = 4096  # the same bound as broker.core.requests' (a test keeps them equal)
NESTING_MAX = 64  # '(' and NOT levels: bounds the parser's and the evaluator's recursion
LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1

Value = str | int | float  # bool is an int: TRUE and FALSE are Python's True and False
Getter = Callable[[Mapping[str, str], str], Value | None]
Pred = Callable[[Mapping[str, str], str], bool | None]  # None: UNKNOWN


class SqlFilterError(BadRequestError, ValueError):
    """A malformed SQL92 filter expression; ``offset`` is the 0-based character offset. A
    ValueError too, so a request field's check may let it through as the reason."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(f"SQL filter at offset {offset}: {message}")
        self.offset = offset


# -- reading property values ------------------------------------------------------------------

_LONG = re.compile(r"([+-]?)0*([0-9]{1,19})")  # zeros and '+' may lead, as Java's Long.valueOf
_DOUBLE = re.compile(r"[+-]?(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][+-]?[0-9]++)?")
_BOOLS = {"true": True, "false": False}


def _to_long(s: str) -> int | None:
    m = _LONG.fullmatch(s)
    if m is None:
        return None
    v = -int(m[2]) if m[1] == "-" else int(m[2])  # 19 digits at most: int() is cheap
    return v if LONG_MIN <= v <= LONG_MAX else None


def _to_double(s: str) -> float | None:
    return float(s) if _DOUBLE.fullmatch(s) is not None else None  # decimal notation only


# How a property's string is read to compare with a constant of this type (str: as it is).
_READERS: dict[type, Callable[[str], Value | None]] = {
    bool: lambda s: _BOOLS.get(s.lower()) if len(s) <= 5 else None,
    int: _to_long, float: _to_double, str: lambda s: s}


def _coerce(lv: Value, rv: Value, ordered: bool) -> tuple[Value, Value] | None:
    """Both values in one type, RocketMQ's way (a string takes the other side's type; two
    strings stay strings for = and <>, and are read as doubles to be ordered), or None."""
    lc: Value | None = lv
    rc: Value | None = rv
    if isinstance(lv, str) and isinstance(rv, str):
        if ordered:
            lc, rc = _to_double(lv), _to_double(rv)
    elif isinstance(lv, str):
        lc = _READERS[type(rv)](lv)
    elif isinstance(rv, str):
        rc = _READERS[type(lv)](rv)
    if lc is None or rc is None or (type(lc) is bool) != (type(rc) is bool):
        return None  # unreadable, or a truth value against a number
    return lc, rc


# -- predicates: closures over (properties, tags) returning True, False or None ---------------

_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge}
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "<>": "<>"}
_TEXT_TESTS: dict[str, Callable[[str, str], bool]] = {
    "CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}


@dataclass(frozen=True, slots=True)
class _Operand:
    name: str | None  # a property, or None for a constant
    value: Value | None  # the constant (None: NULL)
    offset: int

    def getter(self) -> Getter:
        if self.name is None:
            c = self.value
            return lambda p, t: c
        return _property(self.name)


def _property(name: str) -> Callable[[Mapping[str, str], str], str | None]:
    if name == "TAGS":
        return lambda p, t: t or None  # the entry codec's "" is "no tag"
    return lambda p, t: p.get(name)


def _compare(op: str, left: _Operand, right: _Operand) -> Pred:
    if left.name is None and right.name is not None:
        left, right, op = right, left, _MIRROR[op]
    test = _CMP[op]
    if left.name is not None and right.name is None and right.value is not None:
        c = right.value  # the common case: a property against a constant
        get_prop, read = _property(left.name), _READERS[type(c)]
        if type(c) is str:
            return lambda p, t: None if (raw := get_prop(p, t)) is None else test(raw, c)

        def prop_vs_const(p: Mapping[str, str], t: str) -> bool | None:
            raw = get_prop(p, t)
            v = None if raw is None else read(raw)
            return None if v is None else test(v, c)
        return prop_vs_const
    get, get_right, ordered = left.getter(), right.getter(), op not in ("=", "<>")

    def general(p: Mapping[str, str], t: str) -> bool | None:
        lv, rv = get(p, t), get_right(p, t)
        pair = None if lv is None or rv is None else _coerce(lv, rv, ordered)
        return None if pair is None else test(pair[0], pair[1])
    return general


def _range(name: str, low: float, high: float, negate: bool) -> Pred:
    """``name [NOT] BETWEEN low AND high`` with constant bounds of one type: read once."""
    get = _property(name)
    read: Callable[[str], float | None] = _to_long if type(low) is int else _to_double

    def in_range(p: Mapping[str, str], t: str) -> bool | None:
        raw = get(p, t)
        v = None if raw is None else read(raw)
        return None if v is None else (low <= v <= high) is not negate
    return in_range


def _junction(preds: list[Pred], decisive: bool) -> Pred:
    """Kleene's AND (``decisive`` False) or OR (True): one decisive operand decides, else any
    UNKNOWN makes the whole UNKNOWN."""
    if len(preds) == 1:
        return preds[0]
    fs = tuple(preds)

    def junction(p: Mapping[str, str], t: str) -> bool | None:
        unknown = False
        for f in fs:
            r = f(p, t)
            if r is decisive:
                return decisive
            unknown = unknown or r is None
        return None if unknown else not decisive
    return junction


def _not(f: Pred) -> Pred:
    return lambda p, t: None if (r := f(p, t)) is None else not r


def _text_test(kind: str, negate: bool, get: Getter, search: str) -> Pred:
    method = _TEXT_TESTS[kind]

    def text_test(p: Mapping[str, str], t: str) -> bool | None:
        v = get(p, t)
        if not search or type(v) is not str:
            return False  # RocketMQ: FALSE, not UNKNOWN, negated or not
        return method(v, search) is not negate
    return text_test


# -- tokens -----------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<skip>[ \t\n\r\f]+ | --[^\n\r]* | /\*.*?\*/)
  | (?P<num>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)? | [0-9]+[eE][+-]?[0-9]+ | [0-9]+[lL]?)
  | (?P<name>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<str>'(?:[^']|'')*')
  | (?P<op><>|<=|>=|[=<>(),+-])""", re.VERBOSE | re.DOTALL)
_INTEGER = re.compile(r"[0-9]+[lL]?")
KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS",
                      "CONTAINS", "STARTSWITH", "ENDSWITH"})
_CONSTANTS = {"TRUE": True, "FALSE": False, "NULL": None}
_TESTS = ("IS", "NOT", "BETWEEN", "IN", *_TEXT_TESTS)  # keywords that start a test


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "kw" (value upper-cased), "name", "str" (value unquoted), "num", "op" or "end"
    value: str
    offset: int
    text: str  # as written, for error messages


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SqlFilterError(pos, "an unterminated string" if text[pos] == "'"
                                 else "an unterminated comment" if text.startswith("/*", pos)
                                 else f"an unexpected character {text[pos]!r}")
        kind, raw = m.lastgroup or "", m.group()
        if kind == "name" and raw.upper() in KEYWORDS:
            out.append(_Token("kw", raw.upper(), pos, raw))
        elif kind == "str":
            out.append(_Token(kind, raw[1:-1].replace("''", "'"), pos, raw))
        elif kind != "skip":
            out.append(_Token(kind, raw, pos, raw))
        pos = m.end()
    out.append(_Token("end", "", len(text), ""))
    return out


def _number(tok: _Token, negative: bool, offset: int) -> Value:
    """The literal's value; ``offset`` is where it starts (its first sign)."""
    shown = ("-" if negative else "") + tok.text[:40]
    if _INTEGER.fullmatch(tok.value):
        digits = tok.value.rstrip("lL").lstrip("0") or "0"
        v = int(digits) * (-1 if negative else 1) if len(digits) <= 19 else LONG_MAX + 1
        if not LONG_MIN <= v <= LONG_MAX:
            raise SqlFilterError(offset, f"{shown} is out of the 64-bit integer range")
        return v
    d = float(tok.value)
    if not math.isfinite(d):
        raise SqlFilterError(offset, f"{shown} is out of the double range")
    return -d if negative else d


def _check_compared(op: _Token, left: _Operand, right: _Operand) -> None:
    """RocketMQ's checks when it builds a comparison: no NULL, only numbers for ordering."""
    for side in (left, right):
        v = side.value
        if side.name is not None:
            continue
        if v is None:
            raise SqlFilterError(side.offset, f"NULL cannot be compared with {op.text!r} "
                                              "(use IS NULL or IS NOT NULL)")
        if op.value not in ("=", "<>") and (type(v) is str or type(v) is bool):
            raise SqlFilterError(side.offset, f"{op.text!r} compares numbers, not {v!r}")


# -- the parser -------------------------------------------------------------------------------

class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0
        self.names: set[str] = set()

    def at(self, kind: str, *values: str) -> bool:
        t = self.toks[self.i]
        return t.kind == kind and (not values or t.value in values)

    def take(self) -> _Token:
        self.i += 1
        return self.toks[self.i - 1]

    def fail(self, expected: str, tok: _Token | None = None) -> SqlFilterError:
        t = tok or self.toks[self.i]
        found = "the end of the expression" if t.kind == "end" else repr(t.text[:40])
        return SqlFilterError(t.offset, f"expected {expected}, found {found}")

    def expect(self, kind: str, expected: str, *values: str) -> _Token:
        if not self.at(kind, *values):
            raise self.fail(expected)
        return self.take()

    def expr(self, word: str = "OR") -> Pred:
        """ORs of ANDs of conditions: one loop per level (the evaluator keeps them n-ary)."""
        part: Callable[[], Pred] = (lambda: self.expr("AND")) if word == "OR" else self.condition
        preds = [part()]
        while self.at("kw", word):
            self.take()
            preds.append(part())
        return _junction(preds, word == "OR")

    def condition(self) -> Pred:
        tok = self.toks[self.i]
        if self.at("kw", "NOT") or self.at("op", "("):
            self.depth += 1
            if self.depth > NESTING_MAX:
                raise SqlFilterError(tok.offset, f"more than {NESTING_MAX} levels of "
                                                 "parentheses and NOT")
            self.take()
            if tok.value == "NOT":
                if not (self.at("op", "(") or self.at("kw", "NOT")):
                    raise self.fail("'(' after NOT (write NOT (a = 1): RocketMQ would read "
                                    "NOT a = 1 as (NOT a) = 1)")
                pred = _not(self.condition())
            else:
                pred = self.expr()
                self.expect("op", "')', AND or OR", ")")
            self.depth -= 1
            return pred
        if not (tok.kind in ("name", "str", "num") or self.at("op", "+", "-")
                or self.at("kw", *_CONSTANTS)):
            raise self.fail("a condition")
        left = self.operand()
        test = self.test(left)
        if test is not None:
            return test
        if left.name is None and (left.value is None or type(left.value) is bool):
            c = None if left.value is None else bool(left.value)
            return lambda p, t: c  # TRUE, FALSE or NULL standing alone
        raise self.fail(f"a comparison after {tok.text[:40]!r}")

    def operand(self) -> _Operand:
        tok = start = self.take()
        if tok.kind == "name":
            self.names.add(tok.value)
            return _Operand(tok.value, None, tok.offset)
        if tok.kind == "str":
            return _Operand(None, tok.value, tok.offset)
        if tok.kind == "kw" and tok.value in _CONSTANTS:
            return _Operand(None, _CONSTANTS[tok.value], tok.offset)
        negative = False
        while tok.kind == "op" and tok.value in ("+", "-"):
            negative ^= tok.value == "-"
            tok = self.take()
        if tok.kind != "num":
            raise self.fail("a property, a quoted string or a number", tok)
        return _Operand(None, _number(tok, negative, start.offset), start.offset)

    def test(self, left: _Operand) -> Pred | None:
        """The test after operand ``left``, or None when none follows."""
        tok = self.toks[self.i]
        if tok.kind == "op" and tok.value in _CMP:
            self.take()
            right = self.operand()
            _check_compared(tok, left, right)
            return _compare(tok.value, left, right)
        if not self.at("kw", *_TESTS):
            return None
        self.take()
        if tok.value == "IS":
            negate = self.at("kw", "NOT")
            if negate:
                self.take()
            self.expect("kw", "NULL or NOT NULL after IS", "NULL")
            get = left.getter()
            return (lambda p, t: get(p, t) is not None) if negate else (lambda p, t: get(p, t) is None)
        negate, kw = tok.value == "NOT", tok
        if negate:
            kw = self.expect("kw", "BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT",
                             *_TESTS[2:])
        if kw.value == "BETWEEN":
            return self.between(kw, left, negate)
        if kw.value == "IN":
            return self.in_list(kw, left, negate)
        search = self.expect("str", f"a quoted string after {kw.text}")
        return _text_test(kw.value, negate, left.getter(), search.value)

    def between(self, kw: _Token, left: _Operand, negate: bool) -> Pred:
        low = self.operand()
        self.expect("kw", "AND between the bounds of BETWEEN", "AND")
        high = self.operand()
        _check_compared(kw, left, low)
        _check_compared(kw, left, high)
        lo, hi = low.value, high.value
        if low.name is None and high.name is None and isinstance(lo, (int, float)) \
                and isinstance(hi, (int, float)):
            if lo > hi:  # RocketMQ refuses it too
                raise SqlFilterError(low.offset, f"BETWEEN's low bound {lo} is above {hi}")
            if left.name is not None and type(lo) is type(hi):
                return _range(left.name, lo, hi, negate)
        if negate:  # as RocketMQ: a < low OR a > high
            return _junction([_compare("<", left, low), _compare(">", left, high)], True)
        return _junction([_compare(">=", left, low), _compare("<=", left, high)], False)

    def in_list(self, kw: _Token, left: _Operand, negate: bool) -> Pred:
        if left.name is None:
            raise SqlFilterError(left.offset, f"{kw.text} needs a property on its left")
        self.expect("op", f"'(' after {kw.text}", "(")
        members = {self.expect("str", "a quoted string in the list").value}
        while self.at("op", ","):
            self.take()
            members.add(self.expect("str", "a quoted string in the list").value)
        self.expect("op", "',' or ')' in the list", ")")
        get, frozen = _property(left.name), frozenset(members)
        return lambda p, t: None if (v := get(p, t)) is None else (v in frozen) is not negate


@dataclass(frozen=True, slots=True)
class SqlFilter:
    """A compiled filter. ``matches`` never raises, whatever the property map holds."""

    text: str
    properties: frozenset[str]  # the names the expression reads (TAGS included)
    _pred: Pred = field(repr=False)

    def matches(self, properties: Mapping[str, str], tags: str = "") -> bool:
        """Whether a message with these user properties and tag ("": none) matches: only TRUE
        does, FALSE and UNKNOWN do not."""
        return self._pred(properties, tags) is True


def compile_sql(text: str) -> SqlFilter:
    """Parse ``text`` once; raises :class:`SqlFilterError` saying where and what was expected."""
    if type(text) is not str:
        raise SqlFilterError(0, f"the expression must be a string, not {type(text).__name__}")
    if len(text) > EXPRESSION_MAX_CHARS:
        raise SqlFilterError(EXPRESSION_MAX_CHARS, f"the expression has {len(text)} characters, "
                                                   f"more than {EXPRESSION_MAX_CHARS}")
    parser = _Parser(text)
    pred = parser.expr()
    if not parser.at("end"):
        raise parser.fail("AND, OR or the end of the expression")
    return SqlFilter(text, frozenset(parser.names), pred)
