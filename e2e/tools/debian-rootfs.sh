# Root filesystems from Debian bookworm's packages, by mmdebstrap (installed when missing, as
# root), cached under $PODHA_CACHE/kind-rootfs by their package list and options; sourced by
# e2e/kind/node-image/build.sh and e2e/images/postgres.sh.
#
# debian_rootfs ME NAME PACKAGES [mmdebstrap options...] prints the tar's path; ME is the calling
# script, for messages. Call it outside a command substitution (a failure there would not stop
# the script): `debian_rootfs me node "$packages" > "$file"`.

debian_rootfs() {
  local me=$1 name=$2 packages=$3 cache=${PODHA_CACHE:-$HOME/.cache/podha} key tar
  shift 3
  command -v mmdebstrap >/dev/null || {
    [ "$(id -u)" = 0 ] || { echo "$me: mmdebstrap is missing (apt-get install mmdebstrap, as root)" >&2; return 1; }
    apt-get -o DPkg::Lock::Timeout=600 update >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends mmdebstrap >&2
  }
  key=$(printf '%s\n' "$packages" "$@" | sha256sum | cut -c1-12)
  tar=$cache/kind-rootfs/$name-bookworm-$key.tar
  if [ ! -f "$tar" ]; then
    mkdir -p "$cache/kind-rootfs"
    echo "building the $name root filesystem (Debian bookworm: $packages)" >&2
    rm -f "$tar.part"
    mmdebstrap --quiet --format=tar --variant=minbase --include="$packages" "$@" bookworm "$tar.part" >&2 \
      && mv "$tar.part" "$tar" || return 1
  fi
  echo "$tar"
}
