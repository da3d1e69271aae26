"""A task written from scratch into a copy of the gateway, as docs/adding-a-task.md says to add
one: its folder (the copy's gateway/tasks/<NAME>/: task, config keys, nouns, binding, drawing,
page.js), its proto (<NAME>/v1/<NAME>.proto under proto/) with the generated code
(proto/generate.py), and one line in gateway/tasks/builtin.py. Nothing else of the copy
changes; `changed` tells.

The task, `palette` (verb `palette`): a model's float [batch, classes] output read as the share
of the image in each class (the reference `classifier_scores` gives each palette colour's
share), answered as the classes whose share reaches the caller's `min_share`, largest first.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "palette"

PROTO = """\
// The share of an image in each of a model's classes (a task added by tests/support/newtask.py).
syntax = "proto3";

package palette.v1;

import "google/rpc/status.proto";
import "vision/v1/model.proto";

// PaletteService tells what share of an image each class takes.
service PaletteService {
  // Palette runs the model on one image.
  // buf:lint:ignore RPC_REQUEST_RESPONSE_UNIQUE
  // buf:lint:ignore RPC_RESPONSE_STANDARD_NAME
  rpc Palette(PaletteRequest) returns (PaletteResult);
  // PaletteStream runs the model on a stream of images, results in request order.
  // buf:lint:ignore RPC_REQUEST_RESPONSE_UNIQUE
  // buf:lint:ignore RPC_REQUEST_STANDARD_NAME
  // buf:lint:ignore RPC_RESPONSE_STANDARD_NAME
  rpc PaletteStream(stream PaletteRequest) returns (stream PaletteResult);
}

// PaletteRequest is one image.
message PaletteRequest {
  // The encoded image.
  bytes image = 1;
  // The least share a class needs to be answered, in [0, 1] (0: the model config's).
  float min_share = 2;
  // The model to run.
  vision.v1.ModelSpec model = 3;
  // An identifier echoed in the result.
  string request_id = 4;
}

// PaletteResult holds the shares of one image.
message PaletteResult {
  // The classes whose share reaches min_share, largest first.
  repeated Share shares = 1;
  // Width of the image as a viewer shows it.
  int32 image_width = 2;
  // Height of the image as a viewer shows it.
  int32 image_height = 3;
  // The model and version that served the request.
  vision.v1.ServedModel model = 4;
  // The request's identifier.
  string request_id = 5;
  // Set only in stream results, for an image that failed on its own.
  google.rpc.Status error = 6;
}

// Share is one class's part of the image.
message Share {
  // The class's name from the model's labels.
  string label = 1;
  // Its share of the image, in [0, 1].
  float share = 2;
}
"""

FILES = {
    "__init__.py": '''\
"""The palette task: each class's share of the image."""

from gateway.tasks.palette.task import PaletteTask

TASK = PaletteTask()
''',
    "nouns.py": '''\
"""The palette task's plain types."""

from __future__ import annotations

from typing import Annotated, NamedTuple


class PaletteOptions(NamedTuple):
    min_share: Annotated[float, "least share answered, 0..1 (0: the model's default)"] = 0.0


class Share(NamedTuple):
    label: str
    share: float


class Shares(NamedTuple):
    shares: list[Share]
''',
    "config.py": '''\
"""The palette task's model-config key: `min_share`, the default least share."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.models.values import ModelConfigError
from gateway.tasks.base import read_own_keys


DEFAULT = 0.05


def read_config(table: Mapping[str, Any], path: Path, where: str) -> float:
    read_own_keys(table, ("min_share",), path, where)
    value = table.get("min_share", DEFAULT)
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ModelConfigError(f"{path}: {where}.min_share must be in [0, 1], got {value!r}")
    return float(value)
''',
    "binding.py": '''\
"""palette.v1 <-> the palette task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.palette.v1 import palette_pb2 as pb
from gateway.tasks.palette.nouns import PaletteOptions, Shares


def fill_result(result: pb.PaletteResult, found: Shares) -> None:
    result.shares.extend(pb.Share(label=s.label, share=s.share) for s in found.shares)


BINDING = Binding.of(pb.DESCRIPTOR, PaletteOptions, fill_result, summary="Each class's share")
''',
    "drawing.py": '''\
"""`--draw` for the palette: a row per class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.imaging.sketch import Sketch


def draw(sketch: Sketch, result: Mapping[str, Any]) -> None:
    for rank, share in enumerate(result.get("shares", [])):
        sketch.row(rank, f"{share['label']} {share['share']:.2f}")
''',
    "page.js": """\
// The palette on the page: a row per class, the largest's name in the corner.
const shares = result.shares || [];
for (const s of shares) view.row("palette " + s.label + " " + (s.share ?? 0).toFixed(3));
if (shares.length) view.drawLabel(shares[0].label, 0, 0);
view.status("Palette by " + view.served(result));
""",
    "task.py": '''\
"""The palette task: the one float [batch, classes] output, each class's share."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gateway import errors
from gateway.domain import Comparison, Cost, Frame, OutputError, OutputPlan
from gateway.models import ModelConfig
from gateway.models.limits import Rules
from gateway.tasks.base import FolderTask
from gateway.tasks.palette.nouns import PaletteOptions, Share, Shares
from gateway.upstream.signatures import Signature
from gateway.upstream.tensors import Tensor, as_array


class PaletteTask(FolderTask[float]):

    def resolve(self, options: PaletteOptions, config: ModelConfig, rules: Rules) -> float:
        if not 0.0 <= options.min_share <= 1.0:
            raise errors.invalid_input(f"min_share must be in [0, 1], got {options.min_share}")
        return options.min_share or self.own(config)

    def output_plan(self, signature: Signature, config: ModelConfig) -> OutputPlan:
        floats = sorted(k for k, s in signature.outputs.items() if s.shape and len(s.shape) == 2)
        if len(floats) != 1:
            raise errors.bad_model(
                f"model '{signature.model}' needs one [batch, classes] output for the palette; "
                f"it has {signature.describe()}"
            )
        return OutputPlan((floats[0],), "shares")

    def map(
        self,
        outputs: Mapping[str, Tensor],
        plan: OutputPlan,
        frame: Frame,
        options: float,
        config: ModelConfig,
    ) -> Shares:
        (key,) = plan.output_filter
        row = as_array(outputs[key])[0].astype(np.float64)
        if not np.isfinite(row).all() or (row < 0).any():
            raise OutputError(f"{key} holds values that are not shares")
        order = np.argsort(-row, kind="stable")
        return Shares(
            [Share(config.labels.label(int(i)), float(row[i])) for i in order if row[i] >= options]
        )

    def cost(self, options: float, frame: Frame, plan: OutputPlan, config: ModelConfig) -> Cost:
        # The image decoded; a share per class at most (100 bytes each, 1000 classes).
        return Cost(frame.width * frame.height, 0, 100_000, 1000)

    def compare(self, current: Shares, candidate: Shares) -> Comparison:
        ours = {s.label: s.share for s in current.shares}
        theirs = {s.label: s.share for s in candidate.shares}
        labels = ours.keys() | theirs.keys()
        distance = sum(abs(ours.get(k, 0.0) - theirs.get(k, 0.0)) for k in labels) / 2
        return Comparison("palette", {"share_agreement": 1.0 - distance})

    def summary(self, result: Shares) -> dict[str, object]:
        return {"classes": len(result.shares)}
''',
}


def write(copy: Path) -> None:
    """Adds the task to the copy of the repository at `copy` and generates its code."""
    folder = copy / "gateway" / "tasks" / NAME
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text)
    proto = copy / "proto" / NAME / "v1"
    proto.mkdir(parents=True)
    (proto / f"{NAME}.proto").write_text(PROTO)
    builtin = copy / "gateway" / "tasks" / "builtin.py"
    text = builtin.read_text()
    # The one line of the registration: the folder's name at the end of FOLDERS.
    end = text.index("\n)\n", text.index("FOLDERS = ("))
    builtin.write_text(f'{text[:end]}\n    "{NAME}",{text[end:]}')
    subprocess.run([sys.executable, "proto/generate.py"], cwd=copy, check=True, capture_output=True)


def copy_repository(destination: Path) -> Path:
    """The gateway's code and protos (as the working tree has them) in a git repository of
    their own at `destination`, committed, so that `changed` shows what adding a task did."""
    for part in ("gateway", "proto"):
        shutil.copytree(
            ROOT / part, destination / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=destination, check=True)
    subprocess.run([*git, "add", "-A"], cwd=destination, check=True)
    subprocess.run([*git, "commit", "-qm", "as it was"], cwd=destination, check=True)
    return destination


def changed(copy: Path) -> list[str]:
    """The paths the task's addition touched: `git status` of the copy, one per file."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=copy,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(line[3:] for line in out.splitlines())
