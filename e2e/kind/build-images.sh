#!/usr/bin/env bash
# Builds the kind kit's images with Docker, as `docker save` archives for
# `kind load image-archive`: every `podha.io/...` image the manifests here name, each one static
# binary on an empty base (e2e/images/Dockerfile: podha-csi from `make node-images`;
# csi-attacher and csi-provisioner from `make csi-sidecars`, built with CGO_ENABLED=0), plus
# podha's own image from `make image`.
# Usage: build-images.sh OUT_DIR
# Env: PODHA_CSI_SIDECARS_BIN_DIR, PODHA_IMAGE_TAR (the Makefile exports them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=$(mkdir -p "${1:?usage: build-images.sh OUT_DIR}" && cd "$1" && pwd)
sidecars=${PODHA_CSI_SIDECARS_BIN_DIR:?run through make chaos-kind, or set PODHA_CSI_SIDECARS_BIN_DIR}
podha=${PODHA_IMAGE_TAR:?run through make chaos-kind, or set PODHA_IMAGE_TAR}
dist=$repo/target/dist/linux-amd64
fail() { echo "build-images.sh: $*" >&2; exit 1; }

images=$(sed -n 's/^ *image: *\(podha\.io\/[^ ]*\) *$/\1/p' "$here"/podha-csi/*.yaml "$here"/*.yaml | sort -u)
[ -n "$images" ] || fail "no podha.io images in the manifests"
specs=()
for image in $images; do
  stage=${image#podha.io/}
  stage=${stage%%:*}
  case $stage in
    podha-csi) [ -x "$dist/podha-csi" ] || fail "$dist/podha-csi is missing: run make node-images" ;;
    csi-attacher|csi-provisioner)
      [ -x "$sidecars/$stage" ] || fail "$sidecars/$stage is missing: run make csi-sidecars"
      install -D -m 0755 "$sidecars/$stage" "$dist/$stage" ;;
    *) fail "no image stage known for $image" ;;
  esac
  specs+=("$stage=$image")
done
(cd "$repo" && bash e2e/images/build.sh "$out" "${specs[@]}")
[ -f "$podha" ] || fail "$podha is missing: run make image"
cp "$podha" "$out/podha.tar"
echo "$out/podha.tar: podha's image (make image)"
