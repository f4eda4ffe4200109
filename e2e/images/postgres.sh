#!/usr/bin/env bash
# Builds the PostgreSQL image the sim's real nodes run as a workload: Debian bookworm's own
# postgresql-15 package, by mmdebstrap (e2e/tools/debian-rootfs.sh), imported into the project's
# Docker engine (e2e/tools/docker-engine.sh) as one layer, checked, and saved (`docker save`) as
# OUT_TAR, which tests load into the nodes that run it (`podha-sim image load`, as `kind load`).
#
# What it holds: the server and its client tools (psql, pg_amcheck, pg_isready), the amcheck
# extension, bash and coreutils. Left out, to keep it small: documentation, translations, and
# the JIT (LLVM and the bitcode; the manifests run `jit=off`). No cluster is created: a pod runs
# `initdb` on its own volume. PATH names the server's directory.
#
# Usage: postgres.sh OUT_TAR IMAGE     (run from the repository's root, as root)
set -euo pipefail

usage="usage: postgres.sh OUT_TAR IMAGE"
out=${1:?$usage}
image=${2:?$usage}
me=e2e/images/postgres.sh
fail() { echo "$me: $*" >&2; exit 1; }
[ -f e2e/tools/debian-rootfs.sh ] || fail "run from the repository's root"
[[ "$image" == *:* ]] || fail "'$image' is not NAME:TAG"
cache=${PODHA_CACHE:-$HOME/.cache/podha}
bin=/usr/lib/postgresql/15/bin
mkdir -p "$cache"

# shellcheck source=e2e/tools/debian-rootfs.sh
. e2e/tools/debian-rootfs.sh
debian_rootfs "$me" postgres postgresql-15 > "$cache/postgres-rootfs" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/i18n/*' \
  --customize-hook='chroot "$1" pg_dropcluster 15 main' \
  --customize-hook='rm -rf "$1"/usr/lib/postgresql/15/lib/llvmjit* "$1"/usr/lib/postgresql/15/lib/bitcode "$1"/usr/lib/x86_64-linux-gnu/libLLVM-* "$1"/usr/lib/x86_64-linux-gnu/libz3.so*' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  || fail "the root filesystem: mmdebstrap failed"
rootfs=$(cat "$cache/postgres-rootfs")

# shellcheck source=e2e/tools/docker-engine.sh
. e2e/tools/docker-engine.sh
docker_engine "$me"
arch=$("$docker" version --format '{{.Server.Arch}}')
"$docker" import --change "ENV PATH=$bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change 'ENV LANG=C.UTF-8' "$rootfs" "$image" >/dev/null
docker_want "$image" '{{.Os}}/{{.Architecture}}' "linux/$arch"
docker_want "$image" '{{len .RootFS.Layers}}' '1'
# The tools the manifests and the checks run, from PATH, as the postgres user the server runs as.
version=$("$docker" run --rm --network none --user postgres "$image" \
  bash -c 'postgres --version && initdb --version && psql --version && pg_amcheck --version && pg_isready --version && setpriv --version >/dev/null && timeout --version >/dev/null && ls "$(pg_config --sharedir 2>/dev/null || echo /usr/share/postgresql/15)/extension/amcheck.control"') \
  || fail "$image does not run the PostgreSQL tools: $version"
grep -q '^postgres (PostgreSQL) 15\.' <<<"$version" || fail "$image runs: $version"
mkdir -p "$(dirname "$out")"
"$docker" save --output "$out.part" "$image"
mv "$out.part" "$out"
echo "$out: $image ($(head -1 <<<"$version"), $(du -m "$out" | cut -f1) MB)"
