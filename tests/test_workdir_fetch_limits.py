"""What a node unpacks from a workdir archive that someone replaced in S3 (container/launcher/workdir_fetch.py):
it streams, stays within what `trainctl submit` packs, and takes only files, folders and links. Each hostile
archive ends in one line and exit 2, before the command runs."""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.harness import ROOT
from trainctl.submitting.workdir import MAX_BYTES

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import workdir_fetch  # container/ is on the path only from here


class OneObject:
    """get_object answering one body, as a stream."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def get_object(self, **_: Any) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.body)}


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return raw.getvalue()


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def fetch_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, body: bytes, key: str) -> tuple[int, str]:
    monkeypatch.setattr(boto3, "client", lambda *_a, **_k: OneObject(body))
    monkeypatch.setenv("WORKDIR_URI", f"s3://datasets/{key}")
    monkeypatch.delenv("WORKDIR_SETUP", raising=False)
    code = int(workdir_fetch.main(["--dir", str(tmp_path / "node")]))
    lines = capsys.readouterr().err.strip().splitlines()
    return code, lines[-1] if lines else ""


def named(tar: bytes) -> str:
    return f"workdirs/{hashlib.sha256(tar).hexdigest()}.tar.gz"


def test_the_node_limit_is_what_trainctl_packs() -> None:
    assert workdir_fetch.MAX_FILE_BYTES == MAX_BYTES
    assert workdir_fetch.MAX_TAR_BYTES > MAX_BYTES


def test_a_good_archive_streams_through_and_unpacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    tar = tar_of(file_member("train.py", b"print('ok')\n"), file_member("data/a.txt", b"x" * 5000))
    monkeypatch.setattr(workdir_fetch, "CHUNK_BYTES", 512)  # many pieces, as a large archive arrives
    code, line = fetch_line(monkeypatch, tmp_path, capsys, gzip.compress(tar), named(tar))
    assert code == 0 and "2 files" in line
    assert (tmp_path / "node" / "data" / "a.txt").read_bytes() == b"x" * 5000


def test_a_gzip_bomb_is_refused_without_inflating_it_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    monkeypatch.setattr(workdir_fetch, "MAX_TAR_BYTES", 1 << 20)
    monkeypatch.setattr(workdir_fetch, "CHUNK_BYTES", 1 << 16)
    kept: list[int] = []
    real = workdir_fetch._gunzip

    def watched(body: Any, out: Any, uri: str) -> str:
        try:
            return real(body, out, uri)
        finally:
            kept.append(out.tell())

    monkeypatch.setattr(workdir_fetch, "_gunzip", watched)
    bomb = gzip.compress(b"\0" * (16 << 20))  # 16 MiB of zeros in about 16 KiB
    assert len(bomb) < 100_000
    code, line = fetch_line(monkeypatch, tmp_path, capsys, bomb, f"workdirs/{'a' * 64}.tar.gz")
    assert code == 2 and "unpacks to more than 1 MiB" in line
    assert kept and kept[0] <= (1 << 20) + (1 << 16)  # stopped at the cap, one piece past it at most
    assert not (tmp_path / "node").exists() or not any((tmp_path / "node").iterdir())


def test_files_past_the_upload_limit_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any) -> None:
    monkeypatch.setattr(workdir_fetch, "MAX_FILE_BYTES", 1000)
    tar = tar_of(file_member("a.bin", b"1" * 600), file_member("b.bin", b"2" * 600))
    code, line = fetch_line(monkeypatch, tmp_path, capsys, gzip.compress(tar), named(tar))
    assert code == 2 and "pass 1000 bytes at 'b.bin': more than trainctl packs" in line
    assert not (tmp_path / "node" / "b.bin").exists()


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar to write a sparse member")
def test_a_sparse_member_is_refused_before_it_is_written(tmp_path: Path) -> None:
    hollow = tmp_path / "src" / "hollow"
    hollow.parent.mkdir()
    with hollow.open("wb") as out:
        out.truncate(256 << 20)  # 256 MiB of nothing: a few hundred bytes in a sparse tar
    archive = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(archive), "-C", str(hollow.parent), "hollow"], check=True)
    assert archive.stat().st_size < 64 * 1024
    with pytest.raises(workdir_fetch.Refused, match="'hollow' is a sparse file"):
        workdir_fetch.unpack(archive.read_bytes(), str(tmp_path / "node"))
    assert not (tmp_path / "node" / "hollow").exists()


@pytest.mark.parametrize(
    "kind", [tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE], ids=["hard-link", "device", "fifo"]
)
def test_only_files_folders_and_links_are_unpacked(tmp_path: Path, kind: bytes) -> None:
    odd = tarfile.TarInfo("odd")
    odd.type, odd.linkname = kind, "train.py"
    tar = tar_of(file_member("train.py", b"pass\n"), (odd, b""))
    with pytest.raises(workdir_fetch.Refused, match="'odd' is neither a file nor a link"):
        workdir_fetch.unpack(tar, str(tmp_path / "node"))


@pytest.mark.parametrize(
    ("body", "key", "said"),
    [
        (gzip.compress(b"anything"), "workdirs/code.tar.gz", "is not named <sha256>.tar.gz"),
        (b"not gzip at all", f"workdirs/{'b' * 64}.tar.gz", "is not a gzip archive"),
        (gzip.compress(b"a") + b"trailing", f"workdirs/{'c' * 64}.tar.gz", "is not one whole gzip archive"),
        (gzip.compress(b"tar")[:-6], f"workdirs/{'d' * 64}.tar.gz", "is not one whole gzip archive"),
        (gzip.compress(b"other"), f"workdirs/{'e' * 64}.tar.gz", "does not match the digest in its name"),
    ],
    ids=["no-digest-name", "not-gzip", "trailing-bytes", "cut-short", "other-content"],
)
def test_an_archive_that_is_not_the_one_trainctl_uploaded_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, body: bytes, key: str, said: str
) -> None:
    code, line = fetch_line(monkeypatch, tmp_path, capsys, body, key)
    assert code == 2 and line.startswith("workdir_fetch.py: workdir: ") and said in line


def test_running_out_of_memory_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    tar = tar_of(file_member("train.py", b"pass\n"))

    def exhausted(*_: Any) -> int:
        raise MemoryError

    monkeypatch.setattr(workdir_fetch, "unpack", exhausted)
    code, line = fetch_line(monkeypatch, tmp_path, capsys, gzip.compress(tar), named(tar))
    assert code == 2 and line.startswith("workdir_fetch.py: workdir: ") and "more memory" in line


class Pieces:
    """A body read in pieces: `head`, then `tail_pieces` pieces of junk; counts the reads."""

    def __init__(self, head: bytes, tail_pieces: int) -> None:
        self.pieces = [head] + [b"\xff" * 4096] * tail_pieces
        self.reads = 0

    def read(self, _size: int) -> bytes:
        self.reads += 1
        return self.pieces.pop(0) if self.pieces else b""


def test_bytes_after_the_gzip_end_are_refused_as_they_arrive_not_gathered(tmp_path: Path) -> None:
    tar = tar_of(file_member("train.py", b"pass\n"))
    body = Pieces(gzip.compress(tar) + b"junk", tail_pieces=10_000)  # 40 MB more, were it all read
    with pytest.raises(workdir_fetch.Refused, match="is not one whole gzip archive"):
        workdir_fetch._gunzip(body, io.BytesIO(), "s3://datasets/w.tar.gz")
    assert body.reads == 1
