"""Bench4Opt (ORGEval): instance folders ``{LP,MILP}/<family>/<instance>/`` or the release tarball.

Each instance folder holds wp.txt (long word problem), wp_concise.txt (absent in two), data.json (the parameters the
program reads) and model.lp (the reference model). The objective ground truth is not published; it
comes from solving model.lp (:func:`reference_truth`), and ORGEval compares structure instead.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from trex.verify.items import Item, Truth, sha256_bytes

FILES = ("wp.txt", "wp_concise.txt", "data.json", "model.lp")
REQUIRED = ("wp.txt", "data.json", "model.lp")  # two published instances lack wp_concise.txt
TARBALL = "bench4opt.tar.gz"


def _instances_from_tar(path: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    groups: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path, "r:*") as tf:
        for m in tf:
            if not m.isfile():
                continue
            p = PurePosixPath(m.name)
            if p.name not in FILES or "__MACOSX" in p.parts:
                continue
            fh = tf.extractfile(m)
            if fh is None:
                continue
            groups.setdefault(str(p.parent), {})[p.name] = fh.read()
    yield from sorted(groups.items())


def _instances_from_dir(root: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    dirs = sorted({p.parent for p in root.rglob("model.lp")})
    for d in dirs:
        yield d.relative_to(root).as_posix(), {f: (d / f).read_bytes() for f in FILES if (d / f).is_file()}


def source_of(path: Path) -> Path:
    """The tarball or folder to read: a folder with no model.lp but the release tarball means the tarball."""
    if path.is_dir() and not any(path.rglob("model.lp")) and (path / TARBALL).is_file():
        return path / TARBALL
    return path


def load(path: Path, text: str = "wp.txt") -> tuple[list[Item], str]:
    """Items (id = class/family/instance) and the content hash over every instance file."""
    src = source_of(path)
    it = _instances_from_tar(src) if src.is_file() else _instances_from_dir(src)
    items: list[Item] = []
    hash_parts: list[bytes] = []
    for rel, files in it:
        missing = [f for f in REQUIRED if f not in files]
        if missing:
            raise ValueError(f"bench4opt instance {rel!r} lacks {', '.join(missing)}")
        parts = PurePosixPath(rel).parts
        # Tarball paths start at LP/ or MILP/; a folder may have been opened one level up or down.
        cls_idx = next((i for i, p in enumerate(parts) if p in ("LP", "MILP")), None)
        if cls_idx is None or len(parts) < cls_idx + 3:
            raise ValueError(f"bench4opt instance {rel!r} is not under LP/<family>/ or MILP/<family>/")
        cls, family, name = parts[cls_idx], parts[cls_idx + 1], parts[-1]
        item_id = f"{cls}/{family}/{name}"
        for f in FILES:
            if f in files:
                hash_parts += [item_id.encode(), f.encode(), files[f]]
        concise = files.get("wp_concise.txt", files["wp.txt"])
        items.append(Item(
            id=item_id,
            question=(concise if text == "wp_concise.txt" else files["wp.txt"]).decode("utf-8"),
            truth=None,
            category=f"{cls}/{family}",
            files={"data.json": files["data.json"].decode("utf-8")},
            reference_lp=files["model.lp"].decode("utf-8"),
            meta={"class": cls, "family": family},
        ))
    if not items:
        raise ValueError(f"no Bench4Opt instances (folders with {', '.join(FILES)}) under {path}")
    return items, sha256_bytes(*hash_parts)


def reference_truth(lp_text: str) -> Truth:
    """Solve the reference model: optimal value, or the status label the solver proves."""
    from trex.verify.orgeval import solve_lp_text

    status, value = solve_lp_text(lp_text)
    if status == "optimal" and value is not None:
        return Truth("optimal", value, repr(value), None)
    if status == "infeasible":
        return Truth("infeasible", None, status)
    if status == "unbounded":
        return Truth("unbounded", None, status)
    if status == "infeasible_or_unbounded":
        return Truth("infeasible_or_unbounded", None, status)
    return Truth("unknown", None, status)
