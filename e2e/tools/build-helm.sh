#!/usr/bin/env bash
# Builds helm v3 from Go modules (helm.sh/helm/v3/cmd/helm) into a cache directory keyed by
# version. Only the Go module proxy is needed.
# Usage: build-helm.sh OUT_DIR   (OUT_DIR/bin/helm; a complete OUT_DIR is left alone)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-helm.sh OUT_DIR}
version=$(sed -n 's/^HELM_VERSION := //p' "$here/../versions.mk")
[ -n "$version" ] || { echo "build-helm.sh: cannot read HELM_VERSION from e2e/versions.mk" >&2; exit 1; }
if [ -x "$out/bin/helm" ]; then
  echo "helm already built in $out/bin"
  exit 0
fi
mkdir -p "$out/bin"
GOBIN="$out/bin" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@v$version"
"$out/bin/helm" version --short
