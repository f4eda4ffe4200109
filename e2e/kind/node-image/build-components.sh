#!/usr/bin/env bash
# Builds what the kind node image holds beyond the sim's Kubernetes binaries, from Go modules
# (and Kubernetes' pause.c with the host's C compiler), into OUT_DIR/bin:
#   kind; kubeadm (Kubernetes $K8S_VERSION); the etcd and CoreDNS versions that kubeadm names
#   (`kubeadm config images list`); crictl (cri-tools); kube-router; local-path-provisioner; pause.
# Versions: e2e/versions.mk. Usage: build-components.sh OUT_DIR (a complete OUT_DIR is left alone)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-components.sh OUT_DIR}
version_of() { sed -n "s/^$1 := //p" "$here/../../versions.mk"; }
k8s=$(version_of K8S_VERSION)
bins=(kind kubeadm etcd coredns crictl kube-router local-path-provisioner pause)
complete=1
for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || complete=0; done
if [ "$complete" = 1 ]; then
  echo "kind node components already built in $out/bin"
  exit 0
fi
# Built into bin.part, renamed bin once every binary is there: an interrupted build leaves no
# directory that looks complete.
bin=$out/bin.part
rm -rf "$bin"
mkdir -p "$bin" "$out/src"
export GOFLAGS=-mod=mod GOBIN=$bin
install_module() { # MODULE@VERSION
  echo "building $1"
  go install -trimpath -ldflags "-s -w" "$1"
}

install_module "sigs.k8s.io/kind@v$(version_of KIND_VERSION)"

# kubeadm, from the module set the sim's control plane is built from.
# shellcheck source=e2e/k8s/go-modules.sh
. "$here/../../k8s/go-modules.sh"
k8s_build "$k8s" "$out/src" k8s "$bin" kubeadm
kdir=$(sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p' "$out/src/kubernetes.json")
[ -d "$kdir/build/pause" ] || { echo "build-components.sh: no Kubernetes sources in '$kdir'" >&2; exit 1; }

# The versions kubeadm runs.
listed=$("$bin/kubeadm" config images list --kubernetes-version "v$k8s")
tag_of() { sed -n "s|^registry.k8s.io/$1:||p" <<<"$listed"; }
etcd=$(tag_of etcd); etcd=${etcd%-*}
coredns=$(tag_of coredns/coredns)
pause=$(tag_of pause)
[ -n "$etcd" ] && [ -n "$coredns" ] && [ -n "$pause" ] || { echo "build-components.sh: kubeadm listed: $listed" >&2; exit 1; }

etcd_build "$etcd" "$out/src/etcd" "$bin/etcd"
install_module "github.com/coredns/coredns@$coredns"
install_module "sigs.k8s.io/cri-tools/cmd/crictl@v$(version_of CRI_TOOLS_VERSION)"
install_module "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@v$(version_of KUBE_ROUTER_VERSION)"
install_module "github.com/rancher/local-path-provisioner@v$(version_of LOCAL_PATH_PROVISIONER_VERSION)"

# The pod sandbox, from Kubernetes' own source: static, as its image holds nothing else.
echo "building pause"
cc -Os -Wall -static -DVERSION="v$pause" -o "$bin/pause" "$kdir/build/pause/linux/pause.c"

for b in "${bins[@]}"; do [ -x "$bin/$b" ] || { echo "build-components.sh: $b missing after build" >&2; exit 1; }; done
rm -rf "$out/bin"
mv "$bin" "$out/bin"
echo "kind node components ready in $out/bin"
