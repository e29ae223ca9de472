#!/usr/bin/env bash
# Build the Kueue manager (the peer bench/peer_kueue.py compares fairgate with) from Go
# modules, and keep its CRDs and manager config beside it.
#
# Usage: bash tests/e2e/controlplane/build_kueue.sh [--force | --config-only]
#
# `go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION` into $FAIRGATE_CP_CACHE/kueue/bin
# (default ~/.cache/fairgate-controlplane/kueue/bin); the module's config/components/
# (CRDs, webhook and RBAC manifests) is copied to $FAIRGATE_CP_CACHE/kueue/config. Skipped
# when the Go toolchain, the version and this script are unchanged. Needs Go 1.26+ and
# the Go module proxy. A cold build takes about 18 min on 2 busy cores (BENCHMARKS.md),
# which is why only the peer benchmark and `python -m pytest -m peer` run it.
# --config-only: download the module (no build, seconds) and copy only its config/, for
# the tests of the harness's manifests.
set -euo pipefail

version=${KUEUE_VERSION:-v0.17.0}
cache=${FAIRGATE_CP_CACHE:-$HOME/.cache/fairgate-controlplane}
dest="$cache/kueue"
force=0 config_only=0
[[ ${1:-} == --force ]] && force=1
[[ ${1:-} == --config-only ]] && config_only=1

say() { printf '[kueue %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { printf '[kueue] BUILD FAILED: %s\n' "$*" >&2; exit 1; }

export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || fail "no 'go' on PATH or in /usr/local/go/bin; install Go 1.26 or newer"
go_version=$(go env GOVERSION)

mkdir -p "$dest"
exec 9>"$dest/.lock"
flock 9

stamp=$( { echo "$go_version $version"; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -d' ' -f1)
if (( !force )) && [[ -x $dest/bin/kueue && -d $dest/config/crd && -f $dest/stamp &&
      $(cat "$dest/stamp") == "$stamp" ]]; then
  say "up to date in $dest (kueue $version, stamp ${stamp:0:12})"
  exit 0
fi
export GOFLAGS="-trimpath -buildvcs=false" CGO_ENABLED=0

copy_config() {  # the module's config/components as $dest/config
  local module
  module=$(go mod download -json "sigs.k8s.io/kueue@$version" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [[ -d $module/config/components/crd ]] ||
    fail "no config/components/crd in the module sigs.k8s.io/kueue@$version ('$module'; is the module proxy reachable?)"
  rm -rf "$dest/config"
  cp -r "$module/config/components" "$dest/config"
  chmod -R u+w "$dest/config"
}

if (( config_only )); then
  copy_config
  say "config of kueue $version in $dest/config (not built)"
  exit 0
fi

say "cold build of kueue $version into $dest/bin: about 18 min on 2 busy cores (BENCHMARKS.md)"
started=$SECONDS
ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version"
tmp=$(mktemp -d "$dest/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" go install -p 2 -ldflags "$ldflags" "sigs.k8s.io/kueue/cmd/kueue@$version" ||
  fail "go install sigs.k8s.io/kueue/cmd/kueue@$version failed (see above; is the module proxy reachable?)"
mkdir -p "$dest/bin"
mv -f "$tmp/kueue" "$dest/bin/kueue"
copy_config
echo "$stamp" >"$dest/stamp"
say "done in $((SECONDS - started))s: $dest/bin/kueue"
