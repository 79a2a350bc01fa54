"""The pins of container/versions.toml: every version the training images are built with, each with
the date it was checked and its source. The Dockerfiles declare each pin as a build argument with
the same default; CDK passes the file's values to both builds (local and cloud)."""

from __future__ import annotations

import datetime
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

VERSIONS_FILE = Path(__file__).resolve().parents[2] / "container" / "versions.toml"
UNMEASURED = "unmeasured"
# `ARG NAME=value` (a declaration with a default); a bare `ARG NAME` re-declares one after a FROM.
_ARG_DEFAULT = re.compile(r"^ARG\s+([A-Z0-9_]+)=(\S+)\s*$")
# A version written straight into an install line instead of coming from a build argument.
_LITERAL_PIN = re.compile(r"==\s*\d|-\d+\.\d+\.\d+\.tar\.gz")


@dataclass(frozen=True)
class Pin:
    name: str
    value: str
    images: tuple[str, ...]
    checked: datetime.date
    source: str
    compressed_size: str | None = None
    # Where the source was read: https addresses (versions.toml's `source_urls`).
    source_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class Versions:
    checked: datetime.date
    pins: Mapping[str, Pin]

    def build_args(self, image: str) -> dict[str, str]:
        """The build arguments of one image (the folder name of its Dockerfile under container/)."""
        return {pin.name: pin.value for pin in self.pins.values() if image in pin.images}


def load_versions(path: Path = VERSIONS_FILE) -> Versions:
    data = tomllib.loads(path.read_text())
    pins = {}
    for name, entry in data["pins"].items():
        pins[name] = Pin(
            name=name,
            value=str(entry["value"]),
            images=tuple(entry["images"]),
            checked=entry["checked"],
            source=str(entry["source"]),
            compressed_size=entry.get("compressed_size"),
            source_urls=tuple(entry.get("source_urls", ())),
        )
    return Versions(checked=data["checked"], pins=pins)


def dockerfile_drift(text: str, image: str, versions: Versions) -> list[str]:
    """What a Dockerfile pins that the versions file does not list for `image`, or lists otherwise;
    empty when they agree."""
    expected = versions.build_args(image)
    declared: dict[str, str] = {}
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        match = _ARG_DEFAULT.match(stripped)
        if match:
            declared[match.group(1)] = match.group(2)
        elif stripped.startswith("FROM ") and "${" not in stripped:
            problems.append(f"line {number} names its base image instead of a build argument: {stripped}")
        elif not stripped.startswith("#") and _LITERAL_PIN.search(stripped):
            problems.append(f"line {number} pins a version of its own: {stripped}")
    for name, value in declared.items():
        if name not in expected:
            problems.append(f"ARG {name}={value} is not a pin of image {image} in {VERSIONS_FILE.name}")
        elif value != expected[name]:
            problems.append(f"ARG {name}={value} differs from {VERSIONS_FILE.name}: {expected[name]}")
    problems += [
        f"{VERSIONS_FILE.name} pins {name} for image {image}, but the Dockerfile has no ARG {name}=..."
        for name in expected
        if name not in declared
    ]
    return problems
