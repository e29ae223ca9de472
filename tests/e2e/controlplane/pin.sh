#!/usr/bin/env bash
# Pin the e2e control plane to one k8s.io/kubernetes release.
#
# Usage: tests/e2e/controlplane/pin.sh v1.X.Y
#
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...)
# at v0.0.0 and replaces them with ./staging paths, which do not exist outside its
# repository. This script reads that release's own go.mod (via `go mod download -json`)
# and writes into ./go.mod a `replace` for every staging module to its published
# v0.X.Y, requires the release itself, and pins etcd's server to the version that
# release is tested with. Then `go mod tidy` fills go.sum.
set -euo pipefail
export PATH="/usr/local/go/bin:$PATH"
version=${1:?usage: pin.sh v1.X.Y (a k8s.io/kubernetes release on the module proxy)}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || {
  echo "pin.sh: '$version' is not a release tag like v1.36.3" >&2; exit 2; }
staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
cd "$(dirname "$0")"

upstream_mod=$(go mod download -json "k8s.io/kubernetes@$version" | jq -r .GoMod)
mapfile -t staging < <(go mod edit -json "$upstream_mod" |
  jq -r '.Replace[] | select(.New.Path | startswith("./staging/")) | .Old.Path')
etcd_version=$(go mod edit -json "$upstream_mod" |
  jq -r '.Require[] | select(.Path == "go.etcd.io/etcd/server/v3") | .Version')
echo "pin.sh: k8s.io/kubernetes $version, ${#staging[@]} staging modules at $staging_version, etcd $etcd_version"

# Drop every previous replace, then add the new ones.
for old in $(go mod edit -json | jq -r '(.Replace // [])[] | .Old.Path'); do
  go mod edit -dropreplace="$old"
done
args=()
for mod in "${staging[@]}"; do
  args+=("-replace=$mod=$mod@$staging_version")
done
go mod edit "${args[@]}" \
  -require="k8s.io/kubernetes@$version" \
  -require="go.etcd.io/etcd/server/v3@$etcd_version"
go mod tidy
echo "pin.sh: go.mod and go.sum updated"
