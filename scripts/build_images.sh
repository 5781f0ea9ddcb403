#!/usr/bin/env bash
# Build the trex container images from images/*.Dockerfile (build context: the repository root).
#
#   scripts/build_images.sh [--list] [--push] [NAME...]     NAME: operator workload-cpu workload-cuda workload-ascend
#
# Environment: REGISTRY (default ghcr.io/trex-dev), TAG (default: the version in pyproject.toml),
# ENGINE (docker or podman; default: the first one found that answers).
# --list prints the image references and builds nothing. Without a working container engine the
# script says so and exits with status 2 (nothing is built).
set -euo pipefail
cd "$(dirname "$0")/.."

REGISTRY="${REGISTRY:-ghcr.io/trex-dev}"
TAG="${TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)}"
ALL=(operator workload-cpu workload-cuda workload-ascend)

list=0
push=0
names=()
for arg in "$@"; do
  case "$arg" in
    --list) list=1 ;;
    --push) push=1 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "build_images.sh: unknown option $arg" >&2; exit 64 ;;
    *) names+=("$arg") ;;
  esac
done
[ ${#names[@]} -eq 0 ] && names=("${ALL[@]}")
for n in "${names[@]}"; do
  if [ ! -f "images/$n.Dockerfile" ]; then
    echo "build_images.sh: no images/$n.Dockerfile (known: ${ALL[*]})" >&2
    exit 64
  fi
done

ref() { echo "$REGISTRY/trex-$1:$TAG"; }

if [ "$list" -eq 1 ]; then
  for n in "${names[@]}"; do echo "$n $(ref "$n")"; done
  exit 0
fi

engine="${ENGINE:-}"
if [ -z "$engine" ]; then
  for candidate in docker podman; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" info >/dev/null 2>&1; then
      engine="$candidate"
      break
    fi
  done
fi
if [ -z "$engine" ] || ! "$engine" info >/dev/null 2>&1; then
  echo "build_images.sh: no container engine available (docker or podman, with a reachable daemon):" >&2
  echo "  nothing was built. Install Docker or Podman, or build images/*.Dockerfile elsewhere." >&2
  exit 2
fi

for n in "${names[@]}"; do
  image="$(ref "$n")"
  echo "== building $image from images/$n.Dockerfile with $engine"
  "$engine" build -f "images/$n.Dockerfile" -t "$image" .
  if [ "$push" -eq 1 ]; then
    "$engine" push "$image"
  fi
done
