"""Registry stack: images staged from container/ without Docker, or replaced by URIs; the team repository."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk.assertions import Annotations, Match

from config.settings import fleet_construct_id
from tests.harness import ROOT, VARIANTS, fleet_name, resources, synth, synth_with

STACK = "TrainingRegistry"
URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/isaaclab-batch:latest"


def docker_assets(result, stack=STACK):
    manifest = Path(result.assembly.directory) / f"{stack}.assets.json"
    return json.loads(manifest.read_text()).get("dockerImages", {})


def test_both_images_are_staged_from_container_without_docker():
    result = synth("default")
    assets = docker_assets(result)
    files = sorted(a["source"]["dockerFile"] for a in assets.values())
    # The default GPU fleet (g6.12xlarge, L4 with RT cores) runs Isaac Lab.
    assert files == ["isaaclab/Dockerfile", "trainium/Dockerfile"]
    for asset in assets.values():
        staged = Path(result.assembly.directory) / asset["source"]["directory"]
        for name in (
            "distributed_run.sh",
            "launcher/__main__.py",
            "launcher/preflight.py",
            "benchmark/allreduce_bench.py",
        ):
            assert (staged / name).exists(), name
        assert not list(staged.rglob("__pycache__"))
        assert asset["source"]["platform"] == "linux/amd64"


def test_image_uris_replace_the_assets_and_reach_the_job_definitions():
    result = synth("existing-images")
    assert docker_assets(result) == {}
    assert not result.app.node.find_child(STACK).images
    images = {
        k: r["Properties"]["NodeProperties"]["NodeRangeProperties"][0]["Container"]["Image"]
        for k, r in resources(result.templates["TrainingJobs"], "AWS::Batch::JobDefinition").items()
    }
    variant = VARIANTS["existing-images"]
    # A Docker Hub short name synthesizes and reaches Batch as written (issue 32).
    assert variant["gpuImage"] == "ubuntu:22.04" and "ubuntu:22.04" in images.values()
    for logical_id, image in images.items():
        assert image == (variant["gpuImage"] if logical_id.startswith("Gpu") else variant["trainiumImage"])


def test_one_image_per_image_name_that_a_fleet_needs():
    # GPU only: no Neuron image is staged or built.
    assert [a["source"]["dockerFile"] for a in docker_assets(synth("gpu-only")).values()] == ["isaaclab/Dockerfile"]
    # Three fleets: g6e (Isaac Sim), p5e (not) and trn2: one image each.
    files = sorted(a["source"]["dockerFile"] for a in docker_assets(synth("three-fleets")).values())
    assert files == ["isaaclab/Dockerfile", "pytorch/Dockerfile", "trainium/Dockerfile"]
    # Every catalog type: still one image per name.
    files = sorted(a["source"]["dockerFile"] for a in docker_assets(synth("all-types")).values())
    assert files == ["isaaclab/Dockerfile", "pytorch/Dockerfile", "trainium/Dockerfile"]


def test_a_fleet_with_its_own_image_needs_no_build():
    result = synth_with({"trainiumInstanceType": "none", "gpuImage": URI})
    assert docker_assets(result) == {}


def test_team_repository_is_scanned_immutable_and_retained():
    template = synth("default").templates[STACK]
    (repo,) = resources(template, "AWS::ECR::Repository").values()
    props = repo["Properties"]
    assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert props["ImageTagMutability"] == "IMMUTABLE"
    assert repo["DeletionPolicy"] == "Retain" and repo["UpdateReplacePolicy"] == "Retain"
    rules = json.loads(props["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert {r["selection"]["tagStatus"] for r in rules} == {"untagged", "any"}


def test_registry_stack_has_termination_protection():
    stack = synth("default").app.node.find_child(STACK)
    assert stack.termination_protection is True


DOCKERFILES = sorted((ROOT / "container").glob("*/Dockerfile"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_dockerfiles_pass_hadolint(dockerfile):
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint is installed by `make test` (requirements-test.txt)")
    result = subprocess.run([str(hadolint), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# What every image copies into /opt/training/: the shim the job definitions run, the launcher's folder as
# it is (the shim runs it as a folder), and the benchmark's files beside the shim (the job definitions run
# /opt/training/allreduce_bench.py).
IMAGE_COPIES = [
    "COPY distributed_run.sh /opt/training/",
    "COPY launcher/ /opt/training/launcher/",
    "COPY benchmark/ /opt/training/",
]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_dockerfiles_pin_their_base_and_copy_the_launcher(dockerfile):
    text = dockerfile.read_text()
    base_arg = next(line for line in text.splitlines() if line.startswith("ARG ") and "IMAGE=" in line)
    assert ":" in base_arg.split("=", 1)[1] and not base_arg.endswith(":latest")
    copies = [line for line in text.splitlines() if line.startswith("COPY") and "/opt/training/" in line]
    assert copies == IMAGE_COPIES


def test_container_holds_the_shim_alone_beside_the_image_folders():
    # Nothing flat that belongs to a phase: the launcher's modules are in launcher/, the benchmark's in
    # benchmark/. The benchmark's files land beside the shim in the image, so no name may repeat.
    container = ROOT / "container"
    assert {p.name for p in container.iterdir() if p.suffix in (".py", ".sh")} == {"distributed_run.sh"}
    assert (container / "launcher" / "__main__.py").is_file()
    benchmark = {p.name for p in (container / "benchmark").iterdir() if p.suffix == ".py"}
    assert "allreduce_bench.py" in benchmark and "distributed_run.sh" not in benchmark
    assert not benchmark & {p.name for p in (container / "launcher").iterdir()}
    # .dockerignore lets through only what it names: a copied folder it leaves out fails the build.
    allowed = {line[1:] for line in (container / ".dockerignore").read_text().splitlines() if line[:1] == "!"}
    assert {"distributed_run.sh", "launcher/", "benchmark/"} <= allowed
    # What tests leave beside the modules stays out of the build context and the asset's hash.
    assert {"**/__pycache__", "**/*.pyc"} <= set((container / ".dockerignore").read_text().splitlines())


def dockerfile_lines(name):
    return [line.strip() for line in (ROOT / "container" / name / "Dockerfile").read_text().splitlines()]


@pytest.mark.parametrize("image", ["isaaclab", "pytorch", "trainium"])
def test_image_resets_the_base_entrypoint_as_its_last_word(image):
    # Isaac Sim's starts the streaming app; the Neuron DLC's runs the command under a PID-1 bash
    # that never passes on SIGTERM. Batch sets the command only, so every image resets it.
    lines = [line for line in dockerfile_lines(image) if line.startswith(("ENTRYPOINT", "FROM"))]
    # After the FROM, the only ENTRYPOINT is the reset, so Batch's command runs as given.
    assert lines[-1] == "ENTRYPOINT []" and lines.count("ENTRYPOINT []") == 1


@pytest.mark.parametrize("image", ["isaaclab", "pytorch"])
def test_nvidia_images_put_every_plugin_layout_on_the_loader_path(image):
    text = (ROOT / "container" / image / "Dockerfile").read_text()
    env = next(line for line in text.splitlines() if line.startswith("ENV LD_LIBRARY_PATH="))
    for layout in (
        "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:",
        "/opt/amazon/ofi-nccl/lib64:",
        "/opt/amazon/ofi-nccl/lib:",
    ):
        assert layout in env
    assert 'RUN bash /tmp/install_efa.sh "${EFA_INSTALLER_VERSION}"' in text


def run_install_efa(tmp_path, *, plugin: bool, cudart: str | None):
    """install_efa.sh's checks after the installer, with apt, curl, the installer and ldconfig
    replaced by stand-ins in a scratch root (the script's paths are absolute: run through sed)."""
    root = tmp_path / "root"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("apt-get", "curl", "tar"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    # ldconfig -p lists what the scratch root's loader config names, as the real one would.
    (bin_dir / "ldconfig").write_text(
        '#!/bin/bash\n[[ "$1" == -p ]] || exit 0\n'
        f'for d in $(cat {root}/etc/ld.so.conf.d/*.conf 2>/dev/null); do for f in "$d"/lib*.so*; do '
        '[[ -e "$f" ]] && printf \'\\t%s (libc6,x86-64) => %s\\n\' "$(basename "$f")" "$f"; done; done\n'
    )
    installer = root / "tmp" / "aws-efa-installer"
    installer.mkdir(parents=True)
    (installer / "efa_installer.sh").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/installer-args\n')
    (root / "etc" / "ld.so.conf.d").mkdir(parents=True)
    if plugin:
        (root / "opt/amazon/ofi-nccl/lib/x86_64-linux-gnu").mkdir(parents=True)
        (root / "opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so").write_text("")
    if cudart:
        (root / "usr/lib/cuda").mkdir(parents=True)
        (root / "usr/lib/cuda" / cudart).write_text("")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (installer / "efa_installer.sh").chmod(0o755)
    script = (ROOT / "container" / "common" / "install_efa.sh").read_text()
    for absolute in (" /opt/", "/etc/", "/tmp/"):  # noqa: S108 - paths of the script, moved under tmp_path
        script = script.replace(absolute, absolute.replace("/", "@ROOT@/", 1))
    script = script.replace("find / ", "find @ROOT@ ").replace("-not -path '/proc/*'", "").replace("@ROOT@", str(root))
    result = subprocess.run(
        ["bash", "-c", script, "install_efa.sh", "1.51.0"],
        capture_output=True, text=True, timeout=30, env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
    )  # fmt: skip
    args = (tmp_path / "installer-args").read_text().split() if (tmp_path / "installer-args").exists() else []
    return result, args, root


def test_install_efa_fails_the_build_without_the_plugin_nccl_loads(tmp_path):
    result, args, _ = run_install_efa(tmp_path, plugin=False, cudart="libcudart.so.13")
    assert result.returncode == 1
    assert "libnccl-net.so not found" in result.stderr and "TCP" in result.stderr
    # The NGC detection of installer 1.48+ would leave the plugin out: the standard install is forced.
    assert {"--skip-kmod", "--skip-limit-conf", "--no-verify", "--disable-ngc"} <= set(args)


def test_install_efa_links_the_unversioned_cuda_runtime_the_plugin_loads(tmp_path):
    result, _, root = run_install_efa(tmp_path, plugin=True, cudart="libcudart.so.13")
    assert result.returncode == 0, result.stderr
    assert (root / "usr/lib/cuda/libcudart.so").resolve().name == "libcudart.so.13"
    assert (root / "etc/ld.so.conf.d/001-cudart.conf").read_text().strip().endswith("usr/lib/cuda")


def test_install_efa_fails_the_build_without_a_cuda_runtime(tmp_path):
    result, _, _ = run_install_efa(tmp_path, plugin=True, cudart=None)
    assert result.returncode == 1 and "no libcudart.so" in result.stderr


def test_fleets_run_the_image_their_gpus_can_use():
    # All-types: a fleet of every catalog type, none with an image of its own.
    result = synth("all-types")
    registry = result.app.node.find_child(STACK)
    hashes = {name: image.asset.asset_hash for name, image in registry.images.items()}
    assert len(set(hashes.values())) == 3
    definitions = resources(result.templates["TrainingJobs"], "AWS::Batch::JobDefinition")
    for instance_type, image in (
        ("p5.48xlarge", "pytorch"),
        ("p6-b200.48xlarge", "pytorch"),
        ("p6-b300.48xlarge", "pytorch"),
        ("g6.12xlarge", "isaaclab"),
        ("g7e.48xlarge", "isaaclab"),
        ("trn1.32xlarge", "trainium"),
    ):
        prefix = fleet_construct_id(fleet_name(instance_type))
        images = [
            json.dumps(d["Properties"]["NodeProperties"]["NodeRangeProperties"][0]["Container"]["Image"])
            for logical_id, d in definitions.items()
            if logical_id.startswith((f"{prefix}TrainingJob", f"{prefix}BenchmarkJob"))
        ]
        # Both definitions of the fleet (training and the fleet check) run that one image.
        assert len(images) == 2 and all(hashes[image] in i for i in images), (instance_type, images)


def test_only_fleets_the_pytorch_image_has_no_kernels_for_are_warned():
    stack = synth("all-types").app.node.find_child(STACK)
    warnings = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("no kernels for Volta"))
    # V100 (p3dn): CUDA 13 has no sm_70. Blackwell fleets run the PyTorch or Isaac Lab image unwarned.
    assert {str(w.entry.data).split()[1] for w in warnings} == {fleet_name("p3dn.24xlarge")}
    assert (
        Annotations.from_stack(synth("default").app.node.find_child(STACK)).find_warning("*", Match.any_value()) == []
    )
