#!/usr/bin/env bash
# Builds the kubelet and kube-proxy for the sim cluster's real nodes from the same Go module set as the control
# plane (k8s.io/kubernetes at K8S_VERSION, staging modules replaced by their published v0.x twins,
# as in build.sh), into a cache directory keyed by version. Only the Go module proxy is needed.
# Usage: build-node.sh OUT_DIR   (OUT_DIR/bin receives kubelet and kube-proxy; binaries already
# there are left alone)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-node.sh OUT_DIR}
k8s=$(sed -n "s/^K8S_VERSION := //p" "$here/../versions.mk")
[ -n "$k8s" ] || { echo "build-node.sh: cannot read K8S_VERSION from e2e/versions.mk" >&2; exit 1; }
cmds=()
for c in kubelet kube-proxy; do
  [ -x "$out/bin/$c" ] || cmds+=("$c")
done
if [ ${#cmds[@]} -eq 0 ]; then
  echo "kubelet and kube-proxy already built in $out/bin"
  exit 0
fi

work="$out/src"
mkdir -p "$out/bin" "$work/node"
export GOFLAGS=-mod=mod

staging_minor="0.${k8s#1.}"
( cd "$work" && go mod download -json "k8s.io/kubernetes@v$k8s" ) > "$work/kubernetes.json"
kmod=$(sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p' "$work/kubernetes.json")
[ -f "$kmod" ] || { echo "build-node.sh: could not fetch k8s.io/kubernetes@v$k8s from the Go module proxy" >&2; exit 1; }
{
  echo "module podha.io/sim/node"
  echo
  echo "go 1.24.0"
  echo
  echo "require k8s.io/kubernetes v$k8s"
  echo
  echo "replace ("
  grep -E '^\s*k8s.io/[^ ]+ v0\.0\.0\s*$' "$kmod" | awk '{print $1}' | sort -u | while read -r m; do
    echo "	$m => $m v$staging_minor"
  done
  echo ")"
} > "$work/node/go.mod"
cat > "$work/node/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
( cd "$work/node" && go mod tidy )

major=${k8s%%.*}
minor=${k8s#*.}; minor=${minor%%.*}
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=v$k8s -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
echo "building ${cmds[*]} v$k8s (this takes a while on a small machine)"
( cd "$work/node" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out/bin/" \
    "${cmds[@]/#/k8s.io/kubernetes/cmd/}" )
