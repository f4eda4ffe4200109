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

work="$out/src"
mkdir -p "$out/bin" "$work/k8s" "$work/etcd"
export GOFLAGS=-mod=mod

# Kubernetes: a consumer module that requires k8s.io/kubernetes and replaces each staging module
# (required there at v0.0.0) with its published v0.x twin.
staging_minor="0.${k8s#1.}"
( cd "$work" && go mod download -json "k8s.io/kubernetes@v$k8s" ) > "$work/kubernetes.json"
kmod=$(sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p' "$work/kubernetes.json")
[ -f "$kmod" ] || { echo "build.sh: could not fetch k8s.io/kubernetes@v$k8s from the Go module proxy" >&2; exit 1; }
{
  echo "module podha.io/sim/k8s"
  echo
  echo "go 1.24.0"
  echo
  echo "require k8s.io/kubernetes v$k8s"
  echo
  echo "replace ("
} > "$work/k8s/go.mod"
grep -E '^\s*k8s.io/[^ ]+ v0\.0\.0\s*$' "$kmod" | awk '{print $1}' | sort -u | while read -r m; do
  echo "	$m => $m v$staging_minor"
done >> "$work/k8s/go.mod"
echo ")" >> "$work/k8s/go.mod"
cat > "$work/k8s/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
( cd "$work/k8s" && go mod tidy )

major=${k8s%%.*}
minor=${k8s#*.}; minor=${minor%%.*}
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=v$k8s -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
echo "building Kubernetes v$k8s components (this takes a while on a small machine)"
( cd "$work/k8s" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl )

# etcd: a tiny main around the server's own entry point, in its own module.
cat > "$work/etcd/go.mod" <<GO
module podha.io/sim/etcd

go 1.24.0

require go.etcd.io/etcd/server/v3 v$etcd
GO
cat > "$work/etcd/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
echo "building etcd v$etcd"
( cd "$work/etcd" && go mod tidy && go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" . )

echo "building kwok v$kwok"
GOBIN="$out/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$kwok"

for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || { echo "build.sh: $b missing after build" >&2; exit 1; }; done
echo "sim cluster binaries ready in $out/bin"
