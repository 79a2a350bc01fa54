"""Fault injection for tests/test_checkpoints.py: run as CHECKPOINT_PYTHON's script, it runs
checkpoint_sync.py (the first argument) as the launcher would, but SIGKILLs its whole process group
(the launcher, the trainer and itself: what ECS does when the stop timeout runs out) right after
the KILL_AFTER_UPLOADS-th checkpoint file reached S3, before any manifest names it."""

from __future__ import annotations

import os
import runpy
import signal
import sys
from typing import Any

import boto3

KILL_AFTER = int(os.environ["KILL_AFTER_UPLOADS"])
uploads = 0
make_client = boto3.client


def remember_key(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    context["fault_key"] = params.get("Key", "")


def count_upload(context: dict[str, Any], **_: Any) -> None:
    global uploads
    if context.get("fault_key", "").endswith(".manifest.json"):
        return
    uploads += 1
    if uploads == KILL_AFTER:
        os.killpg(os.getpgid(0), signal.SIGKILL)


def client(*args: Any, **kwargs: Any) -> Any:
    made = make_client(*args, **kwargs)
    for operation in ("PutObject", "CompleteMultipartUpload"):
        made.meta.events.register(f"before-parameter-build.s3.{operation}", remember_key)
        made.meta.events.register(f"after-call.s3.{operation}", count_upload)
    return made


boto3.client = client
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
runpy.run_path(script, run_name="__main__")
