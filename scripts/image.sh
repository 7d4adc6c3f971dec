#!/bin/sh
# Builds the wattprof image TAG from BINARY: a root filesystem holding the
# binary and the shared libraries it links (from ldd), and deploy/Dockerfile
# (FROM scratch), so nothing is pulled. Used by `cargo xtask image` (the
# release binary) and the Docker tests (the test build). Prints why on one
# line and exits 1 when it cannot.
set -eu
binary=${1:?usage: image.sh BINARY TAG}
tag=${2:?usage: image.sh BINARY TAG}
here=$(cd "$(dirname "$0")/.." && pwd)
if ! docker info >/dev/null 2>&1; then
    echo "the Docker daemon does not answer (apt install docker.io; start dockerd)"
    exit 1
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
root="$context/rootfs"
mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/etc"
chmod 1777 "$root/tmp"
cp "$binary" "$root/usr/local/bin/wattprof"
# Every library the binary links, at the path the loader looks for it.
for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
# Names for uid and gid 0; /etc/hostname
# and /etc/hosts come from Docker.
echo "root:x:0:0:root:/:/nonexistent" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
cp "$here/deploy/Dockerfile" "$context/Dockerfile"
if ! out=$(docker build -q -t "$tag" "$context" 2>&1); then
    echo "docker build failed: $(echo "$out" | tail -1)"
    exit 1
fi
