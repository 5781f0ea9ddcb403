"""kernels.milpStarts, kernels.skillsPath and kernels.cacheDir do what they say, on one small cpu-c tune: the
tiling MILP's top-k starts are measured (k = milpStarts), the skill library is read from skillsPath (not the
output folder), and compiled kernels land in cacheDir."""

from __future__ import annotations

import json
from pathlib import Path

from trex.config_base import load_section
from trex.kernels.config import KernelTuneConfig
from trex.kernels.skills import Skill, SkillLibrary
from trex.kernels.suite import SUITE
from trex.kernels.suite.base import shape_bucket
from trex.kernels.tune import run


def test_milp_starts_skills_path_and_cache_dir(tmp_path: Path) -> None:
    shape = {"rows": 8, "cols": 64}
    skills = tmp_path / "library" / "skills.jsonl"
    # one earlier verified improvement on this kernel, at a library path of its own
    SkillLibrary(skills).add([Skill("rmsnorm_fwd", SUITE["rmsnorm_fwd"].kclass, "memory", shape_bucket(shape),
                                    "cpu:elsewhere", "cpu-c", "up", "UNROLL", 1, 2, 1.2)])
    cfg = load_section(KernelTuneConfig, {
        "backend": "cpu-c", "suite": "none", "kernels": ["rmsnorm_fwd"], "threads": 1,
        "shapes": [{"kernel": "rmsnorm_fwd", "dims": shape}], "milpStarts": 2, "skillsPath": str(skills),
        "cacheDir": str(tmp_path / "cache"), "budget": {"trials": 1, "seconds": 20}, "output": str(tmp_path / "out")})
    run(cfg, log=lambda _m: None)
    [result] = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert len(result["milp_starts"]) == 2
    assert result["skills_used"] == 1
    assert not (tmp_path / "out" / "skills.jsonl").exists()
    assert list((tmp_path / "cache").glob("*.so")), sorted(p.name for p in (tmp_path / "cache").iterdir())
