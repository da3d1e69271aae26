"""The payload log's sampling file (gateway/paylog/sampling.py): per-caller rate and images,
patterns, refusals naming the key, reloads that keep the last good file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.paylog.sampling import EVERYTHING, FULL, HASH, PaylogError, PolicyFile, parse

FILE = """
[default]
rate = 0.25

[callers."uri:spiffe://test/ns/shop/sa/checkout"]
rate = 1.0
images = "full"

[callers."uri:spiffe://test/ns/batch/*"]
rate = 0

[callers."uri:spiffe://test/ns/*"]
images = "full"
"""


def test_a_caller_gets_its_table_then_the_longest_pattern_then_the_default() -> None:
    policy = parse(FILE, "paylog.toml")
    checkout = policy.of("uri:spiffe://test/ns/shop/sa/checkout")
    assert (checkout.rate, checkout.images) == (1.0, FULL)
    batch = policy.of("uri:spiffe://test/ns/batch/sa/nightly")
    assert (batch.rate, batch.images) == (0.0, HASH)  # images from [default]
    other = policy.of("uri:spiffe://test/ns/ads/sa/x")
    assert (other.rate, other.images) == (0.25, FULL)  # rate from [default]
    anonymous = policy.of("anonymous")
    assert (anonymous.rate, anonymous.images) == (0.25, HASH)


def test_without_a_file_every_request_is_logged_with_its_hash() -> None:
    assert (EVERYTHING.of("anonymous").rate, EVERYTHING.of("anonymous").images) == (1.0, HASH)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[default]\nrate = 1.5\n", "rate must be in [0, 1]"),
        ("[default]\nrate = -0.1\n", "rate must be in [0, 1]"),
        ('[default]\nrate = "all"\n', "rate must be a number"),
        ("[default]\nrate = nan\n", "rate must be a number"),
        ('[default]\nimages = "png"\n', 'images must be "hash"'),
        ("[default]\nsample = 1\n", "unknown key 'sample'"),
        ("[everyone]\nrate = 1\n", "unknown key 'everyone'"),
        ('[callers.""]\nrate = 1\n', "the identity is empty"),
        ("callers = 3\n", "callers must be tables"),
        ("[default\n", "not valid TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(text: str, named: str) -> None:
    with pytest.raises(PaylogError, match=named.replace("[", r"\[").replace("]", r"\]")) as e:
        parse(text, "paylog.toml")
    assert "paylog.toml" in str(e.value)


def test_a_changed_file_is_reloaded_and_a_broken_one_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "paylog.toml"
    path.write_text("[default]\nrate = 0.5\n")
    policy_file = PolicyFile(str(path), interval=0)
    assert policy_file.current(0).of("anonymous").rate == 0.5
    path.write_text("[default]\nrate = 0.75\n")
    os.utime(path, ns=(1, 1))  # a new stamp even within the file system's time granularity
    assert policy_file.current(1).of("anonymous").rate == 0.75
    path.write_text("[default]\nrate = 7\n")
    os.utime(path, ns=(2, 2))
    assert policy_file.current(2).of("anonymous").rate == 0.75
    path.write_text("[default]\nrate = 0\n")
    os.utime(path, ns=(3, 3))
    assert policy_file.current(3).of("anonymous").rate == 0.0
