#!/usr/bin/env bash
# Builds podha's image with Docker from the repository's Dockerfile, checks it as users will run
# it, and saves it (`docker save`) for the sim's nodes (their containerd imports it).
# Usage: docker-image.sh IMAGE OUT_TAR    (IMAGE: name:version; run from the repository's root,
#                                          with target/dist/linux-<arch>/podha built)
#
# Debian's docker.io is installed when no Docker client can build (root, as in CI). When no
# Docker engine answers on $PODHA_DOCKER_HOST (default unix:///run/podha-docker.sock), a dockerd
# of the project's own is started for the build and stopped after it: its data under $PODHA_CACHE/docker, and neither
# iptables rules nor a bridge (--iptables=false --bridge=none). A build needs no network, and
# Docker's rules would set the FORWARD policy to DROP, cutting the sim bridge's traffic between
# real nodes. Point PODHA_DOCKER_HOST at an engine of your own to use it instead.
set -euo pipefail

image=${1:?usage: docker-image.sh IMAGE OUT_TAR}
out=${2:?usage: docker-image.sh IMAGE OUT_TAR}
version=${image##*:}
cache=${PODHA_CACHE:-$HOME/.cache/podha}
export DOCKER_HOST=${PODHA_DOCKER_HOST:-unix:///run/podha-docker.sock}
fail() { echo "docker-image.sh: $*" >&2; exit 1; }

# A client that builds with BuildKit: one with the buildx plugin (Docker >= 23), else Debian's
# 20.10 client, which has BuildKit built in (DOCKER_BUILDKIT=1). Debian's docker.io is installed
# only when there is neither.
client() {
  if command -v docker >/dev/null && docker buildx version >/dev/null 2>&1; then
    command -v docker
  elif [ -x /usr/bin/docker ] && /usr/bin/docker --version | grep -q "version 20\."; then
    echo /usr/bin/docker
  fi
}
docker=$(client)
if [ -z "$docker" ]; then
  [ "$(id -u)" = 0 ] || fail "no Docker client that builds with BuildKit: install Docker >= 23 with buildx, or Debian's docker.io (as root: apt-get install docker.io)"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io
  # On a host run by systemd the package starts Debian's own engine, with iptables rules and a
  # bridge that would cut the sim's traffic: the build uses an engine of its own instead.
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now docker.service docker.socket
  fi
  docker=$(client)
  [ -n "$docker" ] || fail "installed docker.io, but /usr/bin/docker is not Docker 20.10 with BuildKit"
fi

if ! "$docker" version >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || fail "no Docker engine answers on $DOCKER_HOST, and starting one needs root (or set PODHA_DOCKER_HOST)"
  dockerd_exe=$(command -v dockerd || true)
  [ -n "$dockerd_exe" ] || fail "no dockerd to start: install Debian's docker.io, or point PODHA_DOCKER_HOST at your engine"
  mkdir -p "$cache/docker"
  log="$cache/docker/dockerd.log"
  "$dockerd_exe" --host "$DOCKER_HOST" --data-root "$cache/docker/data" \
    --exec-root /run/podha-docker --pidfile /run/podha-docker.pid \
    --iptables=false --ip-masq=false --bridge=none >"$log" 2>&1 &
  dockerd=$!
  trap 'kill "$dockerd" 2>/dev/null || true; wait "$dockerd" 2>/dev/null || true' EXIT
  for _ in $(seq 60); do
    "$docker" version >/dev/null 2>&1 && break
    kill -0 "$dockerd" 2>/dev/null || { tail -20 "$log" >&2; fail "dockerd exited; see $log"; }
    sleep 0.5
  done
  "$docker" version >/dev/null 2>&1 || { tail -20 "$log" >&2; fail "dockerd did not answer within 30 s; see $log"; }
fi

DOCKER_BUILDKIT=1 "$docker" build --tag "$image" .

# The image as users get it: it runs (no network: it needs none to say its version), as the
# numeric user the chart's runAsNonRoot checks, with the entrypoint, command, port and labels
# the chart and the docs rely on.
said=$("$docker" run --rm --network none "$image" --version)
[[ "$said" == "podha $version (commit "*", built "*")" ]] \
  || fail "\`docker run $image --version\` said '$said', not podha $version with its commit and build date"
want() {
  local got
  got=$("$docker" image inspect --format "$1" "$image")
  [ "$got" = "$2" ] || fail "$image: $1 is '$got', not '$2'"
}
want '{{.Os}}/{{.Architecture}}' "linux/$("$docker" version --format '{{.Server.Arch}}')"
want '{{.Config.User}}' '65532:65532'
want '{{json .Config.Entrypoint}}' '["/podha"]'
want '{{json .Config.Cmd}}' '["run"]'
want '{{json .Config.ExposedPorts}}' '{"8080/tcp":{}}'
want '{{index .Config.Labels "org.opencontainers.image.title"}}' 'podha'
want '{{index .Config.Labels "org.opencontainers.image.licenses"}}' 'Apache-2.0'
want '{{index .Config.Labels "org.opencontainers.image.source"}}' 'https://github.com/podha/podha'
want '{{len .RootFS.Layers}}' '1'
echo "$image: $said; user 65532:65532, entrypoint /podha run, port 8080"

mkdir -p "$(dirname "$out")"
"$docker" save --output "$out" "$image"
echo "saved $image to $out"
