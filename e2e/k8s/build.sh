#!/usr/bin/env bash
# Builds the sim cluster's control plane from Go modules into a cache directory keyed by version:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok.
# Only the Go module proxy is needed: no release downloads, no container images.
# Usage: build.sh OUT_DIR   (OUT_DIR/bin receives the binaries; a complete OUT_DIR is left alone)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
version_of() { sed -n "s/^$1 := //p" "$here/../versions.mk"; }
k8s=$(version_of K8S_VERSION)
etcd=$(version_of ETCD_VERSION)
kwok=$(version_of KWOK_VERSION)
[ -n "$k8s" ] && [ -n "$etcd" ] && [ -n "$kwok" ] || { echo "build.sh: cannot read versions from e2e/versions.mk" >&2; exit 1; }

bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
complete=1
for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || complete=0; done
if [ "$complete" = 1 ]; then
  echo "sim cluster binaries already built in $out/bin"
  exit 0
fi

# shellcheck source=e2e/k8s/go-modules.sh
. "$here/go-modules.sh"
k8s_build "$k8s" "$out/src" k8s "$out/bin" kube-apiserver kube-controller-manager kube-scheduler kubectl
etcd_build "$etcd" "$out/src/etcd" "$out/bin/etcd"

echo "building kwok v$kwok"
GOFLAGS=-mod=mod GOBIN="$out/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$kwok"

for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || { echo "build.sh: $b missing after build" >&2; exit 1; }; done
echo "sim cluster binaries ready in $out/bin"
