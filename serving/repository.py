"""Builds a TF Serving model repository from an exported TF Object Detection API model.

Teams serve model-zoo or their own OD API exports (`exporter_main_v2.py` writes
`<export>/saved_model/` beside `checkpoint/` and `pipeline.config`), usually as a .tar.gz.
TF Serving wants `<base>/<name>/<version>/saved_model.pb` instead; this tool does that move,
puts the label map and (optionally) a warmup file in `assets.extra/`, and writes a
model_config_list for the result. Dockerfile.serving runs it when MODEL_ARCHIVE is given.

    python -m serving.repository --archive efficientdet_d0.tar.gz --name efficientdet \
        --label-map mscoco_label_map.pbtxt --out /models --config /models/models.config

No TensorFlow import: it only moves files.
"""

from __future__ import annotations

import argparse
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

ASSETS_EXTRA = "assets.extra"
LABEL_MAP_FILENAME = "label_map.pbtxt"


class RepositoryError(ValueError):
    """An archive or directory that does not hold exactly one SavedModel."""


def find_saved_model(root: Path) -> Path:
    """The one directory under root holding saved_model.pb (OD API: <export>/saved_model)."""
    found = sorted(p.parent for p in root.rglob("saved_model.pb"))
    if len(found) != 1:
        raise RepositoryError(
            f"expected one saved_model.pb under {root}, found {len(found)}: "
            f"{[str(p) for p in found]}"
        )
    return found[0]


def import_export(
    source: Path, out: Path, name: str, version: int = 1, label_map: Path | None = None
) -> Path:
    """Copies an OD API export (directory or .tar/.tar.gz archive) to <out>/<name>/<version>/."""
    target = out / name / str(version)
    if target.exists():
        raise RepositoryError(f"{target} already exists")
    with tempfile.TemporaryDirectory() as tmp:
        if source.is_dir():
            saved_model = find_saved_model(source)
        else:
            with tarfile.open(source) as archive:
                archive.extractall(tmp, filter="data")  # refuses absolute paths and links out
            saved_model = find_saved_model(Path(tmp))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(saved_model, target)
    if label_map is not None:
        (target / ASSETS_EXTRA).mkdir(exist_ok=True)
        shutil.copyfile(label_map, target / ASSETS_EXTRA / LABEL_MAP_FILENAME)
    return target


def model_config(models: dict[str, Path]) -> str:
    """A text-format model_config_list serving the latest version of each model."""
    entries = "".join(
        f"  config {{\n    name: '{name}'\n    base_path: '{path}'\n"
        f"    model_platform: 'tensorflow'\n  }}\n"
        for name, path in models.items()
    )
    return f"model_config_list {{\n{entries}}}\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving.repository", description=__doc__)
    parser.add_argument("--archive", type=Path, required=True, help="OD API export dir or tar")
    parser.add_argument("--name", required=True, help="model name clients will use")
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--label-map", type=Path, help="OD API label_map.pbtxt")
    parser.add_argument("--out", type=Path, required=True, help="model repository root")
    parser.add_argument("--config", type=Path, help="write a models.config here")
    args = parser.parse_args(argv)
    try:
        target = import_export(args.archive, args.out, args.name, args.version, args.label_map)
    except (RepositoryError, OSError, tarfile.TarError) as e:
        parser.exit(1, f"repository: {e}\n")
    print(f"{args.name}: {target}")
    if args.config:
        args.config.write_text(model_config({args.name: (args.out / args.name).resolve()}))
        print(f"config: {args.config}")


if __name__ == "__main__":
    main()
