"""Kubernetes quantities (issue #2, Rules: "the full Kubernetes grammar ... fractional bytes round up").

Written from the spec and the API machinery's grammar:

    <quantity> ::= <signedNumber><suffix>
    <suffix>   ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI> ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI> ::= m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from memqos_systemd.quantity import MAX_BYTES, QuantityError, format_bytes, parse_bytes, parse_quantity

Ki, Mi, Gi, Ti, Pi, Ei = (2**(10 * i) for i in range(1, 7))


# The issue's own examples: all five spellings of (about) 129 MB.
@pytest.mark.parametrize("text, expected", [
    ("128974848", 128974848),
    ("129e6", 129_000_000),
    ("129M", 129_000_000),
    ("123Mi", 128974848),
    ("1.5Gi", 1610612736),
    ("500m", 1),  # half a byte rounds up to a whole one
])
def test_issue_examples(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, expected", [
    # plain numbers
    ("0", 0), ("1", 1), ("007", 7), ("0.0", 0), ("1.", 1), (".5", 1), ("0.1", 1),
    ("1.0", 1), ("2.5", 3),
    # binary suffixes
    ("1Ki", Ki), ("1Mi", Mi), ("1Gi", Gi), ("1Ti", Ti), ("1Pi", Pi), ("1Ei", Ei),
    ("0.5Ki", 512), (".5Ki", 512), ("1.Mi", Mi), ("1.5Gi", 3 * Gi // 2), ("0Mi", 0),
    ("1.1Ki", 1127),  # 1126.4 -> 1127
    # decimal suffixes
    ("1k", 1000), ("1M", 10**6), ("1G", 10**9), ("1T", 10**12), ("1P", 10**15), ("1E", 10**18),
    ("1m", 1), ("1000m", 1), ("1001m", 2), ("2000m", 2), ("0m", 0), ("1.5k", 1500), ("1.0001k", 1001),
    # exponents (either case of e, optional sign)
    ("1e3", 1000), ("1E3", 1000), ("1e+3", 1000), ("1e0", 1), ("1.5e3", 1500), ("12e-1", 2),
    ("1e-3", 1), ("0e9", 0), (".5e1", 5), ("129E6", 129_000_000),
    # signs: a leading + is allowed
    ("+1Ki", Ki), ("+0", 0), ("-0", 0), ("-0Mi", 0),
])
def test_grammar(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, exact", [
    ("500m", Fraction(1, 2)),
    ("1.5Gi", Fraction(3 * Gi, 2)),
    ("-1Mi", Fraction(-Mi)),
    ("-500m", Fraction(-1, 2)),
    ("+2k", Fraction(2000)),
    ("1e-3", Fraction(1, 1000)),
    ("0.1", Fraction(1, 10)),
])
def test_parse_quantity_is_exact(text, exact):
    # Exact rational values, so 0.1 stays 1/10 and the rounding happens once, at the end.
    assert parse_quantity(text) == exact


@pytest.mark.parametrize("text", ["-1", "-1Mi", "-500m", "-1e3", -1, -0.5])
def test_negative_sizes_are_refused(text):
    with pytest.raises(QuantityError, match="negative"):
        parse_bytes(text)


@pytest.mark.parametrize("text", [
    "", " ", "abc", "Mi", "1Mb", "1MB", "1mi", "1KI", "1K", "1ki", "1 Mi", "1.2.3", "1e", "1e+",
    "1e3Mi", "1Mi1", "0x10", "1_000", "1,5Gi", "--1", "+-1", "1..5", "1Gi%", "1Mi/2", "∞", "١٢٣",  # arabic digits
    "１２３", "1\u00a0Mi", "Infinity", "nan", "1Mii", "e3", ".e3", ".", "+", "-", "1ee3",
])
def test_garbage_is_refused(text):
    with pytest.raises(QuantityError):
        parse_bytes(text)


def test_error_names_the_value():
    with pytest.raises(QuantityError) as e:
        parse_bytes("12Mb")
    assert "'12Mb'" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text, expected", [
    ("9223372036854775807", MAX_BYTES),
    ("7Ei", 7 * Ei),
    ("9E", 9 * 10**18),
])
def test_largest_values(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", [
    "9223372036854775808", "8Ei", "10E", "1e19", "1e30", "10000Pi",
    "1" * 30,
])
def test_values_too_large_for_a_node_are_refused(text):
    with pytest.raises(QuantityError):
        parse_bytes(text)


@pytest.mark.parametrize("text, why", [
    ("1e1000000000", "exponent out of range"), ("1e-1000000000", "exponent out of range"),
    ("1" * 100_000, "too many digits"), ("0." + "0" * 100_000 + "1", "too many digits"),
    ("9" * 5000 + "Ei", "too many digits"),
])
def test_hostile_quantities_are_refused_before_any_arithmetic_in_one_short_line(text, why):
    """The digit and exponent bounds are checked on the text, before a Fraction is made of it (a
    1e1000000000 would be a number of a billion digits); the message names the value cut short."""
    with pytest.raises(QuantityError) as e:
        parse_bytes(text)
    assert why in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 200, str(e.value)[:300]


@pytest.mark.parametrize("text, problem", [
    ("1" * 41, "is larger than"), ("-" + "1" * 41, "is negative"), ("1" * 41 + "e-30", "has too many digits"),
    ("0." + "1" * 41, "has too many digits"),
])
def test_a_value_with_too_many_digits_is_called_what_it_is(text, problem):
    """What `problem` says (config and --node-memory show it): negative, larger than a node can
    have, or only too long to read, judged on the text as the exponent's bound is."""
    with pytest.raises(QuantityError) as e:
        parse_bytes(text)
    assert e.value.problem.startswith(problem) and "too many digits" in str(e.value), (e.value.problem, str(e.value))


@pytest.mark.parametrize("value", [True, False, None, [], {}, b"1Mi", object(), float("nan"), float("inf"),
                                   float("-inf")])
def test_non_quantities_are_refused(value):
    # bool is an int in Python but `memory: true` in YAML is not a quantity.
    with pytest.raises(QuantityError):
        parse_bytes(value)


# YAML turns some quantities into numbers before we see them.
@pytest.mark.parametrize("doc, expected", [
    ("v: 1073741824", Gi),
    ("v: 0", 0),
    ("v: 0.5", 1),          # float: half a byte rounds up
    ("v: 1.5e+9", 1_500_000_000),  # YAML 1.1 float
    ("v: 1e3", 1000),       # YAML 1.1 reads this as the string '1e3'
    ("v: 129e6", 129_000_000),
    ("v: 0.1", 1),          # the decimal 0.1, not the binary float just above it
    ("v: 123Mi", 123 * Mi),
    ("v: '1.5Gi'", 3 * Gi // 2),
    ("v: 1_000", 1000),     # YAML 1.1 int with underscores: an int by the time we see it
])
def test_numbers_from_yaml(doc, expected):
    assert parse_bytes(yaml.safe_load(doc)["v"]) == expected


@pytest.mark.parametrize("doc", ["v: true", "v: yes", "v: null", "v: .nan", "v: .inf", "v: -1", "v: -0.5",
                                 "v: [1]", "v: {a: 1}", "v: 2020-01-01"])
def test_non_quantities_from_yaml(doc):
    with pytest.raises(QuantityError):
        parse_bytes(yaml.safe_load(doc)["v"])


def test_ints_and_floats():
    assert parse_bytes(Gi) == Gi
    assert parse_bytes(1.5) == 2
    assert parse_bytes(0.0) == 0
    assert parse_bytes(-0.0) == 0
    assert parse_bytes(1e18) == 10**18
    with pytest.raises(QuantityError):
        parse_bytes(1e20)
    with pytest.raises(QuantityError):
        parse_bytes(2**63)


_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": Ki, "Mi": Mi, "Gi": Gi, "m": Fraction(1, 1000)}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=0, max_value=10**6), suffix=st.sampled_from(sorted(_SUFFIX)),
       frac=st.integers(min_value=0, max_value=999))
def test_decimal_and_suffix_property(n, suffix, frac):
    text = f"{n}.{frac:03d}{suffix}"
    exact = (n + Fraction(frac, 1000)) * _SUFFIX[suffix]
    assert parse_quantity(text) == exact
    assert parse_bytes(text) == -(-exact.numerator // exact.denominator)  # ceil


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_anything_is_a_quantity_or_a_quantity_error(text):
    try:
        n = parse_bytes(text)
    except QuantityError:
        return
    assert isinstance(n, int) and 0 <= n <= MAX_BYTES


@pytest.mark.parametrize("n, text", [(512 * Mi, "512Mi"), (3 * Gi // 2, "1.5Gi"), (4096, "4Ki"), (100, "100"),
                                     (0, "0"), (2 * Ti, "2Ti")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("text", ["1Gi\t", " 1Gi", "1Gi ", "\n1Gi", "1 Gi"])
def test_space_around_a_quantity_is_refused_as_resource_parsequantity_does(text):
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_bytes(text)


@pytest.mark.parametrize("n, shown", [
    (2**63 - 1, "9223372036854775807"),  # not "8Ei", the value past the largest, nor 8388608Ti
    (2**60, "1Ei"), (3 * 2**59, "1.5Ei"), (64 * 2**50, "64Pi"), (2**50 + 2**40, "1Pi"), (2**50 + 1, "1125899906842625"),
    (5 * 2**40, "5Ti"), (1536 * Mi, "1.5Gi"), (100, "100"),
])
def test_format_bytes_never_names_a_value_it_is_not(n, shown):
    assert format_bytes(n) == shown


def test_a_fraction_of_a_byte_given_by_an_operator_is_refused_a_pods_is_rounded_up():
    from memqos_systemd.quantity import parse_whole_bytes

    assert parse_bytes("500m") == 1  # a pod's request: the kubelet rounds up
    with pytest.raises(QuantityError, match=r"'500m' is not a whole number of bytes \(Kubernetes would round it up"
                                            r" to 1; did you mean 500Mi\?\)"):
        parse_whole_bytes("500m")
    assert parse_whole_bytes("1.5Gi") == 1536 * Mi
