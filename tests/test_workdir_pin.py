"""A workdir no one can break for good (trainctl/submitting/workdir.py, container/launcher/workdir_fetch.py):
stored with a conditional write, stored again over a key someone else wrote, and pinned in WORKDIR_URI by the
version stored and the archive's sha256, which every node reads and checks before it unpacks anything.
Against moto's S3 on 127.0.0.1."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from tests.harness import ROOT
from trainctl.errors import TrainctlError
from trainctl.submitting.requests import submit_request
from trainctl.submitting.workdir import URI_ENV, Packed, pack, stage, upload

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import workdir_fetch  # container/ is on the path only from here

_names = itertools.count()


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    from tests.local_aws import moto_server

    with moto_server() as endpoint:
        yield boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="test", aws_secret_access_key="test",  # noqa: S106 - moto accepts any key
        )  # fmt: skip


def bucket(s3: Any, *, versioned: bool = True) -> str:
    name = f"datasets-{next(_names)}"
    s3.create_bucket(Bucket=name)
    if versioned:  # as the deployment's dataset bucket (training_constructs/data/training_data.py)
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


def packed_code(folder: Path, text: str) -> Packed:
    (folder / "model").mkdir(parents=True)
    (folder / "train.py").write_text(text)
    (folder / "model" / "net.py").write_text("NET = 1\n")
    return pack(folder)


def versions(s3: Any, name: str, key: str) -> list[str]:
    """The key's versions, the current one last."""
    listed = s3.list_object_versions(Bucket=name, Prefix=key).get("Versions", [])
    return [v["VersionId"] for v in sorted(listed, key=lambda v: bool(v["IsLatest"]))]


def node_fetch(monkeypatch: pytest.MonkeyPatch, capsys: Any, s3: Any, uri: str, into: Path) -> tuple[int, str]:
    """A node's workdir_fetch.py on `uri`, with the moto client: its exit and its last line."""
    monkeypatch.setattr(boto3, "client", lambda *_a, **_k: s3)
    monkeypatch.setenv("WORKDIR_URI", uri)
    monkeypatch.delenv("WORKDIR_SETUP", raising=False)
    capsys.readouterr()
    code = int(workdir_fetch.main(["--dir", str(into)]))
    lines = capsys.readouterr().err.strip().splitlines()
    return code, lines[-1] if lines else ""


@pytest.mark.parametrize("their_checksum", ["SHA256", None], ids=["with-sha256", "sdk-default"])
def test_a_key_someone_wrote_over_is_stored_again_and_the_node_gets_the_right_files(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, their_checksum: str | None
) -> None:
    name = bucket(s3)
    ours = packed_code(tmp_path / "ours", "print('ours')\n")
    theirs = packed_code(tmp_path / "theirs", "print('theirs')\n")
    extra = {"ChecksumAlgorithm": their_checksum} if their_checksum else {}
    s3.put_object(Bucket=name, Key=ours.key, Body=theirs.archive, **extra)  # another submitter's PutObject

    line = stage(ours, bucket=name, s3=s3, dry_run=False)

    (theirs_version, our_version) = versions(s3, name, ours.key)
    assert line.endswith(
        f": {ours.location(name)} held other bytes (written by someone else): stored this archive over it, "
        f"pinned to version {our_version}"
    )
    code, said = node_fetch(monkeypatch, capsys, s3, ours.uri(name, our_version), tmp_path / "node")
    assert code == 0 and "2 files from" in said, said
    assert (tmp_path / "node" / "train.py").read_text() == "print('ours')\n"
    assert our_version != theirs_version


def test_an_overwrite_after_submit_does_not_change_what_the_pinned_node_gets(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    name = bucket(s3)
    ours = packed_code(tmp_path / "ours", "print('ours')\n")
    environment = {URI_ENV: ours.uri(name), "OTHER": "1"}
    request = submit_request(name="job", queue="q", definition="d", environment=environment)
    stage(ours, bucket=name, s3=s3, dry_run=False, environment=environment, request=request)
    (version,) = versions(s3, name, ours.key)
    pinned = ours.uri(name, version)
    # Both what the revision registers and what SubmitJob sends name the version stored.
    assert environment == {URI_ENV: pinned, "OTHER": "1"}
    (override,) = request["nodeOverrides"]["nodePropertyOverrides"]
    assert {URI_ENV: pinned, "OTHER": "1"} == {
        e["name"]: e["value"] for e in override["containerOverrides"]["environment"]
    }
    assert pinned == f"s3://{name}/{ours.key}?versionId={version}&sha256={ours.checksum}"

    s3.put_object(Bucket=name, Key=ours.key, Body=gzip.compress(b"not the code"), ChecksumAlgorithm="SHA256")

    code, said = node_fetch(monkeypatch, capsys, s3, pinned, tmp_path / "node")
    assert code == 0, said
    assert (tmp_path / "node" / "train.py").read_text() == "print('ours')\n"


def test_without_a_version_an_overwrite_is_refused_by_the_checksum_and_nothing_is_unpacked(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    name = bucket(s3, versioned=False)
    ours = packed_code(tmp_path / "ours", "print('ours')\n")
    line = stage(ours, bucket=name, s3=s3, dry_run=False)
    assert line.endswith(f"uploaded to {ours.location(name)}, pinned by sha256 (the bucket keeps no versions)")
    theirs = packed_code(tmp_path / "theirs", "print('theirs')\n")
    s3.put_object(Bucket=name, Key=ours.key, Body=theirs.archive)

    work = tmp_path / "work"
    work.mkdir()
    code, said = node_fetch(monkeypatch, capsys, s3, ours.uri(name), work / "node")
    assert code == 2
    assert said == (
        f"workdir_fetch.py: workdir: {ours.location(name)}: its bytes are not the archive trainctl submit pinned "
        f"(sha256 {theirs.checksum[:12]}..., not {ours.checksum[:12]}...): it was written over; submit again"
    )
    assert list(work.iterdir()) == []


def test_a_second_identical_submit_uploads_nothing_and_pins_the_version_stored(s3: Any, tmp_path: Path) -> None:
    name = bucket(s3)
    ours = packed_code(tmp_path / "ours", "print('ours')\n")
    first = upload(s3, name, ours)
    again = pack(tmp_path / "ours")  # packed anew, as by another trainctl
    environment = {URI_ENV: again.uri(name)}

    line = stage(again, bucket=name, s3=s3, dry_run=False, environment=environment)

    (version,) = versions(s3, name, ours.key)
    assert first.uploaded and first.version == version
    assert line.endswith(f"already stored as {ours.location(name)}: nothing uploaded, pinned to version {version}")
    assert environment == {URI_ENV: ours.uri(name, version)}


def test_a_checksum_the_store_misreports_is_still_refused_by_the_node(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """moto keeps a ChecksumSHA256 it was sent without checking the bytes (S3 refuses such a PUT): the node's
    own check of what it read is what holds, whether or not its SDK checks the response's checksum too."""
    name = bucket(s3)
    ours = packed_code(tmp_path / "ours", "print('ours')\n")
    theirs = packed_code(tmp_path / "theirs", "print('ourz')\n")
    assert len(theirs.archive) == len(ours.archive)  # the size S3 answers is ours too
    s3.put_object(
        Bucket=name, Key=ours.key, Body=theirs.archive, ChecksumAlgorithm="SHA256", ChecksumSHA256=ours.s3_checksum
    )
    line = stage(ours, bucket=name, s3=s3, dry_run=False)
    (version,) = versions(s3, name, ours.key)
    assert "already stored" in line

    unchecked = boto3.client(
        "s3", endpoint_url=s3.meta.endpoint_url, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",  # noqa: S106 - moto accepts any key
        config=Config(response_checksum_validation="when_required"),
    )  # fmt: skip
    code, said = node_fetch(monkeypatch, capsys, unchecked, ours.uri(name, version), tmp_path / "node")
    assert code == 2 and f"{ours.location(name)} (version {version}): its bytes are not the archive" in said
    assert not (tmp_path / "node").exists()


def test_a_uri_whose_checksum_does_not_match_the_bytes_is_one_line_and_exit_2(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    name = bucket(s3)
    ours = packed_code(tmp_path / "ours", "print('ours')\n")
    stored = upload(s3, name, ours)
    wrong = hashlib.sha256(b"other bytes").hexdigest()
    uri = f"{ours.location(name)}?versionId={stored.version}&sha256={wrong}"
    work = tmp_path / "work"
    work.mkdir()

    code, said = node_fetch(monkeypatch, capsys, s3, uri, work / "node")

    assert code == 2 and said.startswith("workdir_fetch.py: workdir: ") and f"not {wrong[:12]}..." in said
    assert list(work.iterdir()) == []


HEX = "a" * 64
KEY = f"s3://datasets/workdirs/{'b' * 64}.tar.gz"


@pytest.mark.parametrize(
    "query",
    ["sha256=abc", "versionId=v1", f"sha256={HEX}&extra=1", f"sha256={HEX}&sha256={HEX}", f"versionId=&sha256={HEX}",
     f"sha256={HEX.upper()}", "sha256"],
    ids=["short", "no-checksum", "unknown", "twice", "empty-version", "uppercase", "no-value"],
)  # fmt: skip
def test_a_pin_not_in_the_form_trainctl_writes_is_refused_in_one_line(query: str) -> None:
    with pytest.raises(workdir_fetch.Refused) as refused:
        workdir_fetch.parse(f"{KEY}?{query}")
    assert str(refused.value).endswith(
        "its query is versionId=<S3 version id>&sha256=<64 lowercase hex digits>, as trainctl submit writes it"
    )


def test_the_node_reads_the_pin_trainctl_writes_and_an_older_unpinned_uri() -> None:
    pinned = workdir_fetch.parse(f"{KEY}?versionId=3sL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY&sha256={HEX}")
    assert (pinned.version, pinned.checksum, pinned.digest) == ("3sL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY", HEX, "b" * 64)
    assert pinned.shown == f"{KEY} (version 3sL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY)"
    older = workdir_fetch.parse(KEY)  # an older trainctl's: the digest in its name is all it is checked by
    assert (older.version, older.checksum, older.key) == (None, None, f"workdirs/{'b' * 64}.tar.gz")


def client_error(code: str, status: int) -> dict[str, Any]:
    return {"service_error_code": code, "http_status_code": status}


def test_a_concurrent_write_or_a_delete_between_the_calls_is_tried_again(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")  # noqa: S106
    ours = packed_code(tmp_path / "ours", "print('ours')\n")
    with Stubber(s3) as stub:
        stub.add_client_error("put_object", **client_error("ConditionalRequestConflict", 409))
        stub.add_client_error("put_object", **client_error("PreconditionFailed", 412))
        stub.add_client_error("head_object", **client_error("404", 404))  # deleted since the refusal
        stub.add_response("put_object", {"VersionId": "v3"})
        stored = upload(s3, "datasets", ours)
        stub.assert_no_pending_responses()
    assert (stored.version, stored.uploaded, stored.replaced) == ("v3", True, False)
    with Stubber(s3) as stub:
        for _ in range(3):
            stub.add_client_error("put_object", **client_error("ConditionalRequestConflict", 409))
        with pytest.raises(TrainctlError, match="kept changing while trainctl stored it \\(3 tries\\): submit again"):
            upload(s3, "datasets", ours)
