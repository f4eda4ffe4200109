# Kubernetes commands and etcd built from their Go modules; sourced by e2e/k8s/build.sh,
# e2e/k8s/build-node.sh and e2e/kind/node-image/build-components.sh. Only the Go module proxy is
# needed.

# k8s_build VERSION SRC_DIR NAME OUT_DIR CMD...: builds k8s.io/kubernetes/cmd/<CMD> for each CMD
# at Kubernetes VERSION into OUT_DIR, stamped with its version as Kubernetes' own builds are.
# They are built in SRC_DIR/NAME, a module that requires k8s.io/kubernetes and replaces each
# staging module (required there at v0.0.0) with its published v0.x twin. SRC_DIR/kubernetes.json
# describes the downloaded k8s.io/kubernetes module (its "Dir" holds Kubernetes' sources).
k8s_build() {
  local k8s=$1 src=$2 name=$3 out=$4 kmod major minor ldflags pkg cmd
  shift 4
  mkdir -p "$src/$name" "$out"
  ( cd "$src" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$k8s" ) > "$src/kubernetes.json"
  kmod=$(sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p' "$src/kubernetes.json")
  [ -f "$kmod" ] || { echo "could not fetch k8s.io/kubernetes@v$k8s from the Go module proxy" >&2; return 1; }
  {
    printf 'module podha.io/build/%s\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$name" "$k8s"
    grep -E '^\s*k8s.io/[^ ]+ v0\.0\.0\s*$' "$kmod" | awk '{print $1}' | sort -u \
      | while read -r m; do printf '\t%s => %s v0.%s\n' "$m" "$m" "${k8s#1.}"; done
    printf ')\n'
  } > "$src/$name/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for cmd in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
    printf ')\n'
  } > "$src/$name/tools.go"
  ( cd "$src/$name" && GOFLAGS=-mod=mod go mod tidy )
  major=${k8s%%.*}
  minor=${k8s#*.}; minor=${minor%%.*}
  ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v$k8s -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "building $* v$k8s (this takes a while on a small machine)"
  ( cd "$src/$name" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w $ldflags" -o "$out/" \
      "${@/#/k8s.io/kubernetes/cmd/}" )
}

# etcd_build VERSION SRC_DIR OUT_FILE: etcd VERSION, a tiny main around the server's own entry
# point, in a module of its own in SRC_DIR.
etcd_build() {
  local etcd=$1 src=$2 out=$3
  mkdir -p "$src"
  printf 'module podha.io/build/etcd\n\ngo 1.24.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$etcd" > "$src/go.mod"
  cat > "$src/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  echo "building etcd v$etcd"
  ( cd "$src" && GOFLAGS=-mod=mod go mod tidy && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out" . )
}
