#!/usr/bin/env bash
# Builds test images with Docker from e2e/images/Dockerfile, one stage each, checks them and
# saves each (`docker save`) as OUT_DIR/<stage>.tar, which the sim's nodes import at boot and
# `kind load image-archive` loads into kind's.
# Usage: build.sh OUT_DIR STAGE=IMAGE...   e.g. build.sh target/images podha-pause=podha.io/sim/pause:1
# Run from the repository's root, with target/dist/linux-<arch>/<binary> built for each stage
# (static: the images hold nothing else). The Docker client and engine: e2e/tools/docker-engine.sh.
set -euo pipefail

usage="usage: build.sh OUT_DIR STAGE=IMAGE..."
out=${1:?$usage}
shift
[ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
fail() { echo "e2e/images/build.sh: $*" >&2; exit 1; }
dockerfile=e2e/images/Dockerfile
[ -f "$dockerfile" ] || fail "run from the repository's root"

for spec in "$@"; do
  stage=${spec%%=*}
  image=${spec#*=}
  [ -n "$stage" ] && [ "$stage" != "$spec" ] && [[ "$image" == *:* ]] \
    || fail "'$spec' is not STAGE=NAME:TAG"
  grep -qx "FROM scratch AS $stage" "$dockerfile" || fail "$dockerfile has no stage $stage"
done

# shellcheck source=e2e/tools/docker-engine.sh
. e2e/tools/docker-engine.sh
docker_engine e2e/images/build.sh
arch=$("$docker" version --format '{{.Server.Arch}}')
mkdir -p "$out"

for spec in "$@"; do
  stage=${spec%%=*}
  image=${spec#*=}
  binary=$(sed -n "/^FROM scratch AS $stage\$/,/^FROM /s/^COPY [^ ]* \\(\\/[^ ]*\\)\$/\\1/p" "$dockerfile")
  [ -x "target/dist/linux-$arch/${stage}" ] \
    || fail "target/dist/linux-$arch/$stage is missing (make node-images builds podha-pause and podha-csi; e2e/kind/build-images.sh stages the sidecars)"
  "$docker" build --quiet --file "$dockerfile" --target "$stage" --tag "$image" . >/dev/null
  want() {
    local got
    got=$("$docker" image inspect --format "$1" "$image")
    [ "$got" = "$2" ] || fail "$image: $1 is '$got', not '$2'"
  }
  want '{{.Os}}/{{.Architecture}}' "linux/$arch"
  want '{{json .Config.Entrypoint}}' "[\"$binary\"]"
  want '{{len .RootFS.Layers}}' '1'
  "$docker" save --output "$out/$stage.tar" "$image"
  echo "$out/$stage.tar: $image (entrypoint $binary)"
done
