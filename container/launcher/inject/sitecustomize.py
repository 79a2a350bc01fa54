"""Loaded by every training process the launcher starts (this folder is first on their PYTHONPATH): the
launcher's per-step timing (step_timing.py), then the sitecustomize the image itself has, if any, which
this file would otherwise hide. Python 3.10, stdlib."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # step_timing.py, beside this folder
try:
    import step_timing

    step_timing.install()
except Exception as error:  # timing must never stop training: say why, once
    print(f"step_timing: not timing this process's steps: {error}", file=sys.stderr)
finally:
    sys.path.remove(os.path.dirname(_HERE))

_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
)
if _spec is not None and _spec.loader is not None:
    _image_own = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_image_own)
