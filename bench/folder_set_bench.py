"""A checkpoint folder written from two nodes, for bench/checkpoint_bench.py: the time from the last close of
its files to the moment a restore would bring it back (both nodes' manifests list their part, and no node's
word puts it in doubt: checkpoint_sets.py), and the copier's upload rate beside boto3's transfer manager
sending the same files to the same server with the same parallelism (one thread per node)."""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "container" / "launcher"))
from checkpoint_commit import Rule  # noqa: E402
from checkpoint_sets import left_out  # noqa: E402
from checkpoint_sync import NodeStore, Watcher  # noqa: E402

NODES = 2
FILES_PER_NODE = 4


@dataclass(frozen=True)
class SetFigures:
    total_mib: int
    restorable_seconds: float  # from the last close to complete in S3
    settle_seconds: float
    copier_mib_s: float  # the set's bytes over the longest node's uploading sync
    transfer_manager_mib_s: float


def node_loop(watcher: Watcher, settle: float, stop: threading.Event, spent: list[float]) -> None:
    """checkpoint_sync.py's run loop, reduced to what a closed file needs: a sync once it has settled."""
    watcher.sync(Rule(settle))
    while not stop.is_set():
        watcher.arrivals.drain()
        if watcher.settles_at is not None and time.time() >= watcher.settles_at:
            start = time.perf_counter()
            if watcher.sync(Rule(settle)):
                spent.append(time.perf_counter() - start)
        time.sleep(0.1)


def run(client: Any, bucket: str, work: Path, *, mib_per_file: int, settle: float) -> SetFigures:
    uri = f"s3://{bucket}/bench/set"
    block = os.urandom(1 << 20)
    folders = []
    for node in range(NODES):
        folder = work / f"node-{node}" / "step-1"
        folder.mkdir(parents=True)
        for rank in range(node * FILES_PER_NODE, (node + 1) * FILES_PER_NODE):
            with (folder / f"__{rank}_0.distcp").open("wb") as out:
                for _ in range(mib_per_file):
                    out.write(block)
        folders.append(folder)
    closed = time.time()
    stop = threading.Event()
    spent: list[float] = []
    threads = []
    for node, folder in enumerate(folders):
        state = work / f"state-{node}"
        state.mkdir()
        watcher = Watcher(
            client,
            uri,
            node=node,
            directory=folder.parent,
            pid=os.getpid(),
            state_dir=state,
            sync_seconds=60,
            settle_seconds=settle,
        )
        threads.append(threading.Thread(target=node_loop, args=(watcher, settle, stop, spent)))
    for thread in threads:
        thread.start()
    stores = [NodeStore(client, uri, node) for node in range(NODES)]
    try:
        while True:
            documents = [store.read_document() for store in stores]
            listed = {
                n: {name: (e.listed_at, e.mtime_ns / 1e9) for name, e in files.items()}
                for n, (files, _) in enumerate(documents)
            }
            words = {n: word for n, (_, word) in enumerate(documents) if word is not None}
            if sum(len(files) for files in listed.values()) == NODES * FILES_PER_NODE and not left_out(listed, words):
                restorable = time.time() - closed
                break
            if time.time() - closed > settle + 600:
                raise RuntimeError("the set did not become restorable within 10 minutes of its settle time")
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    total = NODES * FILES_PER_NODE * mib_per_file

    def send(folder: Path) -> None:
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), bucket, f"bench/manager/{path.parent.parent.name}/{path.name}")

    start = time.perf_counter()
    with ThreadPoolExecutor(NODES) as pool:
        list(pool.map(send, folders))
    manager = time.perf_counter() - start
    return SetFigures(total, restorable, settle, total / max(spent), total / manager)
