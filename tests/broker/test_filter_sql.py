"""The SQL92 message filter (protocol/filter_sql.py): RocketMQ's semantics case by case, the errors
and where they point, the input bounds, and fuzzing that nothing but SqlFilterError escapes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import requests as handlers
from protocol.broker_errors import BadRequestError
from protocol.filter_sql import (
    EXPRESSION_MAX_CHARS,
    NESTING_MAX,
    SqlFilter,
    SqlFilterError,
    compile_sql,
)


def test_the_seed_example_age_between_0_and_6_matches_0_to_6_only() -> None:
    f = compile_sql("age between 0 and 6")
    assert [age for age in range(10) if f.matches({"age": str(age)})] == [0, 1, 2, 3, 4, 5, 6]


def test_rocketmq_docs_examples() -> None:
    f = compile_sql("a between 0 and 3")
    assert [a for a in range(6) if f.matches({"a": str(a)})] == [0, 1, 2, 3]
    both = compile_sql("(TAGS is not null and TAGS in ('TagA', 'TagB')) "
                       "and (a is not null and a between 0 and 3)")
    assert both.matches({"a": "2"}, "TagA")
    assert both.matches({"a": "0"}, "TagB")
    assert not both.matches({"a": "2"}, "TagC")
    assert not both.matches({"a": "2"}, "")  # no tag: TAGS is NULL
    assert not both.matches({"a": "4"}, "TagA")
    assert not both.matches({}, "TagA")
    principle = compile_sql("a > 5 AND b = 'abc'")
    assert principle.matches({"a": "10", "b": "abc", "c": "true"})
    assert not principle.matches({"a": "1", "b": "abc", "c": "true"})


CASES = [
    # numbers: a property is read as the literal's type
    ("a = 5", {"a": "5"}, "", True),
    ("a = 5", {"a": "05"}, "", True),
    ("a = 5", {"a": "+5"}, "", True),
    ("a = 5", {"a": " 5"}, "", False),  # no whitespace around a number
    ("a = '5'", {"a": "05"}, "", False),  # against a string: compared as strings
    ("a > 3", {"a": "3.5"}, "", False),  # an integer literal reads a long; 3.5 is not one
    ("a > 3.0", {"a": "3.5"}, "", True),
    ("a > 3.0", {"a": "4"}, "", True),
    ("a < 1e3", {"a": "999.9"}, "", True),
    ("a >= .5", {"a": "0.5"}, "", True),
    ("a = 1L", {"a": "1"}, "", True),
    ("a > -2", {"a": "-1"}, "", True),
    ("a = - -2", {"a": "2"}, "", True),
    ("a = 9223372036854775807", {"a": "9223372036854775807"}, "", True),
    ("a > 0", {"a": "9223372036854775808"}, "", False),  # beyond a long: UNKNOWN
    ("5 < a", {"a": "6"}, "", True),
    ("a > b", {"a": "20", "b": "10"}, "", True),  # two properties: read as doubles
    ("a > b", {"a": "x", "b": "10"}, "", False),
    ("a = b", {"a": "3.14", "b": "3.14"}, "", True),  # ... and as strings for =
    ("1 = 1", {}, "", True),
    ("'5' = 5", {}, "", True),
    # unreadable values are UNKNOWN, which NOT keeps UNKNOWN
    ("a > 3", {"a": "abc"}, "", False),
    ("NOT (a > 3)", {"a": "abc"}, "", False),
    ("a > 3 OR b = 'x'", {"a": "abc", "b": "x"}, "", True),
    # NULL: missing properties
    ("a = 5", {}, "", False),
    ("a <> 5", {}, "", False),
    ("NOT (a = 5)", {}, "", False),
    ("NOT (a = 5)", {"a": "6"}, "", True),
    ("a IS NULL", {}, "", True),
    ("a IS NULL", {"a": ""}, "", False),  # an empty value is a value
    ("a IS NOT NULL", {"a": "x"}, "", True),
    ("a = b", {}, "", False),  # two NULLs: UNKNOWN (RocketMQ says TRUE)
    ("'x' <> a", {}, "", False),  # either side NULL: UNKNOWN (RocketMQ: TRUE this way round)
    ("a = 1 AND b = 'x'", {"a": "1"}, "", False),  # TRUE AND UNKNOWN
    ("a = 1 OR b = 'x'", {"a": "1"}, "", True),  # TRUE OR UNKNOWN
    ("NOT (a = 2 AND b = 'x')", {"a": "1"}, "", True),  # FALSE AND UNKNOWN is FALSE
    # TAGS is the message's tag, never a user property
    ("TAGS IS NULL", {}, "", True),
    ("TAGS = 'TagA'", {}, "TagA", True),
    ("TAGS = 'TagA'", {"TAGS": "TagA"}, "", False),
    # BETWEEN: inclusive, numeric
    ("a BETWEEN 1 AND 3", {"a": "1"}, "", True),
    ("a BETWEEN 1 AND 3", {"a": "3"}, "", True),
    ("a BETWEEN 1 AND 3", {"a": "4"}, "", False),
    ("a BETWEEN 1 AND 1", {"a": "1"}, "", True),
    ("a NOT BETWEEN 1 AND 3", {"a": "4"}, "", True),
    ("a NOT BETWEEN 1 AND 3", {"a": "2"}, "", False),
    ("a NOT BETWEEN 1 AND 3", {}, "", False),
    ("a BETWEEN -5 AND -1", {"a": "-3"}, "", True),
    ("a BETWEEN 0.5 AND 1.5", {"a": "1"}, "", True),
    ("a BETWEEN 0 AND 1.5", {"a": "1"}, "", True),  # mixed bounds
    ("a BETWEEN 0 AND b", {"a": "1", "b": "2"}, "", True),  # a property bound
    ("a BETWEEN 0 AND 10", {"a": "ten"}, "", False),
    # IN, NOT IN: strings, case-sensitive
    ("b IN ('x', 'y')", {"b": "y"}, "", True),
    ("b IN ('x', 'y')", {"b": "z"}, "", False),
    ("b IN ('X')", {"b": "x"}, "", False),
    ("b NOT IN ('x', 'y')", {"b": "z"}, "", True),
    ("b NOT IN ('x', 'y')", {}, "", False),
    # CONTAINS and its kin: FALSE (not UNKNOWN) on NULL, as RocketMQ
    ("b CONTAINS 'bc'", {"b": "abc"}, "", True),
    ("b STARTSWITH 'ab'", {"b": "abc"}, "", True),
    ("b ENDSWITH 'ab'", {"b": "abc"}, "", False),
    ("b NOT ENDSWITH 'ab'", {"b": "abc"}, "", True),
    ("b CONTAINS ''", {"b": "abc"}, "", False),
    ("b NOT CONTAINS 'x'", {}, "", False),
    ("NOT (b CONTAINS 'x')", {}, "", True),
    # precedence and parentheses: NOT > AND > OR
    ("a = 1 OR a = 2 AND b = 'x'", {"a": "1", "b": "y"}, "", True),
    ("(a = 1 OR a = 2) AND b = 'x'", {"a": "1", "b": "y"}, "", False),
    ("NOT (a = 1) AND b = 'x'", {"a": "2", "b": "x"}, "", True),
    ("NOT (a = 1 OR b = 'x')", {"a": "2", "b": "y"}, "", True),
    ("NOT NOT (a = 1)", {"a": "1"}, "", True),
    ("((((a = 1))))", {"a": "1"}, "", True),
    # TRUE, FALSE, NULL
    ("TRUE", {}, "", True),
    ("FALSE", {}, "", False),
    ("NULL", {}, "", False),
    ("NOT (NULL)", {}, "", False),
    ("NULL OR TRUE", {}, "", True),
    ("flag = TRUE", {"flag": "TRUE"}, "", True),
    ("flag <> TRUE", {"flag": "false"}, "", True),
    ("flag = FALSE", {"flag": "yes"}, "", False),  # neither true nor false: UNKNOWN
    # strings and quotes
    ("b = 'it''s'", {"b": "it's"}, "", True),
    ("b = ''''", {"b": "'"}, "", True),
    ("b = ''", {"b": ""}, "", True),
    ("b = 'a b'", {"b": "a b"}, "", True),
    # case: keywords are not, names are
    ("A_1 bEtWeEn 0 aNd 6 Or a Is NoT nUlL", {"A_1": "3"}, "", True),
    ("B = 'x'", {"b": "x"}, "", False),
    ("$x = 1 and _y = 2", {"$x": "1", "_y": "2"}, "", True),
    # comments, as RocketMQ's grammar skips them
    ("a = 1 -- the rest of the line", {"a": "1"}, "", True),
    ("/* first */ a = 1 /* and */", {"a": "1"}, "", True),
    ("a = 1 --\nOR a = 2", {"a": "2"}, "", True),
]


@pytest.mark.parametrize(("expression", "properties", "tags", "expected"), CASES)
def test_case(expression: str, properties: dict[str, str], tags: str, expected: bool) -> None:
    assert compile_sql(expression).matches(properties, tags) is expected


def test_the_case_table_is_big_enough() -> None:
    assert len(CASES) >= 40
    assert {e for *_, e in CASES} == {True, False}


MALFORMED = [
    ("", 0, "expected a condition, found the end"),
    ("   ", 3, "expected a condition"),
    ("a", 1, "a comparison after 'a'"),
    ("5", 1, "a comparison after '5'"),
    ("a =", 3, "a property, a quoted string or a number"),
    ("a == 1", 3, "a property, a quoted string or a number, found '='"),
    ("a = -b", 5, "a property, a quoted string or a number, found 'b'"),
    ("and = 1", 0, "expected a condition, found 'and'"),
    ("a = 1 b = 2", 6, "AND, OR or the end of the expression, found 'b'"),
    ("a = 1 = 2", 6, "AND, OR or the end"),
    ("(a = 1", 6, "')', AND or OR"),
    ("a = 1)", 5, "AND, OR or the end"),
    ("NOT a = 1", 4, "'(' after NOT"),
    ("a > 'x'", 4, "'>' compares numbers, not 'x'"),
    ("a < TRUE", 4, "compares numbers"),
    ("a = NULL", 4, "NULL cannot be compared"),
    ("a IN (1)", 6, "a quoted string in the list"),
    ("a IN ()", 6, "a quoted string in the list"),
    ("a IN ('x'", 9, "',' or ')' in the list"),
    ("a IN 'x'", 5, "'(' after IN"),
    ("'x' IN ('x')", 0, "IN needs a property"),
    ("a BETWEEN 5 AND 1", 10, "low bound 5 is above 1"),
    ("a BETWEEN 1 OR 2", 12, "AND between the bounds"),
    ("a BETWEEN 'a' AND 'b'", 10, "compares numbers"),
    ("a IS 1", 5, "NULL or NOT NULL after IS"),
    ("a NOT LIKE 'x'", 6, "BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT"),
    ("a CONTAINS 5", 11, "a quoted string after CONTAINS"),
    ("a = 'abc", 4, "unterminated string"),
    ("a = 1 /* x", 6, "unterminated comment"),
    ("a != 1", 2, "unexpected character '!'"),
    ("a.b = 1", 1, "unexpected character '.'"),  # no dots in names, as RocketMQ
    ("a = 99999999999999999999", 4, "out of the 64-bit integer range"),
    ("a = -9223372036854775809", 4, "out of the 64-bit integer range"),
    ("a = 1e999", 4, "out of the double range"),
]


@pytest.mark.parametrize(("expression", "offset", "message"), MALFORMED)
def test_malformed_expressions_name_the_offset_and_what_was_expected(
        expression: str, offset: int, message: str) -> None:
    with pytest.raises(SqlFilterError) as info:
        compile_sql(expression)
    assert info.value.offset == offset
    assert f"at offset {offset}:" in str(info.value)
    assert message in str(info.value)


def test_the_error_is_a_bad_request_and_a_value_error() -> None:
    with pytest.raises(BadRequestError):
        compile_sql("a =")
    with pytest.raises(ValueError):
        compile_sql("a =")
    assert SqlFilterError(3, "x").code == "BAD_REQUEST"


def test_the_extremes_of_a_long_are_literals() -> None:
    assert compile_sql("a = -9223372036854775808").matches({"a": "-9223372036854775808"})
    assert compile_sql("a = 0").matches({"a": "-000"})


def test_nesting_is_bounded() -> None:
    deep_ok = "(" * NESTING_MAX + "a = 1" + ")" * NESTING_MAX
    assert compile_sql(deep_ok).matches({"a": "1"})
    with pytest.raises(SqlFilterError, match=f"offset {NESTING_MAX}: more than {NESTING_MAX}"):
        compile_sql("(" * (NESTING_MAX + 1) + "a = 1" + ")" * (NESTING_MAX + 1))
    nots = "NOT " * (NESTING_MAX + 1) + "(a = 1)"
    with pytest.raises(SqlFilterError, match=f"offset {4 * NESTING_MAX}: more than"):
        compile_sql(nots)
    # a hostile expression within the length bound is refused, not a RecursionError
    with pytest.raises(SqlFilterError):
        compile_sql("(" * EXPRESSION_MAX_CHARS)


def test_length_is_bounded_like_the_handlers_bound() -> None:
    assert EXPRESSION_MAX_CHARS == handlers.EXPRESSION_MAX_CHARS
    longest = "a = 1" + " " * (EXPRESSION_MAX_CHARS - 5)
    assert compile_sql(longest).matches({"a": "1"})
    with pytest.raises(SqlFilterError, match=f"offset {EXPRESSION_MAX_CHARS}: .* 4097 characters"):
        compile_sql(longest + " ")


def test_a_long_flat_expression_is_fine() -> None:
    many = " OR ".join(f"a = {i}" for i in range(360))
    assert len(many) <= EXPRESSION_MAX_CHARS
    f = compile_sql(many)
    assert f.matches({"a": "359"}) and not f.matches({"a": "360"})


def test_properties_names_what_the_expression_reads() -> None:
    f = compile_sql("TAGS IN ('x') AND (a > 1 OR b IS NULL) AND NOT (c CONTAINS 'z')")
    assert f.properties == frozenset({"TAGS", "a", "b", "c"})
    assert compile_sql("TRUE").properties == frozenset()
    assert isinstance(f, SqlFilter) and f.text.startswith("TAGS")


def test_a_non_string_expression_is_refused() -> None:
    with pytest.raises(SqlFilterError, match="must be a string"):
        compile_sql(42)  # type: ignore[arg-type]  # deliberately the wrong type


# -- fuzzing ----------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2))
NAMES = ["a", "b", "TAGS", "x_1", "$y"]
SOUP = ["a", "b", "TAGS", "NOT", "not", "AND", "OR", "BETWEEN", "IN", "IS", "NULL", "TRUE",
        "FALSE", "CONTAINS", "STARTSWITH", "ENDSWITH", "(", ")", ",", "=", "<>", "<", "<=", ">",
        ">=", "+", "-", "0", "7", "-3", "2.5", ".5", "1e3", "1e999", "99999999999999999999",
        "'x'", "''", "'it''s'", "'", "--", "/*", "*/", "!", ".", "5L", "\n"]
VALUES = st.one_of(st.text(max_size=8), st.integers(-10, 10).map(str),
                   st.sampled_from(["true", "FALSE", "1.5", "-0", "1e3", "9223372036854775808",
                                    "0" * 5000 + "1", "NaN", ""]))
PROPERTIES = st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=4)
TAGS = st.sampled_from(["", "x", "TagA", "'"])


def _compiles_or_refuses(text: str) -> SqlFilter | None:
    try:
        return compile_sql(text)
    except SqlFilterError:
        return None


@FUZZ
@given(st.text(max_size=120), PROPERTIES, TAGS)
def test_arbitrary_text_raises_only_sql_filter_errors(text: str, props: dict[str, str],
                                                      tags: str) -> None:
    f = _compiles_or_refuses(text)
    if f is not None:
        assert f.matches(props, tags) in (True, False)


@FUZZ
@given(st.lists(st.sampled_from(SOUP), max_size=16), st.sampled_from([" ", ""]), PROPERTIES, TAGS)
def test_token_soup_raises_only_sql_filter_errors(words: list[str], sep: str,
                                                  props: dict[str, str], tags: str) -> None:
    f = _compiles_or_refuses(sep.join(words))
    if f is not None:
        assert f.matches(props, tags) in (True, False)


NUMBER = st.one_of(st.integers(-100, 100).map(str), st.sampled_from(["1.5", "-2.5", "1e2"]))
OPERAND = st.one_of(st.sampled_from(NAMES), NUMBER)
STRING = st.sampled_from(["'x'", "'TagA'", "''", "'it''s'", "'5'"])
COMPARISON = st.one_of(
    st.builds(lambda n, op, v: f"{n} {op} {v}", st.sampled_from(NAMES),
              st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), OPERAND),
    st.builds(lambda n, op, s: f"{n} {op} {s}", st.sampled_from(NAMES),
              st.sampled_from(["=", "<>", "CONTAINS", "NOT STARTSWITH"]), STRING),
    st.builds(lambda n, neg, lo, span: f"{n} {neg}BETWEEN {lo} AND {lo + span}",
              st.sampled_from(NAMES), st.sampled_from(["", "NOT "]), st.integers(-5, 5),
              st.integers(0, 5)),
    st.builds(lambda n, neg, ss: f"{n} {neg}IN ({', '.join(ss)})", st.sampled_from(NAMES),
              st.sampled_from(["", "NOT "]), st.lists(STRING, min_size=1, max_size=3)),
    st.builds(lambda n, neg: f"{n} IS {neg}NULL", st.sampled_from(NAMES),
              st.sampled_from(["", "NOT "])),
    st.sampled_from(["TRUE", "FALSE", "NULL"]))
CONDITION = st.recursive(COMPARISON, lambda inner: st.one_of(
    st.builds(lambda e: f"NOT ({e})", inner),
    st.builds(lambda a, op, b: f"({a}) {op} ({b})", inner, st.sampled_from(["AND", "OR"]), inner),
    st.builds(lambda a, op, b: f"{a} {op} {b}", inner, st.sampled_from(["AND", "OR"]), inner)),
    max_leaves=8)


@FUZZ
@given(CONDITION, PROPERTIES, TAGS)
def test_well_formed_expressions_compile_and_never_raise(text: str, props: dict[str, str],
                                                          tags: str) -> None:
    f = compile_sql(text)
    negated = compile_sql(f"NOT ({text})")
    matched, negated_matched = f.matches(props, tags), negated.matches(props, tags)
    assert matched in (True, False)
    assert not (matched and negated_matched)  # UNKNOWN matches neither, never both
