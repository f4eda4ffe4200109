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

# Whether an ELF executable is static: no program header of type PT_INTERP (a dynamic loader).
static() {
  python3 - "$1" <<'PY'
import struct, sys
with open(sys.argv[1], "rb") as f:
    elf = f.read(64)
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        sys.exit("not a 64-bit ELF file")
    end = "<" if elf[5] == 1 else ">"
    phoff, = struct.unpack(end + "Q", elf[32:40])
    phentsize, phnum = struct.unpack(end + "HH", elf[54:58])
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        kind, = struct.unpack(end + "I", f.read(4))
        if kind == 3:
            sys.exit(1)
PY
}

# shellcheck source=e2e/tools/docker-engine.sh
. e2e/tools/docker-engine.sh
docker_engine e2e/images/build.sh
arch=$("$docker" version --format '{{.Server.Arch}}')
mkdir -p "$out"

for spec in "$@"; do
  stage=${spec%%=*}
  image=${spec#*=}
  binary=$(sed -n "/^FROM scratch AS $stage\$/,/^FROM /s/^COPY [^ ]* \\(\\/[^ ]*\\)\$/\\1/p" "$dockerfile")
  file=target/dist/linux-$arch/$stage
  [ -x "$file" ] \
    || fail "$file is missing (make node-images builds podha-pause and podha-csi; e2e/kind/build-images.sh stages the sidecars)"
  static "$file" || fail "$file is linked dynamically: the image holds nothing but it"
  docker_build "$image" --quiet --file "$dockerfile" --target "$stage" . >/dev/null
  docker_want "$image" '{{.Os}}/{{.Architecture}}' "linux/$arch"
  docker_want "$image" '{{json .Config.Entrypoint}}' "[\"$binary\"]"
  docker_want "$image" '{{len .RootFS.Layers}}' '1'
  "$docker" save --output "$out/$stage.tar" "$image"
  echo "$out/$stage.tar: $image (entrypoint $binary)"
done
