#!/usr/bin/env bash
# Build fairgate's image without Docker and without a registry: the Dockerfile's steps
# with buildah, on a Debian rootfs made with debootstrap (Debian's mirror) and the wheels
# of fairgate and its dependencies (PyPI).
#
# Usage: bash image/build.sh            (as root; Debian packages: buildah debootstrap)
#
# Result: the image localhost/fairgate:<version> in the local containers storage (run it
# with podman) and the archive $FAIRGATE_IMAGE_CACHE/fairgate-<version>.oci.tar (OCI
# layout; `podman load`, `skopeo copy oci-archive:... docker://REGISTRY/fairgate:<version>`).
# Two layers: the Debian base (cached: made once, in minutes) and fairgate in a venv.
# Like the Dockerfile's image it holds no compiler and no pip, and runs as uid/gid 65532
# with `fairgate` as its entrypoint; its Python is Debian 12's 3.11.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${FAIRGATE_IMAGE_CACHE:-$HOME/.cache/fairgate-image}
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -n 1)
image=localhost/fairgate:$version
base=localhost/fairgate-base:$suite

# Commands in the rootfs get a clean environment, not this machine's (pip settings...).
in_root() { local root=$1; shift; env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 chroot "$root" "$@"; }

say() { printf '[image %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { printf '[image] BUILD FAILED: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || fail "run as root (debootstrap and the rootfs's chroot need it)"
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || fail "no $tool: apt-get install buildah debootstrap"
done
[[ -n $version ]] || fail "no version in pyproject.toml"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# 1. The base: a minimal Debian with python3 (and venv), the Dockerfile's python:3.11-slim.
rootfs=$cache/rootfs-$suite
if [[ ! -f $rootfs.complete ]]; then
  say "making a $suite rootfs with debootstrap from $mirror: a few minutes"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$suite" "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
    fail "debootstrap failed, see $cache/debootstrap.log"
  touch "$rootfs.complete"
fi
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  say "making the base $base from $rootfs"
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  tar -C "$rootfs" -cf - --exclude=./var/lib/apt/lists --exclude=./var/cache/apt \
    --exclude=./usr/share/doc --exclude=./usr/share/man --exclude=./usr/share/locale \
    --exclude=./var/log . | tar -C "$mnt" -xf -
  mkdir -p "$mnt/var/lib/apt/lists/partial" "$mnt/var/cache/apt/archives/partial" "$mnt/var/log"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --created-by "debootstrap --variant=minbase --include=python3,python3-venv $suite" "$ctr"
  buildah commit --quiet --rm "$ctr" "$base" >/dev/null
fi
# The build context (the Dockerfile's: the tree minus .dockerignore's names) and its
# stamp: an image built from the same context, base and script is kept as it is.
context() {
  tar -C "$repo" -cf - --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --anchored \
    --exclude-from=<(sed -e '/^#/d' -e '/^$/d' -e 's#^\*\*/##' -e 's#^#./#' "$repo/.dockerignore") \
    --no-anchored --exclude=__pycache__ --exclude='*.pyc' .
}
stamp=$({ context; cat "${BASH_SOURCE[0]}"; buildah inspect --type image --format '{{.FromImageID}}' "$base"; } |
  sha256sum | cut -d' ' -f1)
if [[ $(buildah inspect --type image --format '{{index .ImageAnnotations "fairgate.build-stamp"}}' \
      "$image" 2>/dev/null) == "$stamp" ]]; then
  say "up to date: $image (stamp ${stamp:0:12})"
  exit 0
fi

# 2. The Dockerfile's builder stage, on the same base: wheels for fairgate and every
#    dependency (PyPI), so that environment markers see the base's Python.
cleanup() {
  for c in ${builder:-} ${ctr:-}; do buildah rm "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
say "building wheels for fairgate $version and its dependencies on $base (PyPI)"
builder=$(buildah from --quiet "$base")
bmnt=$(buildah mount "$builder")
mkdir -p "$bmnt/src"
context | tar -C "$bmnt/src" -xf -
cp -L /etc/resolv.conf "$bmnt/etc/resolv.conf"
# This machine's CA bundle (it may trust a proxy in front of PyPI), for the builder only:
# the final image keeps Debian's.
cp -L "${BUILD_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}" \
  "$bmnt/etc/ssl/build-ca.crt"
in_root "$bmnt" /usr/bin/python3 -m venv /opt/build
in_root "$bmnt" /bin/sh -c 'cd /src && PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
  PIP_CERT=/etc/ssl/build-ca.crt /opt/build/bin/python -m pip wheel --quiet --wheel-dir /wheels .' ||
  fail "pip wheel failed (is PyPI reachable?)"

# 3. Its final stage: install from the wheels only, drop pip, run as 65532.
say "installing into a venv on $base"
ctr=$(buildah from --quiet "$base")
mnt=$(buildah mount "$ctr")
cp -r "$bmnt/wheels" "$mnt/wheels"
buildah umount "$builder" >/dev/null
buildah rm "$builder" >/dev/null
builder=""
in_root "$mnt" /usr/bin/python3 -m venv /opt/fairgate
in_root "$mnt" /bin/sh -c 'cd / && /opt/fairgate/bin/python -m pip install --quiet --no-index \
  --no-cache-dir --disable-pip-version-check --find-links /wheels fairgate' ||
  fail "installing fairgate from its wheels failed"
in_root "$mnt" /opt/fairgate/bin/python -m pip uninstall --quiet --yes pip setuptools wheel \
  2>/dev/null || in_root "$mnt" /opt/fairgate/bin/python -m pip uninstall --quiet --yes pip
rm -rf "$mnt/wheels" "$mnt/root/.cache"
find "$mnt/opt/fairgate" -name __pycache__ -type d -prune -exec rm -rf {} +
in_root "$mnt" /opt/fairgate/bin/fairgate --help >/dev/null || fail "fairgate --help fails in the image"
buildah umount "$ctr" >/dev/null
buildah config \
  --label org.opencontainers.image.title=fairgate \
  --label "org.opencontainers.image.description=Admission webhook and weighted-fair dispatcher for shared Kubernetes GPU and MIG clusters" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label "org.opencontainers.image.version=$version" \
  --env PATH=/opt/fairgate/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
  --user 65532:65532 --workingdir /tmp --port 8443/tcp \
  --entrypoint '["fairgate"]' --cmd '["--help"]' \
  --created-by "image/build.sh: pip install --no-index fairgate $version into /opt/fairgate" \
  --annotation "fairgate.build-stamp=$stamp" \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$image" >/dev/null
ctr=""
buildah rmi --prune >/dev/null 2>&1 || true
rm -f "$cache/fairgate-$version.oci.tar"
buildah push --quiet "$image" "oci-archive:$cache/fairgate-$version.oci.tar:fairgate:$version"
say "built $image and $cache/fairgate-$version.oci.tar"
