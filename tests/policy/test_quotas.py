"""The quota file: tables, inheritance from [default], patterns, errors naming the key, and
reloads that keep the last good quotas."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.policy.quotas import INF, QuotaError, QuotaFile, parse

FILE = """
[default]
rate = 10
concurrency = 4

[callers."uri:spiffe://test.local/ns/shop/sa/checkout"]
rate = 200
burst = 50

[callers."uri:spiffe://test.local/ns/shop/*"]
concurrency = 2

[callers."uri:spiffe://test.local/*"]
rate = inf
"""


def test_callers_get_their_table_then_the_longest_pattern_then_the_default() -> None:
    quotas = parse(FILE, "quotas.toml")
    checkout = quotas.of("uri:spiffe://test.local/ns/shop/sa/checkout")
    assert (checkout.rate, checkout.burst, checkout.concurrency) == (200, 50, 4)
    assert checkout.label == "uri:spiffe://test.local/ns/shop/sa/checkout"
    cart = quotas.of("uri:spiffe://test.local/ns/shop/sa/cart")  # both patterns match: the longer
    assert (cart.rate, cart.burst, cart.concurrency) == (10, 10, 2)
    assert cart.label == "uri:spiffe://test.local/ns/shop/*"
    other = quotas.of("uri:spiffe://test.local/ns/ads/sa/x")
    assert (other.rate, other.burst, other.concurrency) == (INF, INF, 4)
    stranger = quotas.of("anonymous")
    assert (stranger.rate, stranger.burst, stranger.concurrency) == (10, 10, 4)
    assert stranger.label == "other" and stranger.source == "[default] of the quota file"


def test_no_file_and_empty_tables_mean_no_limit() -> None:
    quota = parse("", "q.toml").of("anyone")
    assert (quota.rate, quota.burst, quota.concurrency) == (INF, INF, INF)
    assert parse('[callers."cn:a"]\n', "q.toml").of("cn:a").rate == INF


def test_burst_defaults_to_one_seconds_worth_of_the_rate() -> None:
    assert parse("[default]\nrate = 2.5\n", "q.toml").of("x").burst == 3
    assert parse("[default]\nrate = 0.2\n", "q.toml").of("x").burst == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[defaults]\nrate = 1\n", "q.toml: unknown key 'defaults'"),
        ("[default]\nrps = 1\n", "q.toml: [default]: unknown key 'rps'"),
        ('[callers."cn:a"]\nrate = 0\n', '[callers."cn:a"]: rate must be a number > 0'),
        ("[default]\nrate = -3\n", "[default]: rate must be a number > 0"),
        ("[default]\nrate = nan\n", "rate must be a number > 0"),
        ("[default]\nconcurrency = 1.5\n", "concurrency must be a whole number >= 1"),
        ("[default]\nburst = 5\n", "[default]: burst needs a rate"),
        ('[default]\nrate = "fast"\n', "rate must be a number, got 'fast'"),
        ("[default]\nrate = true\n", "rate must be a number, got True"),
        ("callers = 3\n", 'callers must be tables: [callers."<identity>"]'),
        ('[callers.""]\nrate = 1\n', "the identity is empty"),
        ("[default\n", "q.toml: not valid TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(QuotaError) as info:
        parse(text, "q.toml")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        (
            "spiffe://test.local/ns/shop/sa/checkout",
            '"uri:spiffe://test.local/ns/shop/sa/checkout"',
        ),
        ("spiffe://test.local/ns/batch/*", '"uri:spiffe://test.local/ns/batch/*"'),
        ("CN=worker-7", '"cn:worker-7"'),
        ("worker-7", "write uri:<URI SAN>, cn:<common name> or anonymous"),
        ("uri:", "not a typed identity"),
        ("*", "not a typed identity"),
    ],
)
def test_a_table_not_named_by_a_typed_identity_is_refused_naming_it(name: str, hint: str) -> None:
    """Identities always carry their type: an untyped table would silently match nobody."""
    with pytest.raises(QuotaError) as info:
        parse(f'[default]\nrate = 1\n[callers."{name}"]\nrate = 5\n', "q.toml")
    message = str(info.value)
    assert f'q.toml: [callers."{name}"]: not a typed identity' in message or (
        name == "" and "empty" in message
    )
    assert hint in message


def test_typed_names_patterns_and_anonymous_are_taken() -> None:
    quotas = parse(
        '[callers."cn:worker-*"]\nrate = 3\n[callers.anonymous]\nrate = 1\n'
        '[callers."uri:spiffe://x/[ab]"]\nrate = 2\n',
        "q.toml",
    )
    assert quotas.of("cn:worker-7").rate == 3
    assert quotas.of("uri:worker-7").rate == INF  # a CN pattern never matches a URI SAN
    assert quotas.of("anonymous").rate == 1
    assert quotas.of("uri:spiffe://x/b").rate == 2


def test_a_missing_or_oversized_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(QuotaError, match="cannot read quota file"):
        QuotaFile(str(tmp_path / "none.toml"))
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1024 * 1024) + "\n")
    with pytest.raises(QuotaError, match="is over 1048576 bytes"):
        QuotaFile(str(big))


def _rewrite(path: Path, text: str) -> None:
    """Writes `text` as a new file in place of `path` (a new inode, as a ConfigMap update
    makes), so the change shows whatever the file system's time resolution."""
    staging = path.with_suffix(".new")
    staging.write_text(text)
    os.replace(staging, path)


def test_a_changed_file_is_loaded_and_a_broken_one_leaves_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "quotas.toml"
    path.write_text("[default]\nrate = 5\n")
    quotas = QuotaFile(str(path), interval=10.0)
    assert quotas.current(0.0).of("x").rate == 5
    _rewrite(path, "[default]\nrate = 7\n")
    assert quotas.current(5.0).of("x").rate == 5  # not looked at again before the interval
    assert quotas.current(10.0).of("x").rate == 7
    assert quotas.generation == 1
    _rewrite(path, "[default]\nrate = 0\n")
    assert quotas.current(20.0).of("x").rate == 7
    assert "quota file not reloaded" in caplog.text and "rate must be" in caplog.text
    assert quotas.generation == 1
    path.unlink()
    assert quotas.current(30.0).of("x").rate == 7
    path.write_text("[default]\nrate = 9\n")
    assert quotas.current(40.0).of("x").rate == 9
