"""Every EC2 instance type name AWS knows, from the EC2 service model that botocore ships (the
`InstanceType` enum of botocore/data/ec2/2016-11-15/service-2.json.gz): an offline check, with no
AWS call, for keys that take a type outside the instance catalog (the Slurm head node). A type AWS
adds is known with the next botocore.

Loading the model takes about a third of a second, so the names are kept in a small cache file per
botocore version and model file (in $XDG_CACHE_HOME or ~/.cache); a cache that cannot be read or
written only costs that time again.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import botocore
from botocore.loaders import Loader

EC2_API_VERSION = "2016-11-15"
botocore_version: str = botocore.__version__
_MODEL = Path(botocore.__file__).parent / "data" / "ec2" / EC2_API_VERSION / "service-2.json.gz"


def _cache_file() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    size = _MODEL.stat().st_size if _MODEL.exists() else 0
    return base / "aws-training-cdk" / f"ec2-instance-types-{botocore.__version__}-{size}.json"


def _from_model() -> tuple[str, ...]:
    model = Loader().load_service_model("ec2", "service-2", EC2_API_VERSION)
    return tuple(model["shapes"]["InstanceType"]["enum"])


@functools.cache
def ec2_instance_types() -> frozenset[str]:
    """The instance type names of botocore's EC2 model."""
    cache = _cache_file()
    try:
        names = json.loads(cache.read_text())
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            return frozenset(names)
    except (OSError, ValueError):
        pass
    names = _from_model()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(sorted(names)))
        partial.replace(cache)  # atomic: a concurrent synth reads the old file or the whole new one
    except OSError:
        pass
    return frozenset(names)
