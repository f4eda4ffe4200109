#!/usr/bin/env bash
# Builds prometheus and promtool from the Prometheus Go module into a cache directory keyed by
# version. Prometheus 3.x.y is the module version v0.3xx.y (github.com/prometheus/prometheus).
# Only the Go module proxy is needed. The web UI's assets are not built in (that needs npm and
# the `builtinassets` tag): the tests use the HTTP API, which works without them.
# Usage: build-prometheus.sh OUT_DIR   (OUT_DIR/bin/{prometheus,promtool}; a complete OUT_DIR is left alone)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-prometheus.sh OUT_DIR}
version=$(sed -n 's/^PROMETHEUS_VERSION := //p' "$here/../versions.mk")
[[ "$version" =~ ^3\.([0-9]+)\.([0-9]+)$ ]] \
  || { echo "build-prometheus.sh: PROMETHEUS_VERSION in e2e/versions.mk must be 3.<minor>.<patch>, not '$version'" >&2; exit 1; }
module_version=$(printf 'v0.3%02d.%s' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}")
if [ -x "$out/bin/prometheus" ] && [ -x "$out/bin/promtool" ]; then
  echo "prometheus $version already built in $out/bin"
  exit 0
fi
mkdir -p "$out/bin"
# What `prometheus --version` says, as the release build sets it (prometheus/common/version).
v=github.com/prometheus/common/version
ldflags="-X $v.Version=$version -X $v.Revision=$module_version -X $v.Branch=module -X $v.BuildUser=podha -X $v.BuildDate=module"
# remove_all_sd: no service discovery but file and HTTP (Prometheus' own build tag). The tests
# scrape static targets; the cloud SDKs would triple the build.
GOBIN="$out/bin" go install -tags remove_all_sd -ldflags "$ldflags" \
  "github.com/prometheus/prometheus/cmd/prometheus@$module_version" \
  "github.com/prometheus/prometheus/cmd/promtool@$module_version"
"$out/bin/prometheus" --version | head -1
"$out/bin/promtool" --version | head -1
