"""Code that goes with the job (docs/workdir.md): the folder packed as git sees it, the same files giving the
same archive, stored once per content hash in the dataset bucket (moto on 127.0.0.1), the script checked
before anything is submitted, and the real launcher fetching, unpacking and setting it up before the command."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from config.catalog import CATALOG
from tests.harness import ROOT
from tests.test_rehearsal import definition as rehearsal_definition
from tests.test_trainctl import one_error_line
from tests.test_trainctl import trainctl as trainctl  # fixtures
from tests.test_trainctl import world as world
from tests.trainctl_world import DATASET_BUCKET, World
from trainctl.errors import ExitCode, TrainctlError
from trainctl.rehearsal.session import Options, rehearse
from trainctl.submitting.taskfile import LAUNCHER as LAUNCHER_IN_IMAGE
from trainctl.submitting.taskfile import load_task
from trainctl.submitting.workdir import (
    PREFIX,
    SETUP_ENV,
    URI_ENV,
    check_definition_script,
    check_script,
    definition_script,
    pack,
    upload,
)
from training_constructs.jobs.workloads import ALLREDUCE_BENCH, ISAACLAB_TRAIN_SCRIPT, training_workload

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import workdir_fetch  # container/ is on the path only from here

LAUNCHER = ROOT / "container" / "distributed_run.sh"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


CODE = {
    "train.py": "print('training')\n",
    "model/net.py": "NET = 1\n",
    ".gitignore": "*.log\n!keep.log\ndata/\n",
    "keep.log": "kept\n",
    "run.log": "left out\n",
    "data/big.bin": "left out\n",
    "model/.gitignore": "scratch.py\n",
    "model/scratch.py": "left out\n",
    ".git/HEAD": "ref: refs/heads/main\n",
}


# ----------------------------------------------------------------------------------------------- packing
def test_the_folder_is_packed_as_git_sees_it(tmp_path: Path) -> None:
    packed = pack(tree(tmp_path / "code", CODE))
    assert packed.files == {"train.py", "model/net.py", ".gitignore", "keep.log", "model/.gitignore"}
    with tarfile.open(fileobj=io.BytesIO(packed.archive), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == sorted(packed.files)


def test_the_same_files_give_the_same_digest_whenever_and_wherever_they_are(tmp_path: Path) -> None:
    first = pack(tree(tmp_path / "a", CODE))
    second_folder = tree(tmp_path / "b", dict(reversed(CODE.items())))
    os.utime(second_folder / "train.py", (1, 1))
    second = pack(second_folder)
    assert (second.digest, second.archive) == (first.digest, first.archive)
    assert second.key == f"{PREFIX}{first.digest}.tar.gz"
    (second_folder / "model" / "net.py").write_text("NET = 2\n")
    assert pack(second_folder).digest != first.digest
    (second_folder / "model" / "net.py").write_text("NET = 1\n")
    (second_folder / "train.py").chmod(0o755)  # the executable bit is content too
    assert pack(second_folder).digest != first.digest


def test_a_folder_past_the_limit_is_refused_naming_its_size_and_the_limit(tmp_path: Path) -> None:
    folder = tree(tmp_path / "code", {"train.py": "x" * 3 * 2**20, "weights.pt": "y" * 2**19})
    with pytest.raises(TrainctlError) as refused:
        pack(folder, limit=2**21)
    line = refused.value.message
    assert "3.5 MiB" in line and "2.0 MiB limit" in line and ".gitignore" in line and len(line) <= 200
    (folder / ".gitignore").write_text("*.pt\ntrain.py\n")
    assert pack(folder, limit=2**21).files == {".gitignore"}


def test_links_stay_links_and_one_leaving_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tree(tmp_path / "code", {"src/train.py": "pass\n"})
    (folder / "train.py").symlink_to("src/train.py")
    assert pack(folder).files == {"src/train.py", "train.py"}
    (folder / "secrets").symlink_to("../../etc")
    with pytest.raises(TrainctlError, match=r"link secrets -> \.\./\.\./etc points outside the folder"):
        pack(folder)


def test_a_chain_of_links_leaving_the_folder_is_refused(tmp_path: Path) -> None:
    """`l -> .` then `up -> l/..` reads as inside the folder (normpath) but leads to its parent."""
    folder = tree(tmp_path / "code", {"train.py": "pass\n"})
    (folder / "l").symlink_to(".")
    assert pack(folder).files == {"train.py", "l"}
    (folder / "up").symlink_to("l/..")
    with pytest.raises(TrainctlError, match=r"link up -> l/\.\. points outside the folder"):
        pack(folder)


def test_an_absolute_link_is_refused_with_the_gitignore_way_out(tmp_path: Path) -> None:
    folder = tree(tmp_path / "code", {"train.py": "pass\n"})
    (folder / "data").symlink_to("/fsx/data")
    with pytest.raises(TrainctlError) as refused:
        pack(folder)
    assert "link data -> /fsx/data is absolute: add it to .gitignore" in refused.value.message
    (folder / ".gitignore").write_text("data\n")
    assert pack(folder).files == {"train.py", ".gitignore"}


def test_workdir_refusals_shorten_long_paths_and_still_name_them(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120) / ("e" * 120)
    folder = tree(deep / "code", {"train.py": "pass\n"})
    (folder / ("l" * 150)).symlink_to("/" + "t" * 150)
    lines = []
    with pytest.raises(TrainctlError) as absolute:
        pack(folder)
    lines.append(absolute.value.message)
    (folder / ("l" * 150)).unlink()
    (folder / ("o" * 150)).symlink_to("../" * 40 + "etc")
    with pytest.raises(TrainctlError) as outside:
        pack(folder)
    lines.append(outside.value.message)
    (folder / ("o" * 150)).unlink()
    with pytest.raises(TrainctlError) as missing:
        pack(folder / "nowhere")
    lines.append(missing.value.message)
    with pytest.raises(TrainctlError) as too_big:
        pack(folder, limit=1)
    lines.append(too_big.value.message)
    packed = pack(folder)
    for command in (["s" * 150 + ".py"], ["python" + "s" * 150]):
        with pytest.raises(TrainctlError) as script:
            check_script(packed, command)
        lines.append(script.value.message)
    image_script = "/opt/" + "s" * 150 + ".py"
    with pytest.raises(TrainctlError) as own_script:
        check_definition_script(packed, [image_script], definition(LAUNCHER_IN_IMAGE, image_script))
    lines.append(own_script.value.message)
    for line in lines:
        assert len(line) <= 200, line
        assert "…" in line and "/code" in line, line  # the folder's end names it
    assert re.search(r"link …l+ -> …t+ is absolute: add it to \.gitignore", lines[0])
    assert "l" * 20 + "…" not in lines[0]  # the path's end, not a cut word
    assert lines[4].endswith("(paths are relative to the workdir; .gitignore may leave it out)")
    assert lines[5].endswith("(train.py --lr 0.1))")
    assert "s.py is the job definition's own script: run one of workdir …" in lines[6]


def test_a_node_unpacks_what_was_packed_with_its_modes_and_links(tmp_path: Path) -> None:
    folder = tree(tmp_path / "code", {"src/train.py": "pass\n", "run.sh": "#!/bin/sh\n"})
    (folder / "run.sh").chmod(0o755)
    (folder / "train.py").symlink_to("src/train.py")
    packed = pack(folder)
    into = tmp_path / "node"
    tree(into, {"stale.py": "from an earlier attempt\n", workdir_fetch.MARKER: ""})
    import gzip

    assert workdir_fetch.unpack(gzip.decompress(packed.archive), str(into)) == 3
    assert sorted(str(p.relative_to(into)) for p in into.rglob("*") if not p.is_dir()) == [
        workdir_fetch.MARKER, "run.sh", "src/train.py", "train.py",
    ]  # fmt: skip
    assert os.access(into / "run.sh", os.X_OK) and not os.access(into / "src" / "train.py", os.X_OK)
    assert (into / "train.py").is_symlink() and (into / "train.py").read_text() == "pass\n"


@pytest.mark.parametrize(
    ("name", "link", "words"),
    [("../escape.py", "", "outside the workdir"), ("ok", "../../etc/passwd", "points outside the workdir")],
)
def test_a_node_refuses_an_archive_entry_that_leaves_the_workdir(
    tmp_path: Path, name: str, link: str, words: str
) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(name)
        if link:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
        else:
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(workdir_fetch.Refused, match=words):
        workdir_fetch.unpack(raw.getvalue(), str(tmp_path / "node"))
    assert not (tmp_path / "escape.py").exists()


def archive(*members: tuple[str, str]) -> bytes:
    """A tar of links (name, target) and, where the target is empty, four-byte files."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, link in members:
            info = tarfile.TarInfo(name)
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = 4
                tar.addfile(info, io.BytesIO(b"evil"))
    return raw.getvalue()


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ((("l", "."), ("x", "l/.."), ("x/evil", "t")), "archive entry 'x/evil' lies under a link"),
        ((("l", "."), ("x", "l/..")), "archive link x -> l/.. leads outside the workdir through another link"),
        # The link made first passes through one made after it.
        ((("x", "l/.."), ("l", ".")), "archive link x -> l/.. leads outside the workdir through another link"),
        ((("l", "."), ("x", "l/.."), ("x/f.py", "")), "archive entry 'x/f.py' lies under a link"),
    ],
)
def test_a_node_refuses_a_chain_of_links_that_leaves_the_workdir(
    tmp_path: Path, members: tuple[tuple[str, str], ...], words: str
) -> None:
    into = tmp_path / "work" / "node"
    with pytest.raises(workdir_fetch.Refused, match=re.escape(words)):
        workdir_fetch.unpack(archive(*members), str(into))
    outside = [p for p in (tmp_path / "work").iterdir() if p.name != "node"]
    assert outside == [] and not any(p.is_symlink() for p in into.rglob("*"))


def test_a_node_empties_only_a_workdir_it_made(tmp_path: Path) -> None:
    image = tree(tmp_path / "workspace", {"isaaclab/train.py": "the image's\n"})
    with pytest.raises(workdir_fetch.Refused, match="has files this script did not unpack: name a new or empty"):
        workdir_fetch.unpack(archive(("train.py", "")), str(image))
    assert (image / "isaaclab" / "train.py").read_text() == "the image's\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert workdir_fetch.unpack(archive(("train.py", "")), str(empty)) == 1
    (empty / "stale.py").write_text("an earlier attempt's\n")
    tree(empty, {"old/net.py": "an earlier attempt's\n"})
    (empty / "outside").symlink_to(image)  # emptying removes the link, never what it points to
    assert workdir_fetch.unpack(archive(("run.py", "")), str(empty)) == 1  # made by the fetch: emptied
    assert sorted(p.name for p in empty.iterdir()) == [workdir_fetch.MARKER, "run.py"]
    assert (image / "isaaclab" / "train.py").read_text() == "the image's\n"
    (tmp_path / "file").write_text("")
    with pytest.raises(workdir_fetch.Refused, match="is not a folder"):
        workdir_fetch.unpack(archive(("train.py", "")), str(tmp_path / "file"))


class FlakyS3:
    """get_object answering `errors` in turn, then the archive."""

    def __init__(self, errors: list[Exception], body: bytes) -> None:
        self.errors, self.body, self.calls = errors, body, 0

    def get_object(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {"Body": io.BytesIO(self.body)}


def client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


def fetch_exit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3: FlakyS3, uri: str) -> int:
    monkeypatch.setattr(boto3, "client", lambda *_a, **_k: s3)
    monkeypatch.setattr(workdir_fetch.time, "sleep", lambda _s: None)
    monkeypatch.setenv("WORKDIR_URI", uri)
    monkeypatch.delenv("WORKDIR_SETUP", raising=False)
    return int(workdir_fetch.main(["--dir", str(tmp_path / "node")]))


def test_a_transient_s3_error_is_tried_again_then_retried_by_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from botocore.exceptions import EndpointConnectionError

    from training_constructs.jobs.multi_node_job import PREFLIGHT_EXIT_CODE, RETRY_RULES

    packed = pack(tree(tmp_path / "code", {"train.py": "pass\n"}))
    uri = packed.uri("datasets")
    passing = FlakyS3(
        [client_error("SlowDown", 503), EndpointConnectionError(endpoint_url="https://s3")], packed.archive
    )
    assert fetch_exit(monkeypatch, tmp_path, passing, uri) == 0 and passing.calls == 3
    assert (tmp_path / "node" / "train.py").read_text() == "pass\n"
    failing = FlakyS3([client_error("InternalError", 500)] * 10, packed.archive)
    code = fetch_exit(monkeypatch, tmp_path, failing, uri)
    assert failing.calls == len(workdir_fetch.RETRY_DELAYS) + 1
    # The code the job definitions retry, as for a node fault.
    assert code == PREFLIGHT_EXIT_CODE and any(r.on_exit_code == str(code) and r.action == "RETRY" for r in RETRY_RULES)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"workdir_fetch.py: workdir: cannot read {packed.location('datasets')} after 4 tries: ")


@pytest.mark.parametrize(("code", "status"), [("NoSuchKey", 404), ("AccessDenied", 403)])
def test_the_jobs_own_s3_problem_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, code: str, status: int
) -> None:
    s3 = FlakyS3([client_error(code, status)], b"")
    assert fetch_exit(monkeypatch, tmp_path, s3, f"s3://datasets/workdirs/{'0' * 64}.tar.gz") == 2 and s3.calls == 1


# ----------------------------------------------------------------------------------------------- submitting
def workdir_versions(world: World) -> list[str]:
    listed = world.client("s3").list_object_versions(Bucket=DATASET_BUCKET, Prefix=PREFIX)
    return sorted(v["Key"] for v in listed.get("Versions", []))


def request_environment(request: dict[str, Any]) -> dict[str, str]:
    (override,) = request["nodeOverrides"]["nodePropertyOverrides"]
    return {e["name"]: e["value"] for e in override["containerOverrides"]["environment"]}


def registered_environments(world: World) -> set[str]:
    """NAME=value of every environment entry of every job definition revision registered."""
    listed = world.client("batch").describe_job_definitions(status="ACTIVE")["jobDefinitions"]
    return {
        f"{e['name']}={e['value']}"
        for d in listed
        for r in d.get("nodeProperties", {}).get("nodeRangeProperties", [])
        for e in r.get("container", {}).get("environment", [])
    }


def test_a_workdir_is_uploaded_once_per_content_hash(world: World, trainctl: Any, tmp_path: Path) -> None:
    code = tree(tmp_path / "code", {**CODE, "train.py": f"print('{tmp_path.name}')\n"})
    task = tmp_path / "task.yaml"
    task.write_text("fleet: gpu\nworkdir: code\nsetup: pip install -r requirements.txt\ncommand: ./train.py --lr 1\n")
    packed = pack(code)
    key = packed.key
    before = workdir_versions(world)

    # The exact request (moto's Batch keeps no node overrides to read back): where every node fetches it from.
    dry = trainctl("run", str(task), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert request_environment(json.loads(dry.stdout)) == {
        URI_ENV: f"s3://{DATASET_BUCKET}/{key}?sha256={packed.checksum}",  # the version is known once stored
        SETUP_ENV: "pip install -r requirements.txt",
    }
    assert "nothing uploaded" in dry.stderr and workdir_versions(world) == before

    first = trainctl("--json", "run", str(task))
    assert first.exit_code == 0, first.output
    assert f"uploaded to s3://{DATASET_BUCKET}/{key}, pinned to version " in first.stderr
    assert workdir_versions(world) == sorted([*before, key])
    # The revision the job runs on, registered after the upload, names the version stored.
    (version,) = [
        v["VersionId"] for v in world.client("s3").list_object_versions(Bucket=DATASET_BUCKET, Prefix=key)["Versions"]
    ]
    assert f"{URI_ENV}={packed.uri(DATASET_BUCKET, version)}" in registered_environments(world)

    # The same folder through submit, from another working directory: nothing is uploaded again.
    second = trainctl("--json", "submit", "gpu", "--workdir", str(code), "--command", "train.py")
    assert second.exit_code == 0, second.output
    assert f"already stored as s3://{DATASET_BUCKET}/{key}: nothing uploaded, pinned to version " in second.stderr
    assert workdir_versions(world) == sorted([*before, key])  # one version: no second PUT


@pytest.mark.parametrize(
    ("refusals", "operation"),
    [
        ([("put_object", "AccessDenied")], "PutObject"),
        ([("put_object", "PreconditionFailed"), ("head_object", "403")], "HeadObject"),
    ],
)
def test_credentials_that_cannot_store_or_read_the_workdir_are_told_what_they_need(
    tmp_path: Path, refusals: list[tuple[str, str]], operation: str
) -> None:
    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")  # noqa: S106
    packed = pack(tree(tmp_path / "code", {"train.py": "pass\n"}))
    with Stubber(s3) as stub:
        for method, code in refusals:
            stub.add_client_error(method, service_error_code=code, http_status_code=412 if code[0] == "P" else 403)
        with pytest.raises(TrainctlError) as refused:
            upload(s3, "datasets", packed)
    assert refused.value.message == (
        f"S3 refused {operation} on the workdir (403): your credentials need s3:PutObject and "
        "s3:GetObject on datasets/workdirs/*"
    )
    assert len(refused.value.message) <= 200


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("missing.py", "command: missing.py is not in workdir"),
        ("run.log", ".gitignore may leave it out"),
        ("python train.py", "start the command with it"),
    ],
)
def test_a_script_missing_from_the_workdir_is_refused_before_anything_is_submitted(
    world: World, trainctl: Any, tmp_path: Path, command: str, words: str
) -> None:
    tree(tmp_path / "code", CODE)
    task = tmp_path / "task.yaml"
    task.write_text(f"fleet: gpu\nname: refused-{len(command)}\nworkdir: code\ncommand: {command}\n")
    uploads_before = workdir_versions(world)
    line = one_error_line(trainctl("run", str(task)), ExitCode.USAGE)
    assert words in line
    assert workdir_versions(world) == uploads_before
    named = [{"name": "JOB_NAME", "values": [f"refused-{len(command)}"]}]
    assert world.client("batch").list_jobs(jobQueue=world.queues["gpu"], filters=named)["jobSummaryList"] == []


def definition(*command: str, environment: dict[str, str] | None = None) -> dict[str, Any]:
    """A described job definition whose first node range runs `command`."""
    container = {
        "command": list(command),
        "environment": [{"name": k, "value": v} for k, v in (environment or {}).items()],
    }
    return {"nodeProperties": {"nodeRangeProperties": [{"container": container}]}}


def test_the_job_definitions_own_script_is_read_from_each_form_the_workloads_write() -> None:
    gpu, isaac, trainium = (training_workload(CATALOG[t]) for t in ("p5.48xlarge", "g6.12xlarge", "trn1.32xlarge"))
    assert definition_script(definition(*gpu.command, environment=gpu.environment)) == ALLREDUCE_BENCH
    assert definition_script(definition(*isaac.command, environment=isaac.environment)) == ISAACLAB_TRAIN_SCRIPT
    assert definition_script(definition(*trainium.command)) == ALLREDUCE_BENCH
    assert definition_script(definition("/bin/bash", "-c", "echo no launcher")) is None
    assert definition_script(definition(LAUNCHER_IN_IMAGE, "--help")) is None


def test_a_workdir_command_that_is_the_job_definitions_own_script_is_refused(tmp_path: Path) -> None:
    packed = pack(tree(tmp_path / "code", {"train.py": "pass\n", ISAACLAB_TRAIN_SCRIPT: "pass\n"}))
    by_variable = definition(
        "/bin/bash",
        "-c",
        f'exec {LAUNCHER_IN_IMAGE} "$TRAIN_SCRIPT" $TRAIN_ARGS',
        environment={"TRAIN_SCRIPT": ALLREDUCE_BENCH},
    )
    for own in (definition(LAUNCHER_IN_IMAGE, ALLREDUCE_BENCH, "--per-node"), by_variable):
        with pytest.raises(TrainctlError) as refused:
            check_definition_script(packed, [ALLREDUCE_BENCH, "--size-mb", "64"], own)
        message = refused.value.message
        assert message.startswith(f"command: {ALLREDUCE_BENCH} is the job definition's own script: run one of workdir ")
        assert message.endswith("/code (train.py --lr 0.1) or drop the workdir"), message
        # The folder's own script runs from it.
        check_definition_script(packed, ["train.py", "--lr", "0.1"], own)
    # Isaac Lab's script, relative, copied into the folder: the folder's now, so it is taken.
    isaac = definition("/bin/bash", "-c", f"cd x && exec {LAUNCHER_IN_IMAGE} {ISAACLAB_TRAIN_SCRIPT} --headless")
    check_definition_script(packed, [ISAACLAB_TRAIN_SCRIPT, "--headless"], isaac)


def test_a_workdir_without_the_launcher_is_refused(trainctl: Any, tmp_path: Path) -> None:
    tree(tmp_path / "code", CODE)
    task = tmp_path / "task.yaml"
    task.write_text("fleet: gpu\nworkdir: code\nlauncher: false\ncommand: sh run.sh\n")
    line = one_error_line(trainctl("run", str(task)), ExitCode.USAGE)
    assert "field workdir: needs the launcher" in line and "launcher: false" in line
    missing = one_error_line(
        trainctl("submit", "gpu", "--workdir", str(tmp_path / "nowhere"), "--command", "train.py"), ExitCode.USAGE
    )
    assert missing.endswith("/nowhere: not a folder") and len(missing) <= 200


# ----------------------------------------------------------------------------------------------- the launcher
# A stand-in for torchrun: runs the script it is given from the launcher's working directory.
TORCHRUN = """#!{python}
import subprocess, sys
args = sys.argv[1:]
script = next(a for a in args if a.endswith(".py"))
sys.exit(subprocess.call([sys.executable, script, *args[args.index(script) + 1:]]))
"""
# The job's script: proves it runs from the unpacked folder, after the setup.
TRAIN = """import os, sys
assert os.path.exists("setup-done"), "the setup has not run"
print("TRAINED in", os.getcwd(), "with", open("model/net.py").read().strip(), *sys.argv[1:])
"""


@pytest.fixture(scope="module")
def s3_endpoint() -> Any:
    from tests.local_aws import moto_server

    with moto_server() as endpoint:
        yield endpoint


def launch(s3_endpoint: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    torchrun = tmp_path / "torchrun.py"
    torchrun.write_text(TORCHRUN.format(python=sys.executable))
    torchrun.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MASTER_", "NPROC_", "CHECKPOINT_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        PYTHON=str(torchrun),
        CHECKPOINT_PYTHON=sys.executable,
        PREFLIGHT_PYTHON=sys.executable,
        NPROC_PER_NODE="1",
        WORKDIR_DIR=str(tmp_path / "node"),
        AWS_ENDPOINT_URL=s3_endpoint,
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",  # noqa: S106 - moto accepts any key
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    env.update(extra)
    # Started from elsewhere: only the unpacked folder has train.py.
    return subprocess.run(
        [str(LAUNCHER), "train.py", "--lr", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


def uploaded(s3_endpoint: str, folder: Path) -> str:
    s3 = boto3.client(
        "s3", endpoint_url=s3_endpoint, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",  # noqa: S106 - moto accepts any key
    )  # fmt: skip
    s3.create_bucket(Bucket="datasets")
    packed = pack(folder)
    s3.put_object(Bucket="datasets", Key=packed.key, Body=packed.archive)
    return packed.uri("datasets")


def test_the_launcher_fetches_unpacks_and_sets_up_the_workdir_before_the_command(
    s3_endpoint: str, tmp_path: Path
) -> None:
    uri = uploaded(s3_endpoint, tree(tmp_path / "code", {"train.py": TRAIN, "model/net.py": "NET = 1\n"}))
    result = launch(s3_endpoint, tmp_path, WORKDIR_URI=uri, WORKDIR_SETUP="touch setup-done && echo SETUP in $PWD")
    assert result.returncode == 0, result.stderr
    node = tmp_path / "node"
    assert result.stdout.splitlines() == [f"SETUP in {node}", f"TRAINED in {node} with NET = 1 --lr 1"]
    assert f"2 files from {uri} in {node}" in result.stderr


def test_a_setup_without_a_workdir_runs_where_the_command_runs(s3_endpoint: str, tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": TRAIN, "model/net.py": "NET = 2\n"})
    result = launch(s3_endpoint, tmp_path, WORKDIR_SETUP="touch setup-done")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"TRAINED in {tmp_path} with NET = 2 --lr 1"]
    assert not (tmp_path / "node").exists()


def test_a_failed_setup_stops_the_node_before_the_command(s3_endpoint: str, tmp_path: Path) -> None:
    uri = uploaded(s3_endpoint, tree(tmp_path / "code", {"train.py": TRAIN, "model/net.py": "NET = 1\n"}))
    result = launch(s3_endpoint, tmp_path, WORKDIR_URI=uri, WORKDIR_SETUP="exit 3")
    assert result.returncode == 2 and "TRAINED" not in result.stdout  # 2: the job's problem, not retried
    assert "workdir_fetch.py: setup exited 3: exit 3" in result.stderr


def test_a_workdir_that_cannot_be_fetched_is_one_line_and_no_command(s3_endpoint: str, tmp_path: Path) -> None:
    uri = uploaded(s3_endpoint, tree(tmp_path / "code", {"train.py": TRAIN}))
    gone = re.sub(r"[0-9a-f]{64}", "0" * 64, uri)  # named as trainctl names one, never uploaded
    result = launch(s3_endpoint, tmp_path, WORKDIR_URI=gone)
    assert result.returncode == 2 and "TRAINED" not in result.stdout
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("workdir_fetch.py")]
    assert line.startswith(f"workdir_fetch.py: workdir: cannot read {gone.partition('?')[0]}: ")


# ----------------------------------------------------------------------------------------------- rehearsal
def test_a_rehearsal_runs_the_same_workdir_on_every_node(tmp_path: Path) -> None:
    """The real launcher and torchrun (torch's CPU wheel), two nodes, the workdir from the rehearsal's local S3."""
    # The checkout has a script of that name too (the reference trainer): the workdir's must be the one run.
    script = "examples/rehearsal/train.py"
    assert (ROOT / script).is_file()
    tree(tmp_path / "code", {script: TRAIN, "model/net.py": "NET = 1\n"})
    task = tmp_path / "task.yaml"
    task.write_text(f"fleet: gpu\nworkdir: code\nsetup: touch setup-done\ncommand: {script} --lr 1\n")
    kept = tmp_path / "kept"
    options = Options(nodes=2, deadline_seconds=50, definition=rehearsal_definition(nodes=2), keep=kept)

    result = rehearse(load_task(task), assembly=tmp_path / "no-cdk-out", options=options)

    assert result["as_expected"], result
    for node in (0, 1):
        (log,) = kept.glob(f"*/attempt-1/node-{node}.log")
        unpacked = log.parent / f"node-{node}" / "workdir"
        assert f"TRAINED in {unpacked} with NET = 1 --lr 1" in log.read_text()
