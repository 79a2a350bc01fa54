"""The node-file bundle (training_constructs/common/node_files.py): one command that writes several files from
one gzip stream. The fleets' own bundle is run in tests/test_host_check.py."""

from __future__ import annotations

import ast
import base64
import gzip
import subprocess
from pathlib import Path

import pytest

from tests.harness import bundle_command, node_files
from training_constructs.common.node_files import SPLITTER, bundle, write_packed_files

FILES = [
    ("/usr/local/libexec/a.py", b"print('a')\n"),
    ("/opt/deep/new/folder/b.json", b'{"b": 1}'),
    ("/opt/deep/c.bin", bytes(range(256)) * 3),  # any bytes, newlines and NULs included
    ("/opt/empty", b""),
]


def run(command: str, root: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["bash", "-c", f"{command} {root}"], capture_output=True, timeout=30)


def written(root: Path) -> dict[str, bytes]:
    return {f"/{path.relative_to(root)}": path.read_bytes() for path in root.rglob("*") if not path.is_dir()}


def test_the_command_writes_every_file_whole_and_makes_its_folders(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "empty").write_bytes(b"left from before")  # replaced, not appended to
    done = run(write_packed_files(FILES), root)
    assert done.returncode == 0, done.stderr
    assert written(root) == dict(FILES)
    # The suite's reader of user data reads the same files.
    assert node_files(write_packed_files(FILES)) == dict(FILES)


def test_a_damaged_bundle_writes_nothing(tmp_path: Path) -> None:
    command = write_packed_files(FILES)
    blob = command.rsplit("'", 2)[1]
    raw = bytearray(base64.b64decode(blob))
    raw[len(raw) // 2] ^= 0xFF  # inside the compressed data: gzip's CRC or the stream itself fails
    done = run(command.replace(blob, base64.b64encode(bytes(raw)).decode()), tmp_path / "root")
    assert done.returncode != 0 and not (tmp_path / "root").exists()


def test_one_gzip_stream_without_a_timestamp_so_templates_change_only_with_content() -> None:
    command = write_packed_files(FILES)
    assert bundle_command(command) == command and command.count("H4sI") == 1
    packed = base64.b64decode(command.rsplit("'", 2)[1])
    assert packed[4:8] == b"\0\0\0\0"  # gzip MTIME (RFC 1952)
    assert gzip.decompress(packed) == bundle(FILES)
    assert write_packed_files(list(FILES)) == command
    assert write_packed_files([*FILES[:-1], ("/opt/empty", b"x")]) != command


def test_the_splitter_runs_on_the_hosts_python_3_9() -> None:
    # AL2023's python3 (3.9); the shell passes it in single quotes, so it must hold none.
    ast.parse(SPLITTER, feature_version=(3, 9))
    assert "'" not in SPLITTER


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ([], "no node files to write"),
        ([("opt/a", b"")], "node file 'opt/a': expected an absolute path to a file"),
        ([("/opt/", b"")], "node file '/opt/': expected an absolute path to a file"),
        ([("/opt/a", b""), ("/opt/a", b"x")], "node files written twice: /opt/a"),
    ],
)
def test_bad_file_lists_are_refused_by_name(files: list[tuple[str, bytes]], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        write_packed_files(files)
