"""serving/local/FACTS.md is complete enough to test against: every fact has a code and a
source in TF Serving's (or TensorFlow's) code, and it names the version the image pins."""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc

from tests.support.facts import FACTS_PATH, facts, text

ROOT = Path(__file__).resolve().parents[2]
_SOURCE_FILE = re.compile(r"[\w/]+\.(cc|h|py)\b")


def test_every_fact_has_a_code_and_a_source_file() -> None:
    codes = {code.name for code in grpc.StatusCode} | {"log", "stdout", "-"}
    assert len(facts()) >= 25
    for fact_id, fact in facts().items():
        assert fact.code in codes, fact_id
        assert fact.text, fact_id
        assert _SOURCE_FILE.search(fact.source), f"{fact_id}: no source file in {fact.source!r}"


def test_facts_name_the_pinned_tf_serving_version() -> None:
    flags = json.loads((ROOT / "serving" / "local" / "tfs_flags.json").read_text())
    document = FACTS_PATH.read_text()
    assert f"tag **{flags['version']}**" in document
    assert flags["commit"][:12] in document
    dockerfile = (ROOT / "Dockerfile.serving").read_text()
    assert f"tensorflow/serving:{flags['version']}\n" in dockerfile


def test_placeholders_are_filled_and_checked() -> None:
    assert text("status_unknown_version", version=3, model="m") == (
        "Could not find version 3 of model m"
    )
    try:
        text("status_unknown_version", version=3)
    except AssertionError as error:
        assert "model" in str(error)
    else:
        raise AssertionError("a missing placeholder value must fail")
