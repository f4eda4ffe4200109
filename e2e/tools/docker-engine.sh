# A Docker client and engine for the project's image builds, and the checks the builds share;
# sourced by e2e/tools/podha-image.sh, e2e/images/build.sh and e2e/kind/node-image/build.sh.
# After `docker_engine`, "$docker" is a client that builds with
# BuildKit, DOCKER_HOST points at an engine that answers, and an engine started here is
# stopped when the sourcing script exits (its EXIT trap: a caller must not set one of its own).
# One build at a time holds the engine (a lock under the cache, kept until the script exits):
# `make -j` running two builds must not have one stop the engine under the other.
#
# Debian's docker.io is installed when no Docker client can build (root, as in CI). When no
# Docker engine answers on $PODHA_DOCKER_HOST (default unix:///run/podha-docker.sock), a dockerd
# of the project's own is started: its data under $PODHA_CACHE/docker, and neither iptables rules
# nor a bridge (--iptables=false --ip-masq=false --bridge=none). A build needs no network, and
# Docker's rules would set the FORWARD policy to DROP, cutting the sim bridge's traffic between
# real nodes. Point PODHA_DOCKER_HOST at an engine of your own to use it instead.
# A caller with an EXIT trap of its own calls `docker_engine_stop` from it.

export DOCKER_HOST=${PODHA_DOCKER_HOST:-unix:///run/podha-docker.sock}
export DOCKER_BUILDKIT=1

# A client that builds with BuildKit: one with the buildx plugin (Docker >= 23), else Debian's
# 20.10 client, which has BuildKit built in (DOCKER_BUILDKIT=1).
docker_client() {
  if command -v docker >/dev/null && docker buildx version >/dev/null 2>&1; then
    command -v docker
  elif [ -x /usr/bin/docker ] && /usr/bin/docker --version | grep -q "version 20\."; then
    echo /usr/bin/docker
  fi
}

# docker_engine NAME: NAME is the calling script, for messages.
docker_engine() {
  local me=$1 cache=${PODHA_CACHE:-$HOME/.cache/podha} dockerd_exe log
  docker_me=$me
  mkdir -p "$cache/docker"
  exec 9>"$cache/docker/build.lock"
  flock --wait 900 9 || { echo "$me: another image build has held the Docker engine for 15 minutes ($cache/docker/build.lock)" >&2; exit 1; }
  docker=$(docker_client)
  if [ -z "$docker" ]; then
    [ "$(id -u)" = 0 ] || { echo "$me: no Docker client that builds with BuildKit: install Docker >= 23 with buildx, or Debian's docker.io (as root: apt-get install docker.io)" >&2; exit 1; }
    apt-get -o DPkg::Lock::Timeout=600 update
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends docker.io
    # On a host run by systemd the package starts Debian's own engine, with iptables rules and
    # a bridge that would cut the sim's traffic: the builds use an engine of their own instead.
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
      systemctl disable --now docker.service docker.socket
    fi
    docker=$(docker_client)
    [ -n "$docker" ] || { echo "$me: installed docker.io, but /usr/bin/docker is not Docker 20.10 with BuildKit" >&2; exit 1; }
  fi
  "$docker" version >/dev/null 2>&1 && return 0

  [ "$(id -u)" = 0 ] || { echo "$me: no Docker engine answers on $DOCKER_HOST, and starting one needs root (or set PODHA_DOCKER_HOST)" >&2; exit 1; }
  dockerd_exe=$(command -v dockerd || true)
  [ -n "$dockerd_exe" ] || { echo "$me: no dockerd to start: install Debian's docker.io, or point PODHA_DOCKER_HOST at your engine" >&2; exit 1; }
  log="$cache/docker/dockerd.log"
  # Where this process's capability bounding set lacks some capability the kernel knows, a
  # privileged container (a kind node) fails to start: its runtime drops those (see the file).
  local runtime=() bounding last
  bounding=$((16#$(sed -n 's/^CapBnd:\s*//p' /proc/self/status)))
  last=$(cat /proc/sys/kernel/cap_last_cap)
  if [ "$bounding" != $(((1 << (last + 1)) - 1)) ]; then
    runtime=(--add-runtime "podha-runc=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/runc-in-bounds" --default-runtime podha-runc)
  fi
  "$dockerd_exe" --host "$DOCKER_HOST" --data-root "$cache/docker/data" \
    --exec-root /run/podha-docker --pidfile /run/podha-docker.pid \
    --iptables=false --ip-masq=false --bridge=none "${runtime[@]}" >"$log" 2>&1 9>&- &
  docker_engine_pid=$!
  trap docker_engine_stop EXIT
  for _ in $(seq 60); do
    "$docker" version >/dev/null 2>&1 && return 0
    kill -0 "$docker_engine_pid" 2>/dev/null || { tail -20 "$log" >&2; echo "$me: dockerd exited; see $log" >&2; exit 1; }
    sleep 0.5
  done
  tail -20 "$log" >&2
  echo "$me: dockerd did not answer within 30 s; see $log" >&2
  exit 1
}

# docker_engine_stop: stops the engine `docker_engine` started, if it started one.
docker_engine_stop() {
  [ -n "${docker_engine_pid:-}" ] || return 0
  kill "$docker_engine_pid" 2>/dev/null || true
  wait "$docker_engine_pid" 2>/dev/null || true
}

# docker_build IMAGE BUILD_ARGS...: `docker build --tag IMAGE BUILD_ARGS...`, then a check that
# the tag names what this build made (a builder that does not load its result into the engine
# would leave an older image under the tag).
docker_build() {
  local image=$1 iid built
  shift
  iid=$(mktemp)
  "$docker" build --tag "$image" --iidfile "$iid" "$@"
  built=$(cat "$iid")
  rm -f "$iid"
  [ "$("$docker" image inspect --format '{{.Id}}' "$image")" = "$built" ] \
    || { echo "$docker_me: $image is not the image just built (does the builder load its result into the engine?)" >&2; exit 1; }
}

# docker_want IMAGE FORMAT VALUE: `docker image inspect --format FORMAT IMAGE` says VALUE.
docker_want() {
  local got
  got=$("$docker" image inspect --format "$2" "$1")
  [ "$got" = "$3" ] || { echo "$docker_me: $1: $2 is '$got', not '$3'" >&2; exit 1; }
}
