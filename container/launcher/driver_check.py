#!/usr/bin/env python3
"""Refuse to train on a host NVIDIA driver older than the GPU needs.

The job definitions set MIN_NVIDIA_DRIVER from the instance catalog (config/catalog.py cites
NVIDIA's documented minimum for each Blackwell GPU). The ECS GPU AMI brings its own driver, so a
node can come up with one too old for a new GPU; CUDA then fails with an error that names neither
the driver nor the fix. This check says so in one line before anything starts.

    driver_check.py [--minimum VERSION] [--proc-version PATH]

Exit 0: no minimum set, or the driver is new enough. Exit 2: one line on stderr naming the driver
found and the minimum (or why no driver version could be read). Functions here are also meant for
the launcher's preflight to call. Standard library only; runs on Python 3.10.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys

PROC_VERSION = "/proc/driver/nvidia/version"
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..." (open
# kernel module) or "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  <date>".
_NVRM = re.compile(r"^NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", re.MULTILINE)
_VERSION = re.compile(r"\d+(?:\.\d+)*")


def parse_version(text: str) -> tuple[int, ...]:
    """'580.95.05' -> (580, 95, 5); compared as numbers, never as strings."""
    value = text.strip()
    if not _VERSION.fullmatch(value):
        raise ValueError(f"not a driver version: {text!r}")
    return tuple(int(part) for part in value.split("."))


def driver_from_proc(text: str) -> str | None:
    """The driver version in the text of /proc/driver/nvidia/version, or None."""
    match = _NVRM.search(text)
    return match.group(1) if match else None


def drivers_from_smi_csv(text: str) -> list[str]:
    """Every GPU's driver_version from `nvidia-smi --query-gpu=...,driver_version,... --format=csv`."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    if not rows or "driver_version" not in rows[0]:
        return []
    column = rows[0].index("driver_version")
    return [row[column].strip() for row in rows[1:] if len(row) > column]


def older_than(found: str, minimum: str) -> str | None:
    """A one-line complaint when `found` is older than `minimum`, else None."""
    if parse_version(found) >= parse_version(minimum):
        return None
    return (
        f"NVIDIA driver {found} on this host is older than {minimum} (MIN_NVIDIA_DRIVER), the oldest "
        "NVIDIA documents for this GPU: use a newer ECS GPU AMI or set the fleet's AMI"
    )


def check(minimum: str, proc_version: str = PROC_VERSION) -> str | None:
    """The complaint for this host, or None when the driver is new enough or no minimum is set."""
    if not minimum:
        return None
    parse_version(minimum)
    try:
        with open(proc_version, encoding="utf-8", errors="replace") as handle:
            found = driver_from_proc(handle.read())
    except OSError as error:
        reason = f"cannot read the NVIDIA driver version from {proc_version} ({error.strerror})"
        return f"{reason}; MIN_NVIDIA_DRIVER is {minimum}"
    if found is None:
        return f"no NVIDIA driver version in {proc_version}; MIN_NVIDIA_DRIVER is {minimum}"
    return older_than(found, minimum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minimum", default=os.environ.get("MIN_NVIDIA_DRIVER", ""))
    parser.add_argument("--proc-version", default=PROC_VERSION)
    args = parser.parse_args(argv)
    try:
        problem = check(args.minimum, args.proc_version)
    except ValueError as error:
        problem = f"MIN_NVIDIA_DRIVER: {error}"
    if problem:
        print(f"preflight: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
