"""Gateway settings from flags and GATEWAY_* variables."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from gateway.api.task import TaskRegistry
from gateway.config import MIB, Settings
from gateway.flags import GROUPS, NOT_FLAGS, env_name, parse_settings
from gateway.models import ModelConfig
from gateway.models.limits import RequestDefault
from gateway.tasks.builtin import built_in_tasks
from gateway.tasks.detection.config import MIN_SCORE, REQUEST_DEFAULTS
from gateway.tasks.detection.task import DetectionTask


def test_flags_win_over_environment_which_wins_over_defaults() -> None:
    env = {"GATEWAY_PORT": "6000", "GATEWAY_MIN_SCORE": "0.25", "GATEWAY_MODEL": "from-env"}
    settings = parse_settings(["--port", "7000"], env)
    assert settings.port == 7000
    assert settings.model == "from-env"
    # The request defaults the tasks declare (detection's), as flags and variables too.
    assert settings.request_defaults == {"min_score": 0.25, "max_detections": 100}


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
        (["--min-score=2"], {}, "min-score must be in [0.0, 1.0], got 2.0"),
        (["--max-detections=0"], {}, "max-detections must be at least 1, got 0"),
        ([], {"GATEWAY_MAX_DETECTIONS": "0.5"}, "GATEWAY_MAX_DETECTIONS='0.5'"),
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
    names = [setting.name for setting in fields(Settings) if setting.name not in NOT_FLAGS]
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


TILE_OVERLAP = RequestDefault("tile_overlap", 0.25, "default overlap of tiles", 0.0, 0.5)


class _TiledDetection(DetectionTask):
    """A task built on detection that declares a request default of its own."""

    name = "tiled_detection"
    request_defaults = (*REQUEST_DEFAULTS, TILE_OVERLAP)


def _with(task: DetectionTask) -> TaskRegistry:
    return TaskRegistry([*built_in_tasks().values(), task])


def test_a_task_s_request_default_is_a_flag_and_reaches_its_rules(capsys) -> None:
    tasks = _with(_TiledDetection())
    settings = parse_settings(["--tile-overlap=0.4"], {"GATEWAY_MIN_SCORE": "0.3"}, tasks)
    assert settings.request_defaults == {
        "min_score": 0.3, "max_detections": 100, "tile_overlap": 0.4
    }  # fmt: skip
    rules = ModelConfig("m", "tiled_detection").rules(settings)
    assert (rules.default(TILE_OVERLAP), rules.default(MIN_SCORE)) == (0.4, 0.3)
    # A Settings made without flags: each task's own defaults.
    assert ModelConfig("m", "tiled_detection").rules(Settings()).default(TILE_OVERLAP) == 0.25
    with pytest.raises(SystemExit):
        parse_settings(["--help"], {}, tasks)
    models = capsys.readouterr().out.split("models: models and request defaults:", 1)[1]
    for flag in ("--min-score", "--max-detections", "--tile-overlap"):
        assert flag in models.split("\n\n", 1)[0]
    assert "GATEWAY_TILE_OVERLAP; default 0.25" in " ".join(models.split())
    with pytest.raises(SystemExit):
        parse_settings(["--tile-overlap=0.9"], {}, tasks)
    assert "tile-overlap must be in [0.0, 0.5], got 0.9" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (RequestDefault("min_score", 0.3, "default minimum score", 0.0, 1.0),
         "declares the request default 'min_score' unlike another task"),
        (RequestDefault("port", 1, "a port", 1), "'port', which is a setting of the gateway"),
    ],
)  # fmt: skip
def test_a_request_default_declared_twice_differently_is_refused(declared, message, capsys):
    class Clashing(DetectionTask):
        name = "clashing"
        request_defaults = (declared,)

    with pytest.raises(SystemExit) as info:
        parse_settings([], {}, _with(Clashing()))
    assert info.value.code == 2
    assert message in capsys.readouterr().err
