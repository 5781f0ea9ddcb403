"""images/workload-ascend: keeps CANN's environment, pins a matching torch/torch_npu/CANN triple, driver group."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from dockerfile import final_stage

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "images" / "workload-ascend.Dockerfile"
ENTRYPOINT = REPO / "images" / "workload-ascend-entrypoint.sh"

# torch_npu's COMPATIBILITY.md and TorchNPU release notes: (torch_npu package, torch) -> the CANN release that
# build targets.
TORCH_NPU_MATRIX = {
    ("2.13.0", "2.13.0"): "9.2.0", ("2.12.0.post3", "2.12.0"): "9.2.0", ("2.12.0", "2.12.0"): "9.1.0",
    ("2.11.0", "2.11.0"): "9.1.0", ("2.10.0", "2.10.0"): "9.0.0",
    ("2.9.0", "2.9.0"): "8.5.0", ("2.8.0.post2", "2.8.0"): "8.5.0", ("2.7.1.post2", "2.7.1"): "8.5.0",
    ("2.6.0.post5", "2.6.0"): "8.5.0", ("2.8.0", "2.8.0"): "8.3.RC1", ("2.7.1", "2.7.1"): "8.3.RC1",
    ("2.6.0.post3", "2.6.0"): "8.3.RC1", ("2.6.0", "2.6.0"): "8.2.RC1", ("2.5.1", "2.5.1"): "8.1.RC1",
}


def _args(stage: list[tuple[str, str]]) -> dict[str, str]:
    return dict(a.split("=", 1) for w, a in stage if w == "ARG" and "=" in a)


def test_torch_npu_is_built_for_the_base_cann_release() -> None:
    stage = final_stage(DOCKERFILE)
    cann = re.fullmatch(r"quay\.io/ascend/cann:([0-9A-Za-z.]+)-\S+", stage[0][1])
    assert cann, stage[0]
    args = _args(stage)
    pair = (args["TORCH_NPU_VERSION"], args["TORCH_VERSION"])
    assert TORCH_NPU_MATRIX.get(pair) == cann.group(1), f"torch_npu/torch {pair} is not built for CANN {cann.group(1)}"
    run = " ".join(a for w, a in stage if w == "RUN")
    assert '"torch==${TORCH_VERSION}"' in run and '"torch-npu==${TORCH_NPU_VERSION}"' in run


def test_cann_environment_is_kept() -> None:
    stage = final_stage(DOCKERFILE)
    for word, args in stage:
        if word == "ENV" and "LD_LIBRARY_PATH=" in args:  # appending is fine; replacing loses CANN's paths
            assert re.search(r"LD_LIBRARY_PATH=\S*\$\{?LD_LIBRARY_PATH\}?", args), args
        if word == "ENV":
            assert not re.search(r"\b(PATH|PYTHONPATH|ASCEND_[A-Z_]+)=", args.replace("PIP_", "")), args
    (entry,) = [a for w, a in stage if w == "ENTRYPOINT"]
    assert entry == '["/usr/local/bin/trex-ascend-entrypoint"]'
    assert ("COPY", "images/workload-ascend-entrypoint.sh /usr/local/bin/trex-ascend-entrypoint") in stage
    ignore = (REPO / "images" / "workload-ascend.Dockerfile.dockerignore").read_text().splitlines()
    assert "!images/workload-ascend-entrypoint.sh" in ignore
    assert os.access(ENTRYPOINT, os.X_OK)
    script = ENTRYPOINT.read_text()
    for env_file in ("ascend-toolkit/set_env.sh", "share/info/ascendnpu-ir/bin/set_env.sh", "nnal/atb/set_env.sh"):
        assert env_file in script


def test_runs_as_a_non_root_member_of_the_driver_group() -> None:
    stage = final_stage(DOCKERFILE)
    run = " ".join(a for w, a in stage if w == "RUN")
    assert re.search(r'groupadd --gid "\$\{HWHIAIUSER_GID\}" HwHiAiUser', run)
    assert re.search(r"useradd --uid 65532 --gid 65532 --groups HwHiAiUser\b", run)
    assert [a for w, a in stage if w == "USER"] == ["65532:65532"]
    assert _args(stage)["HWHIAIUSER_GID"].isdigit()


@pytest.fixture
def fake_cann(tmp_path: Path) -> Path:
    """A CANN tree whose set_env.sh scripts append to the environment and record the arguments they saw."""
    for rel, line in (("ascend-toolkit/set_env.sh", 'export ASCEND_TOOLKIT_HOME="$ROOT/ascend-toolkit/latest"'),
                      ("cann-8.5.0/share/info/ascendnpu-ir/bin/set_env.sh", 'export BISHENG_SEEN=1'),
                      ("nnal/atb/set_env.sh", 'export ATB_HOME_PATH="$ROOT/nnal/atb/latest"')):
        f = tmp_path / rel
        f.parent.mkdir(parents=True)
        f.write_text(f'{line}\nexport LD_LIBRARY_PATH="{f.parent}/lib64:$LD_LIBRARY_PATH"\n'
                     f'echo "$#" >> "$ROOT/argc"\n')
    return tmp_path


def test_entrypoint_sources_cann_and_runs_the_command_unchanged(fake_cann: Path) -> None:
    env = {"PATH": os.environ["PATH"], "TREX_ASCEND_HOME": str(fake_cann), "ROOT": str(fake_cann),
           "LD_LIBRARY_PATH": "/usr/local/Ascend/driver/lib64"}
    probe = "import os, sys; print(sys.argv[1:]); print(os.environ['LD_LIBRARY_PATH']); print(os.environ['BISHENG_SEEN'])"
    res = subprocess.run(["bash", str(ENTRYPOINT), "python3", "-c", probe, "a b", "--config"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    argv, ld, bisheng = res.stdout.splitlines()
    assert argv == "['a b', '--config']" and bisheng == "1"
    assert ld.endswith(":/usr/local/Ascend/driver/lib64") and ld.count("lib64") == 4  # appended, base kept
    assert (fake_cann / "argc").read_text().split() == ["0", "0", "0"]  # the scripts see none of the command
