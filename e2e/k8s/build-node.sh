#!/usr/bin/env bash
# Builds the kubelet and kube-proxy for the sim cluster's real nodes from the same Go module set as the control
# plane (k8s.io/kubernetes at K8S_VERSION, staging modules replaced by their published v0.x twins:
# go-modules.sh), into a cache directory keyed by version. Only the Go module proxy is needed.
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

# shellcheck source=e2e/k8s/go-modules.sh
. "$here/go-modules.sh"
k8s_build "$k8s" "$out/src" node "$out/bin" "${cmds[@]}"
