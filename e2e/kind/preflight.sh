#!/usr/bin/env bash
# What `make chaos-kind` needs before it builds anything (about 15 minutes on a cold cache): a
# linux/amd64 host, a Docker engine (one that answers on $PODHA_DOCKER_HOST, or root to start the
# project's own, see e2e/tools/docker-engine.sh), Go to build kind and the node image's
# components when they are not built yet, mmdebstrap or root for the node's root filesystem,
# no kind cluster of the kit's name left from an earlier run (checked when an engine answers;
# chaos-kind.sh runs this again once its engine is up), and no sim cluster running.
# Exit 2, naming every missing piece, when one is missing.
# Usage: preflight.sh      (env: PODHA_KIND_BIN_DIR, PODHA_CACHE, as the Makefile exports them)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kind_bin=${PODHA_KIND_BIN_DIR:?run through make chaos-kind, or set PODHA_KIND_BIN_DIR}
cluster=$(sed -n 's/^name: *//p' "$here/kind-config.yaml")
missing=()

if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ]; then
  missing+=("a linux/amd64 host: this is $(uname -s)/$(uname -m), and the kit's images (podha, podha-csi, the sidecars, the node image) are built for linux/amd64 only")
fi

root=0
[ "$(id -u)" = 0 ] && root=1
# The engine the builds and the kit use (DOCKER_HOST, from $PODHA_DOCKER_HOST).
# shellcheck source=e2e/tools/docker-engine.sh
. "$here/../tools/docker-engine.sh"
if ! command -v docker >/dev/null && [ "$root" = 0 ]; then
  missing+=("a Docker client (Debian: apt-get install docker.io, as root)")
elif ! docker version >/dev/null 2>&1; then
  if [ "$root" = 0 ]; then
    missing+=("a Docker engine: none answers on $DOCKER_HOST; point PODHA_DOCKER_HOST at yours, or run as root to have the project start its own")
  elif ! command -v dockerd >/dev/null && ! command -v apt-get >/dev/null; then
    missing+=("dockerd, to start the project's Docker engine (install Docker), or PODHA_DOCKER_HOST pointing at an engine")
  fi
fi

if [ ! -x "$kind_bin/kind" ] && ! command -v go >/dev/null; then
  missing+=("Go, to build kind and the node image's components (https://go.dev/dl/)")
fi
if ! command -v mmdebstrap >/dev/null && [ "$root" = 0 ]; then
  missing+=("mmdebstrap, for the node image's Debian root filesystem (apt-get install mmdebstrap), or root to install it")
fi

if [ -x "$kind_bin/kind" ] && docker version >/dev/null 2>&1 \
  && "$kind_bin/kind" get clusters 2>/dev/null | grep -qx "$cluster"; then
  missing+=("no kind cluster named $cluster: one is left from an earlier run (delete it: DOCKER_HOST=$DOCKER_HOST $kind_bin/kind delete cluster --name $cluster)")
fi

# kind and the sim cluster never run at once on one machine: both are clusters on this kernel.
# The sim's components run as this machine's own processes (kind's run in containers, with
# another root): any Kubernetes server process whose root is this machine's is taken for one.
host_root=$(stat -L -c %d:%i /)
sim_pids=()
for pid in $(for name in kube-apiserver etcd kwok kubelet; do pgrep -x "$name"; done); do
  [ "$(stat -L -c %d:%i "/proc/$pid/root" 2>/dev/null)" = "$host_root" ] && sim_pids+=("$pid ($(cat "/proc/$pid/comm" 2>/dev/null))")
done
if [ ${#sim_pids[@]} -gt 0 ]; then
  missing+=("no sim cluster running: Kubernetes processes run on this machine itself: ${sim_pids[*]} (stop that cluster first: podha-sim down, or make sim-down)")
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "chaos-kind: cannot run here; it needs:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  echo "chaos-kind: e2e/kind/README.md says what the kit does; make chaos-sim runs podha chaos on the sim cluster instead" >&2
  exit 2
fi
echo "chaos-kind: preflight passed (Docker on $DOCKER_HOST$(docker version >/dev/null 2>&1 || echo ', started by the run'))"
