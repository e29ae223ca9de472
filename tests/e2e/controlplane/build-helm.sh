#!/usr/bin/env bash
# Build helm (the Helm 3 CLI) from Go modules, for the chart's tests (charts/fairgate).
#
# Usage: bash tests/e2e/controlplane/build-helm.sh [--force]
#
# The binary lands in $FAIRGATE_CP_CACHE/helm/helm (default
# ~/.cache/fairgate-controlplane/helm/helm). The build is skipped when a previous build
# used the same helm version, this script and Go toolchain. Needs Go 1.26+ (PATH or
# /usr/local/go/bin) and the Go module proxy; `go install` checks the module against the
# Go checksum database. Exits non-zero with a message on stderr when anything fails.
set -euo pipefail

helm_module=helm.sh/helm/v3
helm_version=v3.22.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${FAIRGATE_CP_CACHE:-$HOME/.cache/fairgate-controlplane}
bin="$cache/helm"
force=0
[[ ${1:-} == --force ]] && force=1

say() { printf '[helm %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { printf '[helm] BUILD FAILED: %s\n' "$*" >&2; exit 1; }

export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || fail "no 'go' on PATH or in /usr/local/go/bin; install Go 1.26 or newer"
go_version=$(go env GOVERSION)
[[ $go_version =~ ^go1\.([0-9]+) ]] && (( BASH_REMATCH[1] >= 26 )) ||
  fail "$go_version is too old: helm $helm_version needs Go 1.26 or newer here"

mkdir -p "$cache"
exec 9>"$cache/.helm.lock"
flock 9  # one build at a time; a second caller waits, then finds the stamp fresh

stamp=$({ echo "$go_version $helm_module@$helm_version"; cat "$here/build-helm.sh"; } |
  sha256sum | cut -d' ' -f1)
if (( !force )) && [[ -x $bin/helm && -f $bin/stamp && $(cat "$bin/stamp") == "$stamp" ]]; then
  say "up to date: $bin/helm (stamp ${stamp:0:12})"
  exit 0
fi

say "cold build of helm $helm_version into $bin: about 5-7 min on 2 busy cores with Go's" \
  "build cache empty (downloads included); cached afterwards (stamp ${stamp:0:12})"
started=$SECONDS
out=$(mktemp -d "$cache/helm-build.XXXXXX")
trap 'rm -rf "$out"' EXIT
# helm's own Makefile stamps the same: its version, and as the Kubernetes version that
# `helm template` and `helm lint` assume without a cluster, the one of its client-go
# (v0.X.Y is Kubernetes 1.X), not the v1.20 compiled in.
helm_gomod=$(go mod download -json "$helm_module@$helm_version" |
  sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -f $helm_gomod ]] || fail "cannot download $helm_module@$helm_version (is the module proxy reachable?)"
client_go=$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$helm_gomod")
[[ $client_go =~ ^v0\.([0-9]+)\. ]] || fail "unexpected k8s.io/client-go version '$client_go' in helm's go.mod"
k8s_minor=${BASH_REMATCH[1]}
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
GOBIN="$out" CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" \
  go install -p 2 -ldflags "$ldflags" "$helm_module/cmd/helm@$helm_version" ||
  fail "go install $helm_module/cmd/helm@$helm_version failed (see above; is the module proxy reachable?)"
mkdir -p "$bin"
mv -f "$out/helm" "$bin/helm"
echo "$stamp" >"$bin/stamp"
say "done in $((SECONDS - started))s: $("$bin/helm" version --short), Kubernetes 1.$k8s_minor by default"
