"""Section 1: request building, TF Serving's client recipe against the gateway against the
decode floor (bench.recipe runs each side in a fresh process)."""

from __future__ import annotations

from typing import Any

from bench import recipe
from bench.sections import Facts, Scale


def building_section(all_photos: dict[str, bytes], scale: Scale) -> tuple[list[str], Facts]:
    """Section 1: the recipe and the gateway each in a fresh process per allocator state
    (bench.recipe), so neither inherits the other's allocator state."""
    names = ",".join(all_photos)
    rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    parse: dict[str, float] = {}
    for state in recipe.STATES:
        for part in ("recipe", "gateway"):
            run = recipe.in_state(
                state, "build", f"--images={names}", f"--repeat={scale.building_repeat}",
                f"--part={part}",
            )  # fmt: skip
            rows[state, part] = {r["name"]: r for r in run["rows"]}
            if part == "recipe" and state == "default":
                parse["recipe"] = run["parse_us"]["recipe"]
    parse["gateway"] = recipe.in_state("default", "build", "--images=JPEG 640x480",
                                       "--repeat=5")["parse_us"]["gateway"]  # fmt: skip
    tuned = [s for s in recipe.STATES if s != "default"]
    lines = [
        "| image | (a) recipe: default / "
        + " / ".join(tuned)
        + " | (b) gateway: default / "
        + " / ".join(tuned)
        + " | (c) decode floor | best tuned (a) / default (b) | (b)/(c) "
        "| request bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    facts: Facts = {"building": []}
    for name in all_photos:

        def cell(part: str, name: str = name) -> str:
            values = [rows[s, part][name] for s in recipe.STATES]
            return " / ".join(
                f"{v[f'{part}_ms']:.2f} ms ({v[f'{part}_faults']:,.0f})" for v in values
            )

        gw = rows["default", "gateway"][name]
        best = min(rows[s, "recipe"][name]["recipe_ms"] for s in tuned)
        speedup = best / gw["gateway_ms"]
        facts[f"floor-{name}"] = gw["floor_ms"]
        facts["building"].append(
            (name, speedup, gw["gateway_ms"] / gw["floor_ms"], best / gw["floor_ms"])
        )
        lines.append(
            f"| {name} ({gw['image_bytes'] / 1e6:.2f} MB) | {cell('recipe')} | "
            f"{cell('gateway')} | {gw['floor_ms']:.2f} ms | {speedup:.2f}x "
            f"| {gw['gateway_ms'] / gw['floor_ms']:.3f}x | {gw['request_bytes'] / 1e6:.2f} MB |"
        )
    lines += [
        "",
        "Milliseconds per request built (median), minor page faults per call in brackets "
        "(a fault is memory the kernel maps in fresh; unlike time, the count does not depend "
        "on the machine's load). Allocator states: default, glibc as a process starts (the "
        "gateway process itself sets 2 arenas and 32 MiB mmap / 64 MiB trim thresholds at "
        "startup, gateway/memory.py, close to tuned+trim; this section builds requests in "
        "the bench process, in each state); "
        + "; ".join(
            f"{s}: `{' '.join(f'{k}={v}' for k, v in recipe.STATES[s].items())}`" for s in tuned
        )
        + ". Each (state, side) is a new process (`python -m bench.recipe build --part ...`), "
        f"medians of {scale.building_repeat} (12 MP: {max(3, scale.building_repeat // 4)}) "
        "after a warm-up call; the decode floor runs interleaved with the gateway. "
        "Speed-ups are against the fastest tuned recipe.",
        "",
        "Reading a PredictResponse (4 outputs, 100 detections, `float_val` as TF Serving sends "
        f"by default): recipe `np.array(float_val)` of every output {parse['recipe']:.0f} µs; "
        "gateway, as the detection task reads it (each output checked as an `OutputTensor`, then "
        f"only the rows below num_detections, 5 of 100) {parse['gateway']:.0f} µs.",
    ]
    return lines, facts
