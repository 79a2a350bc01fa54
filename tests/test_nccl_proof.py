"""container/launcher/nccl_proof.py on NCCL's INFO lines (tests/fixtures/nccl: one real H100 capture, the others
modelled on NCCL's and aws-ofi-nccl's printed format, its README says on what), and the preflight's use of it
with a stand-in interpreter that prints those lines, in-process."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# Not tests.harness: it imports the CDK, seconds this file does not need.
ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "container" / "launcher"
FIXTURES = ROOT / "tests" / "fixtures" / "nccl"
NO_INFO = ROOT / "tests" / "fixtures" / "nvidia-h100" / "all_reduce_perf-1gpu.txt"


_spec = importlib.util.spec_from_file_location("preflight", LAUNCHER / "preflight.py")
assert _spec and _spec.loader
preflight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(preflight)
# The module the preflight itself runs.
proof = preflight._nccl_proof()

PLUGIN = "NCCL on the aws-ofi-nccl plugin (Using network Libfabric)"


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def judge(text_lines: list[str], efa: int):  # type: ignore[no-untyped-def]
    return proof.judge(proof.read_init(text_lines), efa)


def test_the_healthy_p5_start_passes_and_says_what_it_saw():
    init = proof.read_init(lines("p5-efa-healthy.txt"))
    assert proof.judge(init, 32) is None
    assert proof.summary(init) == "'Using network AWS Libfabric', libfabric's efa provider on 32 NICs"


@pytest.mark.parametrize(
    ("name", "efa", "kind", "line"),
    [
        (
            "h100-plugin-missing.txt",
            32,
            "shared",
            f"{PLUGIN}, found 'NET/Plugin: Could not find: libnccl-net.so' and no network",
        ),
        (
            "p4d-one-of-four-nics.txt",
            4,
            "node",
            "NCCL on all 4 EFA devices (EFA_DEVICES), found 1: "
            "'NET/OFI Selected provider is efa, fabric is efa (found 1 nics)'",
        ),
        (
            "socket-fallback.txt",
            1,
            "shared",
            f"{PLUGIN}, found 'Using network Socket' (a fallback to TCP sockets) after "
            "'Failed to initialize NET plugin Libfabric'",
        ),
    ],
)
def test_each_failure_fails_in_one_line_naming_what_was_seen_and_expected(name, efa, kind, line):
    verdict = judge(lines(name), efa)
    assert verdict is not None
    assert (verdict.kind, verdict.line()) == (kind, line)
    assert "\n" not in verdict.line()


def test_the_count_is_judged_against_the_types_efa_count():
    # The same one-NIC start is sound on a type with one EFA (p5.4xlarge), and the p5 start short on a bigger count.
    assert judge(lines("p4d-one-of-four-nics.txt"), 1) is None
    verdict = judge(lines("p5-efa-healthy.txt"), 33)
    assert verdict is not None and verdict.kind == "node" and "found 32:" in verdict.line()


def test_a_log_without_nccl_info_lines_decides_nothing():
    init = proof.read_init(NO_INFO.read_text().splitlines())
    assert proof.judge(init, 32) is None
    assert proof.summary(init).startswith("no NCCL INFO lines")


def test_lines_that_stop_before_the_network_choice_decide_nothing():
    healthy = lines("p5-efa-healthy.txt")
    # Killed before NCCL chose a network: the plugin's NIC count alone, short or not, is not acted on.
    before_choice = [line for line in healthy if "Using network" not in line and "NET plugin" not in line]
    short = [line.replace("found 32 nics", "found 8 nics") for line in before_choice]
    assert judge(short, 32) is None
    # Lines that never name the network or the plugin decide nothing either.
    assert judge([line for line in healthy if "NCCL version" in line], 32) is None
    # With the choice made but no NET/OFI line to count, the count is not judged.
    assert judge([line for line in healthy if "NET/OFI Selected" not in line], 32) is None


def test_the_plugins_default_name_and_another_provider():
    default_name = [line.replace("AWS Libfabric", "Libfabric") for line in lines("p5-efa-healthy.txt")]
    assert judge(default_name, 32) is None
    tcp = [line.replace("provider is efa, fabric is efa-direct", "provider is tcp, fabric is 10.0.0.0/16")
           for line in lines("p5-efa-healthy.txt")]  # fmt: skip
    verdict = judge(tcp, 32)
    assert verdict is not None and verdict.kind == "shared"
    assert verdict.line().startswith(
        "aws-ofi-nccl on libfabric's efa provider, found 'NET/OFI Selected provider is tcp"
    )


def test_a_trainers_prefixed_lines_count_and_the_fewest_nics_of_any_rank_decide():
    ranks = [f"[rank{r}]: {line}" for r in range(2) for line in lines("p5-efa-healthy.txt")]
    ranks += [f"[rank2]: {line.replace('found 32 nics', 'found 31 nics')}" for line in lines("p5-efa-healthy.txt")]
    verdict = judge(ranks, 32)
    assert (
        verdict is not None
        and verdict.kind == "node"
        and verdict.line().startswith("NCCL on all 32 EFA devices (EFA_DEVICES), found 31:")
    )


def test_the_probe_environment_turns_nccls_init_lines_on_and_keeps_the_jobs_network_settings():
    env = proof.probe_environment(
        {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "nccl.%h.log", "NCCL_NET": "AWS Libfabric", "FI_EFA_X": "1"}
    )
    assert env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_NET": "AWS Libfabric", "FI_EFA_X": "1"}


def test_the_command_line_exits_as_the_preflight_would(capsys):
    assert proof.main(["--efa", "4", str(FIXTURES / "p4d-one-of-four-nics.txt")]) == 75
    assert proof.main(["--efa", "1", str(FIXTURES / "socket-fallback.txt")]) == 78
    assert proof.main(["--efa", "32", str(NO_INFO)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("nccl proof failed (node fault): expected NCCL on all 4 EFA devices")


# The preflight: a node with `efa` EFA devices and their provider, one GPU, and an interpreter that passes the
# CUDA probe and prints `log` for the NCCL probe.
@pytest.fixture
def node(tmp_path: Path):
    def make(log: str, efa: int, status: int = 0) -> dict[str, str]:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        (tmp_path / "fi.txt").write_text("provider: efa\n    fabric: efa\n")
        (bin_dir / "fi_info").write_text(f'#!/bin/sh\ncat "{tmp_path / "fi.txt"}"\n')
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
        python = bin_dir / "trainer-python"
        python.write_text(
            '#!/bin/sh\necho "$NCCL_DEBUG $NCCL_DEBUG_SUBSYS" > "$0.asked"\n'
            'case "$2" in *get_device_capability*) echo "sm_90 2.7.0 12.8";; '
            f'*init_process_group*) cat "{log}"; exit {status};; *) exit 3;; esac\n'
        )
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
        devices = tmp_path / "infiniband"
        devices.mkdir(exist_ok=True)
        for i in range(efa):
            (devices / f"uverbs{i}").touch()
        return {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "EFA_DEVICES": str(efa),
            "EFA_DEVICE_DIR": str(devices),
            "EXPECTED_GPUS": "1",
            "EXPECT_TORCH_CUDA": "1",
            "PYTHON": str(python),
            "NODE_STATE_DIR": str(tmp_path / "state"),
            "PROC_NET_ROUTE": str(tmp_path / "no-route"),
        }

    return make


@pytest.mark.parametrize(
    ("name", "efa", "status", "code", "says"),
    [
        ("p4d-one-of-four-nics.txt", 4, 0, 75, "expected NCCL on all 4 EFA devices (EFA_DEVICES), found 1: "),
        ("socket-fallback.txt", 4, 0, 78, f"expected {PLUGIN}, found 'Using network Socket'"),
        ("h100-plugin-missing.txt", 4, 1, 78, f"expected {PLUGIN}, found 'NET/Plugin: Could not find"),
    ],
)
def test_the_preflight_fails_the_node_in_one_line_with_the_faults_exit(node, capsys, name, efa, status, code, says):
    assert preflight.main(node(str(FIXTURES / name), efa, status)) == code
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("preflight failed on ") and says in line


def test_the_preflight_passes_a_sound_start_with_a_note_and_runs_the_probe_only_when_asked(node, capsys, tmp_path):
    env = node(str(FIXTURES / "p5-efa-healthy.txt"), 32)
    assert preflight.main(env) == 0
    (note,) = capsys.readouterr().err.strip().splitlines()
    assert note.startswith("preflight: NCCL on EFA: no fault seen (")
    assert note.endswith("'Using network AWS Libfabric', libfabric's efa provider on 32 NICs")
    assert (tmp_path / "bin" / "trainer-python.asked").read_text() == "INFO INIT,NET\n"
    # Evidence of nothing (an interpreter that prints no NCCL line) fails nothing.
    assert preflight.main(node(str(NO_INFO), 32, status=1)) == 0
    assert "no NCCL INFO lines" in capsys.readouterr().err
    # Not asked: switched off, no EFA, or no CUDA check (Neuron fleets, CPU jobs).
    short = node(str(FIXTURES / "p4d-one-of-four-nics.txt"), 4)
    for off in ({"NCCL_EFA_PROOF": "0"}, {"EFA_DEVICES": "0"}, {"EXPECT_TORCH_CUDA": "0"}):
        assert preflight.main({**short, **off}) == 0
    assert capsys.readouterr().err == ""
    assert preflight.main({**short, "NCCL_EFA_PROOF": "yes"}) == preflight.USAGE_EXIT


def test_older_nccls_plugin_wording_and_a_second_plugin_that_loaded():
    older = [
        "node:7:7 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        "node:7:7 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>",
        "node:7:7 [0] NCCL INFO Using network Socket",
    ]
    verdict = judge(older, 1)
    assert verdict is not None and verdict.kind == "shared"
    assert verdict.found.endswith(
        "after 'NET/Plugin : No plugin found (libnccl-net.so), using internal implementation'"
    )
    # One candidate of NCCL_NET_PLUGIN missing while another loaded, cut off before the network choice: nothing.
    partial = [
        "node:7:7 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net-other.so",
        "node:7:7 [0] NCCL INFO Successfully loaded external network plugin libnccl-net.so",
    ]
    assert judge(partial, 1) is None
