#!/bin/sh
# Builds the lwpvmm guest module (module/) against Debian's own 6.1 kernel
# headers, the way a user builds it for their distribution's kernel: compile
# and modpost only, and any warning fails. Installs linux-headers-amd64
# (the current linux-headers-6.1.*-amd64) when no such headers are present.
# The module built for the self-test, against our own kernel, comes from
# build.sh.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "lwpvmm module on Debian headers: $*" >&2; }

headers() {
    ls -d /usr/src/linux-headers-6.1.*-amd64 2>/dev/null | grep -v -- '-rt-\|-cloud-' | sort -V | tail -n 1
}

KDIR=$(headers || true)
if [ -z "$KDIR" ]; then
    log "installing linux-headers-amd64"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq linux-headers-amd64 >/dev/null
    KDIR=$(headers)
fi
case $KDIR in
    */linux-headers-6.1.*-amd64) ;;
    *) log "no linux-headers-6.1.*-amd64 after installing (found '$KDIR')"; exit 1 ;;
esac
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp "$HERE"/module/* "$WORK"/
log "building against $KDIR"
make -s -C "$KDIR" M="$WORK" modules >"$WORK/build.log" 2>&1 || {
    cat "$WORK/build.log" >&2; log "the build failed"; exit 1; }
cat "$WORK/build.log" >&2
if grep -i "warning" "$WORK/build.log" >/dev/null; then
    log "the build has warnings"; exit 1
fi
modinfo "$WORK/lwpvmm.ko" | grep -E '^(vermagic|license):' >&2
log "ok: lwpvmm.ko builds cleanly against $(basename "$KDIR")"
