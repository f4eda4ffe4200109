#!/usr/bin/env bash
# Builds the kubernetes-csi sidecars the sim cluster runs (csi-attacher, csi-provisioner) from
# Go modules into a cache directory keyed by version, as e2e/k8s/build.sh does for the control
# plane. Only the Go module proxy is needed.
#
# `go install module@version` refuses these modules (their go.mod has replace directives), so
# each module's source is copied out of the module cache and built as the main module, with its
# own go.mod and go.sum.
# node-driver-registrar is not built: the Go module proxy answers 403 for
# github.com/kubernetes-csi/node-driver-registrar (and /v2); podha-csi registers itself with the
# kubelet on real nodes, and the sim's node agent writes CSINode for kwok nodes.
# The binaries are linked statically (CGO_ENABLED=0), so the same files run on this host and
# in the kind kit's images (e2e/kind/build-images.sh), which hold nothing else.
# Usage: build-sidecars.sh OUT_DIR   (OUT_DIR/bin receives the binaries)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-sidecars.sh OUT_DIR}
version_of() { sed -n "s/^$1 := //p" "$here/../versions.mk"; }
attacher=$(version_of CSI_ATTACHER_VERSION)
provisioner=$(version_of CSI_PROVISIONER_VERSION)
[ -n "$attacher" ] && [ -n "$provisioner" ] || { echo "build-sidecars.sh: cannot read versions from e2e/versions.mk" >&2; exit 1; }

# build MODULE VERSION PACKAGE BINARY
build() {
  local module=$1 version=$2 pkg=$3 bin=$4
  if [ -x "$out/bin/$bin" ]; then echo "$bin already built in $out/bin"; return; fi
  local dir
  dir=$(cd "$out" && go mod download -json "$module@v$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { echo "build-sidecars.sh: could not fetch $module@v$version from the Go module proxy" >&2; exit 1; }
  local src="$out/src/$bin"
  rm -rf "$src"
  mkdir -p "$out/src"
  cp -r "$dir" "$src"
  chmod -R u+w "$src"
  echo "building $bin v$version"
  ( cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
      -ldflags "-s -w -X main.version=v$version" -o "$out/bin/$bin" "./$pkg" )
}

mkdir -p "$out/bin"
build github.com/kubernetes-csi/external-attacher/v4 "$attacher" cmd/csi-attacher csi-attacher
build github.com/kubernetes-csi/external-provisioner/v6 "$provisioner" cmd/csi-provisioner csi-provisioner
echo "CSI sidecars ready in $out/bin"
