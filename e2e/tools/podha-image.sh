#!/usr/bin/env bash
# Builds podha's image with Docker from the repository's Dockerfile, checks it as users will run
# it, and saves it (`docker save`) for the sim's nodes (their containerd imports it).
# Usage: podha-image.sh IMAGE OUT_TAR    (IMAGE: name:version; run from the repository's root,
#                                         with target/dist/linux-<arch>/podha built)
# The Docker client and engine: e2e/tools/docker-engine.sh.
set -euo pipefail

image=${1:?usage: podha-image.sh IMAGE OUT_TAR}
out=${2:?usage: podha-image.sh IMAGE OUT_TAR}
version=${image##*:}
fail() { echo "podha-image.sh: $*" >&2; exit 1; }
# shellcheck source=e2e/tools/docker-engine.sh
. "$(dirname "$0")/docker-engine.sh"
docker_engine podha-image.sh

docker_build "$image" .

# The image as users get it: it runs (no network: it needs none to say its version), as the
# numeric user the chart's runAsNonRoot checks, with the entrypoint, command, port and labels
# the chart and the docs rely on.
said=$("$docker" run --rm --network none "$image" --version)
[[ "$said" == "podha $version (commit "*", built "*")" ]] \
  || fail "\`docker run $image --version\` said '$said', not podha $version with its commit and build date"
want() { docker_want "$image" "$@"; }
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
