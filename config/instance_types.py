"""Every EC2 instance type name AWS knows, from the EC2 service model that botocore ships (the
`InstanceType` enum of botocore/data/ec2/2016-11-15/service-2.json.gz): an offline check, with no
AWS call, for keys that take a type outside the instance catalog (the Slurm head node). A type AWS
adds is known with the next botocore.

Importing botocore and loading the model take about half a second, so the names are kept in a
small cache file per botocore version and model file (in $XDG_CACHE_HOME or ~/.cache), found
without importing botocore; a cache that cannot be read or written only costs that time again.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from pathlib import Path

EC2_API_VERSION = "2016-11-15"
# Found without importing botocore: where the package is, and the version its __init__ declares.
_SPEC = importlib.util.find_spec("botocore")
_BOTOCORE = Path(_SPEC.origin).parent if _SPEC and _SPEC.origin else Path()
_MODEL = _BOTOCORE / "data" / "ec2" / EC2_API_VERSION / "service-2.json.gz"
_INIT = _BOTOCORE / "__init__.py"
_DECLARED = re.search(r"^__version__ = ['\"]([^'\"]+)", _INIT.read_text() if _INIT.is_file() else "", re.MULTILINE)
botocore_version = _DECLARED[1] if _DECLARED else "unknown"


def _cache_file() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    size = _MODEL.stat().st_size if _MODEL.exists() else 0
    return base / "aws-training-cdk" / f"ec2-instance-types-{botocore_version}-{size}.json"


def _from_model() -> tuple[str, ...]:
    if _SPEC is None:
        raise ModuleNotFoundError(
            "botocore is needed to check instance types outside the catalog: pip install -r requirements.txt"
        )
    from botocore.loaders import Loader  # slow to import: only when the cache has no list

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
