#!/usr/bin/env bash
# Writes the kind kit's images as OCI image tars, without Docker or a registry, for
# `kind load image-archive`: every `podha.io/...` image the manifests here name, each holding one
# static binary (podha-csi from `make node-images`; csi-attacher and csi-provisioner from
# `make csi-sidecars`, built with CGO_ENABLED=0), plus podha's own image from `make image`.
# Usage: build-images.sh OUT_DIR
# Env: PODHA_SIM (podha-sim), PODHA_STATIC_DIR, PODHA_CSI_SIDECARS_BIN_DIR, PODHA_IMAGE_TAR
# (the Makefile exports them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-images.sh OUT_DIR}
sim=${PODHA_SIM:-target/debug/podha-sim}
static=${PODHA_STATIC_DIR:?run through make chaos-kind, or set PODHA_STATIC_DIR}
sidecars=${PODHA_CSI_SIDECARS_BIN_DIR:?run through make chaos-kind, or set PODHA_CSI_SIDECARS_BIN_DIR}
podha=${PODHA_IMAGE_TAR:?run through make chaos-kind, or set PODHA_IMAGE_TAR}
mkdir -p "$out"

images=$(sed -n 's/^ *image: *\(podha\.io\/[^ ]*\) *$/\1/p' "$here"/podha-csi/*.yaml "$here"/*.yaml | sort -u)
[ -n "$images" ] || { echo "build-images.sh: no podha.io images in the manifests" >&2; exit 1; }
for image in $images; do
  name=${image#podha.io/}
  name=${name%%:*}
  case $name in
    podha-csi) binary=$static/podha-csi ;;
    csi-attacher|csi-provisioner) binary=$sidecars/$name ;;
    *) echo "build-images.sh: no binary known for $image" >&2; exit 1 ;;
  esac
  [ -x "$binary" ] || { echo "build-images.sh: $binary is missing: run make node-images csi-sidecars" >&2; exit 1; }
  if ! file "$binary" | grep -q "statically linked"; then
    echo "build-images.sh: $binary is not statically linked; the image holds nothing else" >&2
    exit 1
  fi
  "$sim" image build --name "$image" --binary "$binary" --out "$out/$name.tar"
  echo "$out/$name.tar: $image"
done
[ -f "$podha" ] || { echo "build-images.sh: $podha is missing: run make image" >&2; exit 1; }
cp "$podha" "$out/podha.tar"
echo "$out/podha.tar: podha's image (make image)"
