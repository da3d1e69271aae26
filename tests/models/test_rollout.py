"""`[models.NAME.rollout]` in the model config file (gateway/models/rollout.py): read, and
refused naming the key when a key is unknown or a value impossible."""

from __future__ import annotations

import pytest

from gateway.models import ModelConfigError, load_registry
from gateway.models.rollout import RolloutConfig, Target
from tests.support.modelconfigs import TASKS, config

HEAD = '[models.a]\ntask = "detection"\n[models.a.rollout]\n'


def rollout_of(tmp_path, table: str) -> RolloutConfig | None:
    registry = load_registry(config(tmp_path, HEAD + table), "a", tasks=TASKS)
    return registry.get("a", "detection").rollout


def test_canary_and_shadow_are_read(tmp_path):
    rollout = rollout_of(
        tmp_path,
        'current = { label = "stable" }\ncanary = { version = 4, weight = 5 }\n'
        'sticky = "caller"\nshadow = { label = "canary", share = 0.2 }\n',
    )
    assert rollout == RolloutConfig(
        current=Target(label="stable"),
        canary=Target(version=4),
        weight=5.0,
        sticky="caller",
        shadow=Target(label="canary"),
        share=0.2,
    )


def test_a_model_without_a_rollout_table_has_none(tmp_path):
    path = config(tmp_path, '[models.a]\ntask = "detection"\n')
    assert load_registry(path, "a", tasks=TASKS).get("a", "detection").rollout is None


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("canarie = { version = 2, weight = 5 }\n", "unknown key 'models.a.rollout.canarie'"),
        ("canary = { version = 2, weight = 5, share = 1 }\n", "'models.a.rollout.canary.share'"),
        ("canary = { version = 2 }\n", "models.a.rollout.canary needs weight"),
        ("canary = { version = 2, weight = 0 }\n", "canary.weight must be a percentage in (0,"),
        ("canary = { version = 2, weight = 101 }\n", "canary.weight must be a percentage"),
        ('canary = { version = 2, weight = "5" }\n', "canary.weight must be a percentage"),
        ("canary = { weight = 5 }\n", "models.a.rollout.canary must name one of version or"),
        ('canary = { version = 2, label = "x", weight = 5 }\n', "must name one of version"),
        ("canary = { version = 0, weight = 5 }\n", "canary.version must be a whole number >="),
        ('canary = { label = "", weight = 5 }\n', "canary.label must be a version label"),
        ("canary = 2\n", "models.a.rollout.canary must be a table"),
        ('canary = { version = 2, weight = 5 }\nsticky = "ip"\n', "sticky must be one of"),
        ('sticky = "caller"\nshadow = { version = 2, share = 0.5 }\n', "sticky applies to a"),
        ("shadow = { version = 2 }\n", "models.a.rollout.shadow needs share"),
        ("shadow = { version = 2, share = 0 }\n", "shadow.share must be a fraction in (0, 1]"),
        ("shadow = { version = 2, share = 20 }\n", "shadow.share must be a fraction"),
        ("current = { version = 1 }\n", "models.a.rollout needs canary or shadow"),
        (
            "current = { version = 2 }\ncanary = { version = 2, weight = 5 }\n",
            "models.a.rollout.canary is the same version 2 as current",
        ),
    ],
)
def test_bad_rollouts_are_refused_naming_the_key(tmp_path, table, message):
    with pytest.raises(ModelConfigError, match=r"models\.toml") as info:
        rollout_of(tmp_path, table)
    assert message in str(info.value)


def test_rollout_must_be_a_table(tmp_path):
    path = config(tmp_path, '[models.a]\ntask = "detection"\nrollout = 3\n')
    with pytest.raises(ModelConfigError, match=r"models\.a\.rollout must be a table"):
        load_registry(path, "a", tasks=TASKS)
