#!/usr/bin/env bash
# Builds the CMS image from binaries already built on the host (the
# `prebuilt` target of deploy/docker/Dockerfile on cms-base:bookworm), the way
# CI does: no registry, no Rust builder image.
#
# Usage: deploy/docker/build.sh [--release | --bin-dir DIR] [--tag TAG] [--no-strip]
#   --release   pack target/release binaries (default: target/debug, what CI builds)
#   --bin-dir DIR  pack the binaries in DIR (the system tests pass theirs)
#   --tag TAG   image tag (default cms:dev)
#   --no-strip  keep debug info (debug binaries are ~5x larger with it)
# Env: CARGO_TARGET_DIR (default <repo>/target), CMS_BASE_IMAGE (default cms-base:bookworm)
#
# Needs: the binaries (`cargo build --bins [--release]`), the base image
# (`scripts/make-base-images`), a reachable Docker Engine. The previous image
# of the tag is removed once the new one is built. Prints the image id last.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
profile=debug
bindir=""
tag=cms:dev
strip=1
while (( $# )); do
  case "$1" in
    --release) profile=release ;;
    --bin-dir) bindir=${2:?--bin-dir needs a value}; shift ;;
    --tag) tag=${2:?--tag needs a value}; shift ;;
    --no-strip) strip=0 ;;
    *) echo "usage: $0 [--release | --bin-dir DIR] [--tag TAG] [--no-strip]" >&2; exit 2 ;;
  esac
  shift
done
base=${CMS_BASE_IMAGE:-cms-base:bookworm}
bindir=${bindir:-${CARGO_TARGET_DIR:-$repo/target}/$profile}
bins=(cms-broker cms-bookie cms-admin cms-perf)
started=$(date +%s%N)
ms() { echo $(( ($(date +%s%N) - started) / 1000000 )); }
die() { echo "build.sh: ERROR: $*" >&2; exit 1; }

docker info >/dev/null 2>&1 || die "'docker info' fails: no Docker Engine reachable"
docker image inspect "$base" >/dev/null 2>&1 \
  || die "base image $base is missing: run scripts/make-base-images (as root) first"
hint=""
[[ $profile == release ]] && hint=" --release"
for b in "${bins[@]}"; do
  [[ -x $bindir/$b ]] || die "$bindir/$b is missing: run cargo build --workspace --bins$hint"
done

ctx=$(mktemp -d "${TMPDIR:-/tmp}/cms-image-ctx.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin" "$ctx/deploy/docker"
cp "$repo/deploy/docker/cms-entrypoint" "$ctx/deploy/docker/"
for b in "${bins[@]}"; do
  if (( strip )) && command -v strip >/dev/null; then
    strip --strip-debug -o "$ctx/bin/$b" "$bindir/$b"
  else
    cp "$bindir/$b" "$ctx/bin/$b"
  fi
done
echo "build.sh: [$(ms) ms] context $(du -sh "$ctx" | cut -f1) from $bindir" >&2

old=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
docker build -q -f "$repo/deploy/docker/Dockerfile" --target prebuilt \
  --build-arg "BASE_IMAGE=$base" -t "$tag" "$ctx" >"$ctx/build.log" 2>&1 \
  || { cat "$ctx/build.log" >&2; die "docker build failed"; }
new=$(docker image inspect -f '{{.Id}}' "$tag")
if [[ -n $old && $old != "$new" ]]; then
  docker rmi "$old" >/dev/null 2>&1 || true
fi
echo "build.sh: [$(ms) ms] built $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))" >&2
echo "$new"
