#!/bin/sh
# Makes sure the local Docker image $1 exists: a rootfs with Debian's
# busybox-static (/bin/busybox), imported with `docker import`, since
# images cannot be pulled everywhere. Used by the container tests and the
# soak benchmark. Exits 0 when the image is there; otherwise prints why on
# one line and exits 1.
set -eu
image=${1:?usage: busybox-image.sh IMAGE}
if ! docker info >/dev/null 2>&1; then
    echo "the Docker daemon does not answer (apt install docker.io; start dockerd)"
    exit 1
fi
docker image inspect "$image" >/dev/null 2>&1 && exit 0
if [ ! -x /bin/busybox ]; then
    echo "no /bin/busybox to make an image from (apt install busybox-static)"
    exit 1
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir "$root/bin"
cp /bin/busybox "$root/bin/busybox"
for applet in sh true sleep; do ln -s busybox "$root/bin/$applet"; done
if ! tar -C "$root" -c . | docker import - "$image" >/dev/null; then
    echo "docker import of a busybox rootfs failed"
    exit 1
fi
