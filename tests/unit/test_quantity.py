"""driver.api.quantity against upstream's own examples (k8s.io/apimachinery/pkg/api/resource
quantity_test.go): parsing, rounding, caps, canonical formatting, arithmetic, comparison and
errors."""

from __future__ import annotations

import copy
import pickle
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from driver.api.errors import QuantityError
from driver.api.quantity import NANO, Quantity, parse_quantity

INT64_MAX = 2**63 - 1


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "value", "fmt"),
    [
        ("0", 0, "DecimalSI"),
        ("0n", 0, "DecimalSI"),
        ("0Ki", 0, "BinarySI"),
        ("0Ti", 0, "BinarySI"),
        ("1", 1, "DecimalSI"),
        ("1Ki", 1024, "BinarySI"),
        ("8Ki", 8 * 1024, "BinarySI"),
        ("7Mi", 7 * 2**20, "BinarySI"),
        ("6Gi", 6 * 2**30, "BinarySI"),
        ("5Ti", 5 * 2**40, "BinarySI"),
        ("4Pi", 4 * 2**50, "BinarySI"),
        ("3Ei", 3 * 2**60, "BinarySI"),
        ("5n", Fraction(5, 10**9), "DecimalSI"),
        ("4u", Fraction(4, 10**6), "DecimalSI"),
        ("3m", Fraction(3, 1000), "DecimalSI"),
        ("8k", 8000, "DecimalSI"),
        ("50k", 50_000, "DecimalSI"),
        ("7M", 7 * 10**6, "DecimalSI"),
        ("6G", 6 * 10**9, "DecimalSI"),
        ("5T", 5 * 10**12, "DecimalSI"),
        ("2P", 2 * 10**15, "DecimalSI"),
        ("1E", 10**18, "DecimalSI"),
        ("12E", 12 * 10**18, "DecimalSI"),  # decimal quantities are not capped
        ("1E-3", Fraction(1, 1000), "DecimalExponent"),
        ("1e3", 1000, "DecimalExponent"),
        ("1E6", 10**6, "DecimalExponent"),
        ("1e14", 10**14, "DecimalExponent"),
        ("1.3E+6", 1_300_000, "DecimalExponent"),
        ("0.5e-1", Fraction(5, 100), "DecimalExponent"),
        ("100.035k", 100_035, "DecimalSI"),
        ("0.0005k", Fraction(1, 2), "DecimalSI"),
        ("10.035M", 10_035_000, "DecimalSI"),
        ("7.123456M", 7_123_456, "DecimalSI"),
        ("1.01E", 101 * 10**16, "DecimalSI"),
        ("100.035Ki", Fraction(10243584, 100), "BinarySI"),
        ("0.5Mi", 2**19, "BinarySI"),
        ("0.025Ti", Fraction(274877906944, 10), "BinarySI"),
        (".001", Fraction(1, 1000), "DecimalSI"),
        (".0001k", Fraction(1, 10), "DecimalSI"),
        ("1.", 1, "DecimalSI"),
        ("1.G", 10**9, "DecimalSI"),
        ("+1Ki", 1024, "BinarySI"),
        ("-1.025Ti", -Fraction(1025, 1000) * 2**40, "BinarySI"),
    ],
)
def test_parse_upstream_examples(text: str, value: int | Fraction, fmt: str) -> None:
    quantity = Quantity.parse(text)
    assert quantity.exact == value
    assert quantity.format == fmt


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("3.001n", 4),
        ("1.1E-9", 2),
        ("0.0000000001", 1),
        ("0.0000000005", 1),
        ("0.5e-9", 1),
        ("0.9n", 1),
        ("0.00000012345", 124),
        ("0.00000012354", 124),
        ("-0.9n", -1),  # away from zero, like upstream's inf.RoundUp
    ],
)
def test_parse_rounds_up_to_nano(text: str, nanos: int) -> None:
    assert Quantity.parse(text).nanos == nanos


@pytest.mark.parametrize("text", ["9Ei", "9223372036854775807Ki", "16Ei"])
def test_binary_quantities_are_capped_at_int64_max(text: str) -> None:
    quantity = Quantity.parse(text)
    assert quantity.exact == INT64_MAX
    assert quantity.format == "BinarySI"
    assert Quantity.parse("-" + text).exact == -INT64_MAX


def test_tiny_binary_quantity_becomes_decimal() -> None:
    quantity = Quantity.parse("0.000000000001Ki")
    assert quantity.nanos == 2
    assert quantity.format == "DecimalSI"
    assert str(quantity) == "2n"


@pytest.mark.parametrize(
    "text",
    [
        "",
        ".",
        "-.",
        "1.1.M",
        "1+1.0M",
        "0.1mi",
        "0.1am",
        "aoeu",
        ".5i",
        "1i",
        "-3.01i",
        "-3.01e-",
        "1e4294967297",
        "1e1001",  # biaxial bounds exponents at 1000 (exact integers); upstream at int32
        " 1",
        "1 ",
        "1KiB",
        "1 Gi",
        "Gi",
        "--1",
    ],
)
def test_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(QuantityError, match="invalid quantity"):
        Quantity.parse(text)


def test_error_names_the_text_and_the_syntax() -> None:
    with pytest.raises(QuantityError) as info:
        Quantity.parse("40GiB")
    assert "'40GiB'" in str(info.value)
    assert "regular expression" in str(info.value)


def test_non_string_is_rejected() -> None:
    with pytest.raises(QuantityError, match="must be a string"):
        Quantity.parse(12)  # type: ignore[arg-type]


def test_of_accepts_manifest_values() -> None:
    assert Quantity.of(5) == Quantity.parse("5")
    assert Quantity.of("5Gi") == Quantity.parse("5Gi")
    q = Quantity.parse("1")
    assert Quantity.of(q) is q
    assert parse_quantity("1k") == Quantity.from_int(1000)
    with pytest.raises(QuantityError, match="boolean"):
        Quantity.of(True)


# --------------------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    ("nanos", "fmt", "text"),
    [
        (2**30 * NANO, "BinarySI", "1Gi"),
        (300 * 2**20 * NANO, "BinarySI", "300Mi"),
        (6 * 1024 * NANO, "BinarySI", "6Ki"),
        (1001 * 2**30 * NANO, "BinarySI", "1001Gi"),
        (2**40 * NANO, "BinarySI", "1Ti"),
        (5 * NANO, "BinarySI", "5"),
        (500 * 10**6, "BinarySI", "500m"),
        (10**9 * NANO, "DecimalSI", "1G"),
        (10**6, "DecimalSI", "1m"),
        (80 * 10**6, "DecimalSI", "80m"),
        (1080 * 10**6, "DecimalSI", "1080m"),
        (300 * 10**6 * NANO, "DecimalSI", "300M"),
        (10**12 * NANO, "DecimalSI", "1T"),
        (10**18 * NANO, "DecimalSI", "1E"),
        (10**21 * NANO, "DecimalSI", "1e21"),
        (5 * 10**21 * NANO, "DecimalSI", "5e21"),
        (10**24 * NANO, "DecimalSI", "1e24"),
        (10**70 * NANO, "BinarySI", "10e69"),
        (2 * 10**70 * NANO, "BinarySI", "20e69"),
        (10**72 * NANO, "BinarySI", "1e72"),
        (2**70 * NANO, "BinarySI", "1180591620717411303424"),
        (1234567 * 10**6 * NANO, "DecimalSI", "1234567M"),
        (1234567 * 10**6, "BinarySI", "1234567m"),
        (3000 * NANO, "DecimalSI", "3k"),
        (1025 * NANO, "BinarySI", "1025"),
        (2000 * NANO, "BinarySI", "2000"),
        (0, "DecimalSI", "0"),
        (0, "BinarySI", "0"),
        (0, "DecimalExponent", "0"),
        (10**9 * NANO, "DecimalExponent", "1e9"),
        (10**6, "DecimalExponent", "1e-3"),
        (1, "DecimalExponent", "1e-9"),
        (80 * 10**6, "DecimalExponent", "80e-3"),
        (300 * 10**6 * NANO, "DecimalExponent", "300e6"),
        (1000 * NANO, "DecimalExponent", "1e3"),
        (1, "DecimalSI", "1n"),
        (80, "DecimalSI", "80n"),
        (1080, "DecimalSI", "1080n"),
        (1000, "DecimalSI", "1u"),
        (1080 * 1000, "DecimalSI", "1080u"),
    ],
)
def test_canonical_string_upstream_examples(nanos: int, fmt: str, text: str) -> None:
    quantity = Quantity(nanos, fmt)  # type: ignore[arg-type]
    assert str(quantity) == text
    if nanos:
        assert str(-quantity) == "-" + text
    assert Quantity.parse(text) == quantity  # canonical text round-trips by value


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1Ki", "1Ki"),
        ("1024Mi", "1Gi"),
        ("1000M", "1G"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
        ("1536Mi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1000", "1k"),
        ("1.5", "1500m"),
        ("1e3", "1e3"),
        ("1000E", "1e21"),
        ("307200Ki", "300Mi"),
        ("0.001T", "1G"),
        ("1080000000n", "1080m"),
        ("0.001e0", "1e-3"),
        ("1000e-12", "1e-9"),
        ("9Ei", "9223372036854775807"),
    ],
)
def test_parse_then_print_upstream_examples(text: str, canonical: str) -> None:
    assert str(Quantity.parse(text)) == canonical
    if Quantity.parse(text).sign():
        assert str(Quantity.parse("-" + text)) == "-" + canonical


def test_repr_shows_the_canonical_text() -> None:
    assert repr(Quantity.parse("1024Mi")) == "Quantity('1Gi')"


# --------------------------------------------------------------------------- arithmetic


def test_add_and_sub_keep_the_receiver_format() -> None:
    assert str(Quantity.parse("1Gi") + Quantity.parse("512Mi")) == "1536Mi"
    assert str(Quantity.parse("1") + Quantity.parse("500m")) == "1500m"
    assert str(Quantity.parse("1Gi") - Quantity.parse("1Gi")) == "0"
    assert (Quantity.parse("1Gi") + Quantity.parse("1k")).format == "BinarySI"


@pytest.mark.parametrize("text", ["100m", "1Gi"])
def test_adding_zero_preserves_the_suffix(text: str) -> None:
    zero, value = Quantity.parse("0"), Quantity.parse(text)
    assert str(value + zero) == text
    assert str(zero + value) == text
    assert str(value - zero) == text
    assert str(zero - value) == str(-value) == "-" + text


def test_negation() -> None:
    assert str(-Quantity.parse("9.01")) == "-9010m"
    negated = -Quantity.parse("1Ki")
    assert -negated == Quantity.parse("1Ki")


def test_arithmetic_with_other_types_is_not_implemented() -> None:
    with pytest.raises(TypeError):
        _ = Quantity.parse("1") + 1  # type: ignore[operator]


# --------------------------------------------------------------------------- comparison


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("0", "0", 0),
        ("100m", "50m", 1),
        ("50m", "100m", -1),
        ("10000T", "100Gi", 1),
        ("1Ki", "1024", 0),
        ("1Gi", "1024Mi", 0),
        ("1e3", "1k", 0),
        ("-1", "0", -1),
    ],
)
def test_compare_upstream_examples(a: str, b: str, expected: int) -> None:
    qa, qb = Quantity.parse(a), Quantity.parse(b)
    assert qa.compare(qb) == expected
    assert qb.compare(qa) == -expected
    assert (qa == qb) is (expected == 0)
    assert (qa < qb) is (expected < 0)
    assert (qa > qb) is (expected > 0)


def test_equal_values_hash_alike() -> None:
    assert len({Quantity.parse("1Ki"), Quantity.parse("1024"), Quantity.parse("1.024k")}) == 1


def test_not_equal_to_plain_numbers() -> None:
    assert Quantity.parse("1") != 1
    with pytest.raises(TypeError):
        _ = Quantity.parse("1") < 1  # type: ignore[operator]


# --------------------------------------------------------------------------- conversions


@pytest.mark.parametrize(
    ("text", "value", "milli"),
    [
        ("9.01", 10, 9010),
        ("-9.01", -10, -9010),
        ("1Gi", 2**30, 2**30 * 1000),
        ("1n", 1, 1),
        ("1500m", 2, 1500),
        ("0", 0, 0),
    ],
)
def test_value_and_milli_value_round_up(text: str, value: int, milli: int) -> None:
    quantity = Quantity.parse(text)
    assert quantity.value() == value
    assert quantity.milli_value() == milli


def test_integer_conversions() -> None:
    assert Quantity.parse("2k").is_integer()
    assert Quantity.parse("2k").as_integer() == 2000
    assert not Quantity.parse("1500m").is_integer()
    assert not Quantity.parse("10E").is_integer()  # beyond int64
    assert Quantity.parse("9Ei").as_integer() == INT64_MAX
    with pytest.raises(QuantityError, match="without loss"):
        Quantity.parse("1500m").as_integer()
    assert Quantity.parse("1500m").as_approximate_float() == 1.5
    assert Quantity.from_milli(1500) == Quantity.parse("1.5")
    assert Quantity.from_int(3, "BinarySI").format == "BinarySI"


def test_sign_and_zero() -> None:
    assert Quantity.parse("-1m").sign() == -1
    assert Quantity.parse("0Gi").sign() == 0
    assert Quantity.parse("0Gi").is_zero()
    assert Quantity.parse("1n").sign() == 1


def test_immutable_and_copyable() -> None:
    quantity = Quantity.parse("1Gi")
    with pytest.raises(AttributeError, match="immutable"):
        quantity._nanos = 1
    assert copy.deepcopy(quantity) == quantity
    assert pickle.loads(pickle.dumps(quantity)) == quantity
    assert quantity.with_format("DecimalSI").format == "DecimalSI"


@given(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from(["BinarySI", "DecimalSI", "DecimalExponent"]),
)
def test_canonical_text_round_trips_by_value(nanos: int, fmt: str) -> None:
    quantity = Quantity(nanos, fmt)  # type: ignore[arg-type]
    text = str(quantity)
    reparsed = Quantity.parse(text)
    if text.endswith("i") and abs(quantity.exact) > INT64_MAX:
        assert reparsed.exact == quantity.sign() * INT64_MAX  # parsing caps binary values
    else:
        assert reparsed == quantity
