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
# The link-time settings of helm's own release build (its Makefile): the version, and the
# Kubernetes version `helm template` and `helm lint` assume (1.<client-go minor>); without them
# helm assumes v1.20 and refuses every chart whose kubeVersion asks for more.
gomod=$(go mod download -json "helm.sh/helm/v3@v$version" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
[ -f "$gomod" ] || { echo "build-helm.sh: could not fetch helm.sh/helm/v3@v$version" >&2; exit 1; }
minor=$(sed -n 's/^\s*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod")
[ -n "$minor" ] || { echo "build-helm.sh: no k8s.io/client-go version in $gomod" >&2; exit 1; }
ldflags="-X helm.sh/helm/v3/internal/version.version=v$version"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
done
GOBIN="$out/bin" go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@v$version"
"$out/bin/helm" version --short
