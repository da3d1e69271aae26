"""How far the fast resize is from the exporters' own: the zoo's classifiers through a gateway
with tests/zoo/models.toml as it is (exact resizing) and one with every resize_filter removed
(the fast path, the default), each class's score against the library's (tests/zoo/build.py),
per photo -> the "zoo" section of bench/results.md.

    python -m tests.zoo.deviation [--zoo DIR]     (make zoo-deviation)

Builds the zoo first when the cache has none (tests/zoo/conftest.py); `--zoo` names a zoo
build.py has written elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench import results
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.vision.v1 import model_pb2
from tests.support.gatewayproc import CHANNEL_OPTIONS, run_gateway
from tests.support.localserver import run_local_server
from tests.zoo.compare import image, to_toml
from tests.zoo.conftest import CLASSIFIERS, LOAD_TIMEOUT, MODEL_CONFIG, build_zoo


def _scores(channel: grpc.Channel, model: str, data: bytes, classes: int) -> np.ndarray:
    stub = cpb_grpc.ClassificationServiceStub(channel)
    request = cpb.ClassifyRequest(image=data, model=model_pb2.ModelSpec(name=model), top_k=classes)
    got = np.zeros(classes)
    for c in stub.Classify(request, timeout=120).classes:
        got[c.class_id] = c.score
    return got


def measure(zoo: Path, expected: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    config = tomllib.loads(MODEL_CONFIG.read_text())
    exact = [m for m in CLASSIFIERS if "resize_filter" in config["models"][m].get("input", {})]
    filters = {m: config["models"][m]["input"].pop("resize_filter") for m in exact}
    fast_config = work / "fast.toml"
    fast_config.write_text(to_toml(config))
    entries = "".join(
        f"  config {{ name: '{m}' base_path: '{zoo / 'models' / m}' "
        "model_platform: 'tensorflow' }\n"
        for m in exact
    )
    (work / "models.config").write_text(f"model_config_list {{\n{entries}}}\n")
    rows = []
    args = [f"--model_config_file={work / 'models.config'}"]
    with run_local_server(args, timeout=LOAD_TIMEOUT, log_dir=work) as server:
        gateways = {"exact": MODEL_CONFIG, "fast": fast_config}
        answers: dict[str, dict[tuple[str, str], np.ndarray]] = {}
        for name, path in gateways.items():
            gateway_args = [f"--model-config={path}", f"--model={exact[0]}"]
            with (
                run_gateway(server.target, gateway_args, log_dir=work) as gateway,
                grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel,
            ):
                answers[name] = {
                    (model, photo): _scores(
                        channel, model, image(zoo, expected, photo), len(scores)
                    )
                    for model in exact
                    for photo, scores in expected["expected"][model].items()
                }
        for model in exact:
            for photo, scores in expected["expected"][model].items():
                want = np.asarray(scores)
                top5 = set(np.argsort(-want)[:5].tolist())
                row: dict[str, Any] = {"model": model, "photo": photo, "filter": filters[model]}
                for name in gateways:
                    got = answers[name][(model, photo)]
                    row[name] = float(np.abs(got - want).max())
                    row[f"{name}_top5"] = set(np.argsort(-got)[:5].tolist()) == top5
                rows.append(row)
    return rows


def report(rows: list[dict[str, Any]], expected: dict[str, Any]) -> str:
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    lines = [
        "## Resizing: the fast path against the exporters' preprocessing (tests/zoo)",
        "",
        f"`python -m tests.zoo.deviation` on {started} UTC: the zoo's classifiers (random "
        "weights, final layers rescaled so that classes separate), each photo classified "
        "through a gateway with the model's `resize_filter` (exact) and one without (fast); "
        "the largest difference of any class's score from the library's own preprocessing, "
        "and whether the top 5 classes are the library's.",
        "",
        "| model | resize_filter | photo | exact: largest score difference | fast: largest "
        "score difference | fast: same top 5 |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        size = expected["images"][row["photo"]]
        kind = size["file"].rsplit(".", 1)[-1].upper()
        photo = f"{row['photo']} ({kind} {size['width']}x{size['height']})"
        lines.append(
            f"| {row['model']} | {row['filter']} | {photo} | {row['exact']:.6f} | "
            f"{row['fast']:.4f} | {'yes' if row['fast_top5'] else '**no**'} |"
        )
    worst = max(rows, key=lambda r: r["fast"])
    changed = sum(not r["fast_top5"] for r in rows)
    lines += [
        "",
        f"Fast path, largest score difference: {worst['fast']:.4f} ({worst['model']}, "
        f"{worst['photo']}); top 5 changed in {changed} of {len(rows)} model-photo pairs. "
        f"Exact: largest {max(r['exact'] for r in rows):.6f}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", type=Path, help="a zoo directory (default: the cached one)")
    zoo = parser.parse_args().zoo or build_zoo()
    expected = json.loads((zoo / "expected.json").read_text())
    with tempfile.TemporaryDirectory() as work:
        rows = measure(zoo, expected, Path(work))
    text = report(rows, expected)
    results.write_section(results.RESULTS, "zoo", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
