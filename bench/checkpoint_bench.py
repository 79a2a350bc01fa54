"""`make bench-checkpoints`: what container/launcher/checkpoint_sync.py costs, against moto's S3 server on
127.0.0.1 (a versioned bucket, as the stack's).

- idle poll: one periodic sync over --files checkpoint files that are all uploaded already (the
  directory walk, the stat calls, the /proc scan of the trainer's process tree and inotify; no S3
  request). Target: under 1 s for 1,000 files.
- upload rate: one --size-mib file through the same upload path (boto3's managed transfer, then
  the version id). A local server measures the client's side only, not the network of a node.
- a file rewritten in place (checkpoint_snapshots.py): the copier's look with nothing closed (what
  every 0.1 s tick costs), and the time from a --copy-mib file's close to its trusted copy (the
  copy, then the two looks that must see no process of the trainer end).
- a folder written from two nodes (folder_set_bench.py): --set-mib MiB in 8 files, 4 per node, from the
  last close to restorable (both manifests list it and checkpoint_sets.py leaves none of it out) with
  --set-settle seconds of settle time, and the copier's rate beside boto3's transfer manager.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import boto3
from moto.server import ThreadedMotoServer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "container" / "launcher"))
from checkpoint_commit import Rule, open_for_writing, process_tree  # noqa: E402
from checkpoint_snapshots import Snapshots  # noqa: E402
from checkpoint_sync import NodeStore, Watcher  # noqa: E402
from folder_set_bench import FILES_PER_NODE, NODES  # noqa: E402
from folder_set_bench import run as folder_set  # noqa: E402

BUCKET = "checkpoints"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--polls", type=int, default=5)
    parser.add_argument("--copy-mib", type=int, default=256)
    parser.add_argument("--set-mib", type=int, default=1024)
    parser.add_argument("--set-settle", type=float, default=30.0, help="the copier's settle time (its default: 30)")
    args = parser.parse_args()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",  # noqa: S106 - moto accepts any key
    )
    client.create_bucket(Bucket=BUCKET)
    client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    try:
        with tempfile.TemporaryDirectory() as work:
            directory = Path(work, "checkpoints")
            for i in range(args.files):
                run = directory / f"run_{i // 100}"
                run.mkdir(parents=True, exist_ok=True)
                (run / f"model_{i}.pt").write_bytes(os.urandom(1024))
            old = time.time() - 3600
            for path in directory.rglob("*.pt"):
                os.utime(path, (old, old))  # saved an hour ago: settled
            watcher = Watcher(
                client,
                f"s3://{BUCKET}/bench/job",
                node=0,
                directory=directory,
                pid=os.getpid(),
                state_dir=Path(work),
                sync_seconds=60,
                settle_seconds=30,
            )
            start = time.perf_counter()
            first = watcher.sync(Rule(30))
            first_seconds = time.perf_counter() - start
            polls = []
            for _ in range(args.polls):
                start = time.perf_counter()
                uploaded = watcher.sync(Rule(30))
                polls.append(time.perf_counter() - start)
                assert uploaded == 0, f"an idle poll uploaded {uploaded} files"

            big = Path(work, "big.pt")
            block = os.urandom(1 << 20)
            with big.open("wb") as f:
                for _ in range(args.size_mib):
                    f.write(block)
            store = NodeStore(client, f"s3://{BUCKET}/bench/job", 0)
            start = time.perf_counter()
            entry = store.upload(big, "big.pt")
            upload_seconds = time.perf_counter() - start
            assert entry is not None and entry.size == args.size_mib << 20

            snapshots = Snapshots(directory, Path(work, "snapshots"))
            pid = os.getpid()

            def look(closed: list[Path]) -> int:
                return snapshots.after_events(
                    closed,
                    tree=lambda: process_tree(pid),
                    writing=lambda: open_for_writing(process_tree(pid), directory),
                    now=time.monotonic(),
                )

            in_place = directory / "snapshot.pt"
            with in_place.open("wb") as f:
                for _ in range(args.copy_mib):
                    f.write(block)
            look([in_place])  # its first close: remembered
            idle = []
            for _ in range(50):
                start = time.perf_counter()
                look([])
                idle.append(time.perf_counter() - start)
            with in_place.open("r+b") as f:  # the next save, on the same inode
                f.write(os.urandom(1 << 20))
            start = time.perf_counter()
            promoted = look([in_place]) + look([]) + look([])
            copy_seconds = time.perf_counter() - start
            assert promoted == 1, "the rewrite's copy was not trusted"
            per_file = args.set_mib // (NODES * FILES_PER_NODE)
            figures = folder_set(client, BUCKET, Path(work, "set"), mib_per_file=per_file, settle=args.set_settle)
    finally:
        server.stop()

    print(f"cores: {os.cpu_count()}")
    print(f"first sync of {args.files} files of 1 KiB: {first} uploaded in {first_seconds:.2f} s")
    print(
        f"idle poll over {args.files} files, median of {args.polls}: {statistics.median(polls) * 1000:.1f} ms "
        f"(max {max(polls) * 1000:.1f} ms; target < 1000 ms)"
    )
    rate = args.size_mib / upload_seconds
    print(f"upload of one {args.size_mib} MiB file to the local server: {upload_seconds:.1f} s, {rate:.0f} MiB/s")
    print(f"a look with nothing closed, median of 50: {statistics.median(idle) * 1000:.2f} ms")
    print(
        f"a {args.copy_mib} MiB file rewritten in place: copied and judged in {copy_seconds:.2f} s "
        f"({args.copy_mib / copy_seconds:.0f} MiB/s), trusted two 0.1 s ticks after its close; then uploaded"
    )
    print(
        f"a {figures.total_mib} MiB folder of {NODES * FILES_PER_NODE} files on {NODES} nodes: restorable "
        f"{figures.restorable_seconds:.1f} s after its last close (settle time {figures.settle_seconds:g} s); "
        f"the copier sent it at {figures.copier_mib_s:.0f} MiB/s, boto3's transfer manager at "
        f"{figures.transfer_manager_mib_s:.0f} MiB/s (one thread per node, the same server)"
    )


if __name__ == "__main__":
    main()
