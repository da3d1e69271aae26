"""Gateway settings from flags and GATEWAY_* variables."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from gateway.config import MIB, Settings
from gateway.flags import GROUPS, env_name, parse_settings


def test_flags_win_over_environment_which_wins_over_defaults() -> None:
    env = {"GATEWAY_PORT": "6000", "GATEWAY_MIN_SCORE": "0.25", "GATEWAY_MODEL": "from-env"}
    settings = parse_settings(["--port", "7000"], env)
    assert settings.port == 7000
    assert settings.min_score == 0.25
    assert settings.model == "from-env"
    assert settings.max_detections == 100


def test_label_maps_are_model_path_pairs() -> None:
    settings = parse_settings([], {"GATEWAY_LABEL_MAPS": "a=/x/a.pbtxt, b=/y/b.pbtxt"})
    assert settings.label_maps == {"a": Path("/x/a.pbtxt"), "b": Path("/y/b.pbtxt")}


def test_message_limits_derive_from_the_image_limits() -> None:
    settings = parse_settings(["--max-image-bytes=1048576", "--max-pixels=1000000"], {})
    assert settings.server_max_receive_bytes == 2 * MIB
    assert settings.upstream_send_bytes == 3_000_000 + MIB  # a 1 MP image as uint8 pixels
    big_files = parse_settings(["--max-image-bytes=10485760", "--max-pixels=1000000"], {})
    assert big_files.upstream_send_bytes == 11 * MIB  # encoded bytes forwarded as they are
    explicit = parse_settings(["--upstream-max-send-bytes=123456789"], {})
    assert explicit.upstream_send_bytes == 123456789


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--min-score=2"], {}, "min-score must be in [0, 1]"),
        (["--upstream-lb=random"], {}, "pick_first or round_robin"),
        (["--stream-window=0"], {}, "stream-window must be at least 1"),
        ([], {"GATEWAY_PORT": "http"}, "GATEWAY_PORT='http'"),
        ([], {"GATEWAY_LABEL_MAPS": "detector"}, "must be MODEL=PATH"),
    ],
)
def test_bad_settings_exit_with_a_message_naming_them(argv, env, message, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(argv, env)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_every_setting_has_one_group_and_a_help_line(capsys) -> None:
    names = [setting.name for setting in fields(Settings)]
    grouped = [name for _, members in GROUPS.values() for name in members]
    assert sorted(grouped) == sorted(names)  # each setting in exactly one group
    assert set(GROUPS) == {"server", "limits", "upstream", "models", "jobs", "security", "policy"}
    with pytest.raises(SystemExit):
        parse_settings(["--help"], {})
    shown = capsys.readouterr().out
    for group, (title, members) in GROUPS.items():
        section = shown.split(f"{group}: {title}:", 1)[1]
        for name in members:  # each flag under its group's heading, with its variable
            assert f"--{name.replace('_', '-')} " in section.split("\n\n", 1)[0]
            assert env_name(name) in shown
