#!/usr/bin/env bash
# Build the e2e control plane (kube-apiserver, kube-scheduler, kube-controller-manager,
# etcd) and the kubectl of the same release from Go modules.
#
# Usage: bash tests/e2e/controlplane/build.sh [--force]
#
# Binaries land in $FAIRGATE_CP_CACHE/bin (default ~/.cache/fairgate-controlplane/bin).
# The build is skipped when a previous build used the same go.mod, go.sum, Go sources,
# this script and Go toolchain. Needs Go 1.26+ (PATH or /usr/local/go/bin) and the Go
# module proxy. Exits non-zero with a message on stderr when anything fails.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${FAIRGATE_CP_CACHE:-$HOME/.cache/fairgate-controlplane}
bin="$cache/bin"
binaries=(kube-apiserver kube-scheduler kube-controller-manager etcd kubectl)
force=0
[[ ${1:-} == --force ]] && force=1

say() { printf '[controlplane %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { printf '[controlplane] BUILD FAILED: %s\n' "$*" >&2; exit 1; }

export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || fail "no 'go' on PATH or in /usr/local/go/bin; install Go 1.26 or newer"
go_version=$(go env GOVERSION)
[[ $go_version =~ ^go1\.([0-9]+) ]] && (( BASH_REMATCH[1] >= 26 )) ||
  fail "$go_version is too old: the control plane module needs Go 1.26 or newer"

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time; a second caller waits, then finds the stamp fresh

stamp=$(cd "$here" && {
  echo "$go_version"
  cat go.mod go.sum build.sh
  find cmd -name '*.go' -print0 | sort -z | xargs -0 cat
} | sha256sum | cut -d' ' -f1)

up_to_date=1
[[ -f $cache/stamp && $(cat "$cache/stamp") == "$stamp" ]] || up_to_date=0
for b in "${binaries[@]}"; do [[ -x $bin/$b ]] || up_to_date=0; done
if (( up_to_date && !force )); then
  say "up to date in $bin (stamp ${stamp:0:12})"
  exit 0
fi

say "cold build of ${binaries[*]} into $bin: about 5 min on 2 cores with Go's build cache" \
  "empty, up to 20 min on a busy machine; cached afterwards (stamp ${stamp:0:12})"
cd "$here"
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes) ||
  fail "cannot resolve k8s.io/kubernetes from go.mod (is the module proxy reachable?)"
k8s_time=$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
[[ $k8s_version =~ ^v([0-9]+)\.([0-9]+)\. ]] || fail "unexpected k8s.io/kubernetes version $k8s_version"
major=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$k8s_time"
done

export GOFLAGS="-trimpath -buildvcs=false" CGO_ENABLED=0
out=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$out"' EXIT

say "downloading modules for k8s.io/kubernetes $k8s_version (cache: $(go env GOMODCACHE))"
go mod download || fail "go mod download failed (see the error above; is the module proxy reachable?)"

started=$SECONDS
build() {  # name, package
  say "building $1 ($2) ..."
  local t=$SECONDS
  go build -p 2 -ldflags "$ldflags" -o "$out/$1" "$2" || fail "go build of $1 ($2) failed"
  say "built $1 in $((SECONDS - t))s"
}
build etcd ./cmd/etcd
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kubectl k8s.io/kubernetes/cmd/kubectl

mkdir -p "$bin"
for b in "${binaries[@]}"; do mv -f "$out/$b" "$bin/$b"; done
echo "$stamp" >"$cache/stamp"
say "done in $((SECONDS - started))s: $("$bin/kube-apiserver" --version), etcd $("$bin/etcd" --version | head -1)"
