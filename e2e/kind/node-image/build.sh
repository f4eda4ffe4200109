#!/usr/bin/env bash
# Builds podha's kind node image (Kubernetes $K8S_VERSION) into the Docker engine of
# e2e/tools/docker-engine.sh, without a registry: kind's own node image cannot be pulled here.
# The node is Debian bookworm (systemd, containerd, runc and the CNI plugins from Debian's
# packages, by mmdebstrap) with kubeadm, the kubelet and kubectl; the images kubeadm runs (with
# exactly the tags `kubeadm config images list` prints), the network (kube-router) and the default
# StorageClass's provisioner are built here too and preloaded into the node's containerd.
# See e2e/kind/node-image/Dockerfile for the images and e2e/kind/README.md for what it is for.
#
# Usage: build.sh IMAGE     (run from the repository's root, as root)
# Env: PODHA_SIM_BIN_DIR (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl: make k8s),
#      PODHA_NODE_BIN_DIR (kubelet, kube-proxy: make node-deps),
#      PODHA_KIND_BIN_DIR (kubeadm, etcd, coredns, crictl, kube-router, local-path-provisioner,
#      pause: e2e/kind/node-image/build-components.sh), PODHA_CACHE.
# An image of that name already in the engine is left alone: the name carries every version.
set -euo pipefail

image=${1:?usage: build.sh IMAGE}
fail() { echo "e2e/kind/node-image/build.sh: $*" >&2; exit 1; }
[ -f e2e/kind/node-image/Dockerfile ] || fail "run from the repository's root"
version_of() { sed -n "s/^$1 := //p" e2e/versions.mk; }
k8s=v$(version_of K8S_VERSION)
cache=${PODHA_CACHE:-$HOME/.cache/podha}
sim_bin=${PODHA_SIM_BIN_DIR:?run through make, or set PODHA_SIM_BIN_DIR}
node_bin=${PODHA_NODE_BIN_DIR:?run through make, or set PODHA_NODE_BIN_DIR}
kind_bin=${PODHA_KIND_BIN_DIR:?run through make, or set PODHA_KIND_BIN_DIR}

# shellcheck source=e2e/tools/docker-engine.sh
. e2e/tools/docker-engine.sh
docker_engine e2e/kind/node-image/build.sh
if "$docker" image inspect "$image" >/dev/null 2>&1; then
  echo "$image is built already"
  exit 0
fi

# The root filesystems, from Debian's packages (e2e/tools/debian-rootfs.sh).
node_packages=systemd,systemd-sysv,iptables,iproute2,mount,util-linux,procps,ca-certificates,containerd,runc,containernetworking-plugins,conntrack,ethtool,socat,kmod,libseccomp2
base_packages=iptables,ipset,iproute2,conntrack
# shellcheck source=e2e/tools/debian-rootfs.sh
. e2e/tools/debian-rootfs.sh
# (Not in a command substitution, where a failure would not stop the script.)
debian_rootfs e2e/kind/node-image/build.sh node "$node_packages" > "$cache/kind-rootfs.node" \
  --customize-hook='mkdir -p "$1/opt/cni" && ln -s /usr/lib/cni "$1/opt/cni/bin"' \
  --customize-hook=': > "$1/etc/machine-id" && rm -f "$1/var/lib/dbus/machine-id"' \
  --customize-hook='chroot "$1" systemctl mask getty@tty1.service console-getty.service systemd-udevd.service' \
  || fail "the node's root filesystem: mmdebstrap failed"
debian_rootfs e2e/kind/node-image/build.sh debian "$base_packages" > "$cache/kind-rootfs.debian" || fail "the images' base: mmdebstrap failed"
node_tar=$(cat "$cache/kind-rootfs.node")
base_tar=$(cat "$cache/kind-rootfs.debian")

# The build context: the root filesystems, the binaries, the node's files and its version.
dist=target/dist/kind
rm -rf "$dist"
mkdir -p "$dist/bin" "$dist/images"
ln "$node_tar" "$dist/node.tar" 2>/dev/null || cp "$node_tar" "$dist/node.tar"
ln "$base_tar" "$dist/debian.tar" 2>/dev/null || cp "$base_tar" "$dist/debian.tar"
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do install -m 0755 "$sim_bin/$b" "$dist/bin/"; done
for b in kubelet kube-proxy; do install -m 0755 "$node_bin/$b" "$dist/bin/"; done
for b in kubeadm etcd coredns crictl kube-router local-path-provisioner pause; do
  [ -x "$kind_bin/$b" ] || fail "$kind_bin/$b is missing: run make kind-deps"
  install -m 0755 "$kind_bin/$b" "$dist/bin/"
done
cp -a e2e/kind/node-image/files "$dist/files"
echo "$k8s" > "$dist/files/kind/version"

# The images kubeadm runs, by the names it gives them; then the network's and the storage's.
mapfile -t kubeadm_images < <("$dist/bin/kubeadm" config images list --kubernetes-version "$k8s")
[ "${#kubeadm_images[@]}" -ge 7 ] || fail "kubeadm config images list printed: ${kubeadm_images[*]}"
images=()
for ref in "${kubeadm_images[@]}"; do
  stage=${ref##*/}
  stage=${stage%%:*}
  images+=("$stage=$ref")
done
images+=("kube-router=podha.io/kind/kube-router:v$(version_of KUBE_ROUTER_VERSION)")
images+=("local-path-provisioner=podha.io/kind/local-path-provisioner:v$(version_of LOCAL_PATH_PROVISIONER_VERSION)")
images+=("debian=podha.io/kind/debian:bookworm")
dockerfile=e2e/kind/node-image/Dockerfile
for spec in "${images[@]}"; do
  stage=${spec%%=*}
  ref=${spec#*=}
  grep -q "^FROM .* AS $stage\$" "$dockerfile" || fail "$dockerfile has no stage for $ref"
  docker_build "$ref" --quiet --file "$dockerfile" --target "$stage" . >/dev/null
  "$docker" save --output "$dist/images/$stage.tar" "$ref"
  echo "built $ref"
done

# The node, then its containerd's images: imported into a container of it, which is committed.
docker_build "$image-unloaded" --quiet --file "$dockerfile" --target node . >/dev/null
loader=podha-kind-node-build
"$docker" rm -f "$loader" >/dev/null 2>&1 || true
"$docker" run --detach --name "$loader" --privileged --entrypoint /usr/bin/containerd --stop-signal SIGTERM \
  --volume "$PWD/$dist/images:/images:ro" "$image-unloaded" >/dev/null
trap '"$docker" rm -f "$loader" >/dev/null 2>&1 || true; docker_engine_stop' EXIT
for _ in $(seq 60); do
  "$docker" exec "$loader" ctr version >/dev/null 2>&1 && break
  sleep 0.5
done
for spec in "${images[@]}"; do
  stage=${spec%%=*}
  "$docker" exec "$loader" ctr --namespace k8s.io images import --all-platforms --no-unpack \
    --digests "/images/$stage.tar" >/dev/null
done
have=$("$docker" exec "$loader" ctr --namespace k8s.io images list --quiet)
for spec in "${images[@]}"; do
  grep -qx "${spec#*=}" <<<"$have" || fail "${spec#*=} is not in the node's containerd after the import"
done
"$docker" stop --time 10 "$loader" >/dev/null
"$docker" commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' "$loader" "$image" >/dev/null
"$docker" rm -f "$loader" >/dev/null
"$docker" image rm "$image-unloaded" >/dev/null
echo "$image: Kubernetes $k8s, with ${#images[@]} images preloaded"
