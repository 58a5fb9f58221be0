"""Cases of Kubernetes' named formats (``k8s.io/apiserver/pkg/cel/library/format.go``), from
the apiserver's ``format_test.go`` TestFormat (every case, its expected optional written as a
comparison: ``== optional.none()``, ``== optional.of([...])``; and its table of every pair of
constant formats) and apiextensions' "format" scenario of TestValidationExpressions.

cel-python has no optional type: its engine here carries a small one (``optional.none()``,
``optional.of``, ``hasValue``, ``value``, ``orValue``) for these functions.
"""

from __future__ import annotations

from driver.cel.formats import FORMATS
from driver.cel.strings import quote_plain
from tests.unit.cel_cases.base import APIEXTENSIONS_TESTS, APISERVER_LIBRARY, Case
from tests.unit.cel_cases.base import ok as _ok

TEST = f"{APISERVER_LIBRARY}/format_test.go TestFormat"
SCENARIO = f"{APIEXTENSIONS_TESTS} TestValidationExpressions/format"

DNS1123_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and"
    " must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex"
    " used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex"
    " used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1035_LABEL = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an"
    " alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or"
    " 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
QUALIFIED_NAME = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end"
    " with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used"
    " for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
LABEL_VALUE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or"
    " 'my_value',  or '12345', regex used for validation is"
    " '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def _none(name: str, fmt: str, text: str) -> Case:
    expression = f"format.{fmt}().validate({quote_plain(text)}) == optional.none()"
    return _ok(f"TestFormat/{name}", expression, cites=f"{TEST}/{name}")


def _errors(name: str, fmt: str, text: str, *errors: str) -> Case:
    listed = ", ".join(quote_plain(e) for e in errors)
    expression = f"format.{fmt}().validate({quote_plain(text)}) == optional.of([{listed}])"
    return _ok(f"TestFormat/{name}", expression, cites=f"{TEST}/{name}")


TEST_FORMAT = (
    _none("example_usage_dns1123Label", "dns1123Label", "my-label-name"),
    _none("example_usage_dns1123Subdomain", "dns1123Subdomain", "apiextensions.k8s.io"),
    _none("example_usage_qualifiedName", "qualifiedName", "apiextensions.k8s.io/v1beta1"),
    _none("example_usage_dns1123LabelPrefix", "dns1123LabelPrefix", "my-label-prefix-"),
    _none("example_usage_dns1123SubdomainPrefix", "dns1123SubdomainPrefix", "mysubdomain.prefix.-"),
    _none("example_usage_dns1035LabelPrefix", "dns1035LabelPrefix", "my-label-prefix-"),
    _none("example_usage_uri", "uri", "http://example.com"),
    _none("example_usage_uuid", "uuid", "123e4567-e89b-12d3-a456-426614174000"),
    _none("example_usage_byte", "byte", "aGVsbG8="),
    _none("example_usage_date", "date", "2021-01-01"),
    _none("example_usage_datetime", "datetime", "2021-01-01T00:00:00Z"),
    _errors("dns1123Label", "dns1123Label", "contains a space", DNS1123_LABEL),
    _errors("dns1123Subdomain", "dns1123Subdomain", "contains a space", DNS1123_SUBDOMAIN),
    _errors("dns1035Label", "dns1035Label", "contains a space", DNS1035_LABEL),
    _errors("qualifiedName", "qualifiedName", "contains a space", QUALIFIED_NAME),
    _errors("dns1123LabelPrefix", "dns1123LabelPrefix", "contains a space-", DNS1123_LABEL),
    _errors(
        "dns1123SubdomainPrefix", "dns1123SubdomainPrefix", "contains a space-", DNS1123_SUBDOMAIN
    ),
    _errors("dns1035LabelPrefix", "dns1035LabelPrefix", "contains a space-", DNS1035_LABEL),
    _none("dns1123Label_Success", "dns1123Label", "my-label-name"),
    _none("dns1123Subdomain_Success", "dns1123Subdomain", "example.com"),
    _none("dns1035Label_Success", "dns1035Label", "my-label-name"),
    _none("qualifiedName_Success", "qualifiedName", "my.name"),
    _none("byte_success", "byte", "aGVsbG8="),
    _errors("byte_failure", "byte", "aGVsbG8", "invalid base64"),
    _none("date_success", "date", "2020-01-01"),
    _errors("date_failure", "date", "2020-01-32", "invalid date"),
    _none("datetime_success", "datetime", "2020-01-01T00:00:00Z"),
    _errors("datetime_failure", "datetime", "2020-01-32T00:00:00Z", "invalid datetime"),
    _ok(
        "TestFormat/unknown_format",
        '!format.named("unknown").hasValue()',
        cites=f"{TEST}/unknown_format",
    ),
    _none("labelValue_success", "labelValue", "my-cool-label-Value"),
    _errors("labelValue_failure", "labelValue", "my-cool-label-Value!!\n\n!!!", LABEL_VALUE),
)

# "Also test format names and comparisons of all constants"
CONSTANTS = tuple(
    case
    for key in sorted(FORMATS)
    for case in (
        _ok(
            f"TestFormat/lookup and comparison: {key}",
            f'format.named("{key}").hasValue()',
            cites=f"{TEST}/lookup and comparison",
        ),
        _ok(
            f"TestFormat/comparison with lookup succeeds: {key}",
            f'format.named("{key}").value() == format.{key}()',
            cites=f"{TEST}/comparison with lookup succeeds",
        ),
        *(
            _ok(
                f"TestFormat/compare_{key}_{other}",
                f"format.{key}() == format.{other}()",
                False,
                cites=f"{TEST}/compare_{key}_{other}",
            )
            for other in sorted(FORMATS)
            if other != key
        ),
    )
)

VALIDATION_EXPRESSIONS = tuple(
    _ok(f"{SCENARIO}: {expression}", expression, cites=SCENARIO)
    for expression in (
        'format.dns1123Label().validate("my-label-name") == optional.none()',
        'format.dns1123Subdomain().validate("apiextensions.k8s.io") == optional.none()',
        'format.qualifiedName().validate("apiextensions.k8s.io/v1beta1") == optional.none()',
        'format.dns1123LabelPrefix().validate("my-label-prefix-") == optional.none()',
        'format.dns1123SubdomainPrefix().validate("mysubdomain.prefix.-") == optional.none()',
        'format.dns1035LabelPrefix().validate("my-label-prefix-") == optional.none()',
        'format.uri().validate("http://example.com") == optional.none()',
        'format.uuid().validate("123e4567-e89b-12d3-a456-426614174000") == optional.none()',
        'format.byte().validate("aGVsbG8=") == optional.none()',
        'format.date().validate("2021-01-01") == optional.none()',
        'format.datetime().validate("2021-01-01T00:00:00Z") == optional.none()',
        'format.named("dns1123Label").value().validate("my-name") == optional.none()',
        'format.dns1123Label().validate("contains a space").value()[0] == '
        + quote_plain(DNS1123_LABEL),
        '!format.named("unknown").hasValue()',
    )
)

CASES: tuple[Case, ...] = TEST_FORMAT + CONSTANTS + VALIDATION_EXPRESSIONS
