#!/bin/sh
# resources/linux/stock.sh OUTDIR [LINUXDIR]: Debian's current 6.1 kernel as
# a user has it, for lwpvmm's distribution-kernel runs (docs/linux-guest.md,
# "A distribution kernel on these hosts"): OUTDIR/vmlinuz is the package's
# bzImage, unchanged; OUTDIR/lwpvmm.ko the guest module built against the
# package's headers; OUTDIR/initramfs.cpio the self-test's programs from
# LINUXDIR (build.sh's OUTDIR, default target/tmp/linux) with that module and
# the package's modules for the drivers Debian builds as modules and ours
# builds in: cpuid.ko and msr.ko (the self-test reads CPUID and the MSRs
# through them) and virtio-mmio's block stack (a --disk is /dev/vda), as
# the package ships them.
# Cached by the package's version: a second run with the same one only
# repacks the initramfs.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?usage: stock.sh OUTDIR [LINUXDIR]}
LINUX=${2:-$HERE/../../target/tmp/linux}
log() { echo "lwpvmm stock kernel: $*" >&2; }

[ -x "$LINUX/gen_init_cpio" ] && [ -f "$LINUX/initramfs.list" ] || {
    log "no Linux guest build in $LINUX: run resources/linux/build.sh $LINUX first"; exit 1; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# The package linux-image-amd64 points at: the current 6.1 kernel.
PKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-6\.1/ { print $2; exit }')
[ -n "$PKG" ] || { log "apt-cache names no linux-image-6.1.*-amd64 (run apt-get update)"; exit 1; }
ABI=${PKG#linux-image-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PACKAGE_MODULES="arch/x86/kernel/cpuid arch/x86/kernel/msr drivers/virtio/virtio_ring
    drivers/virtio/virtio drivers/virtio/virtio_mmio drivers/block/virtio_blk"
cached() {
    [ "$(cat "$OUT/abi" 2>/dev/null)" = "$ABI" ] && [ -f "$OUT/vmlinuz" ] && [ -f "$OUT/lwpvmm.ko" ] || return 1
    for m in $PACKAGE_MODULES; do [ -f "$OUT/${m##*/}.ko" ] || return 1; done
}
if ! cached; then
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    log "fetching $PKG"
    (cd "$WORK" && apt-get download "$PKG" >/dev/null 2>&1) || { log "apt-get download $PKG failed"; exit 1; }
    dpkg-deb -x "$WORK"/"$PKG"_*.deb "$WORK/pkg"
    cp "$WORK/pkg/boot/vmlinuz-$ABI" "$OUT/vmlinuz"
    for m in $PACKAGE_MODULES; do
        cp "$WORK/pkg/lib/modules/$ABI/kernel/$m.ko" "$OUT/${m##*/}.ko"
    done
    KDIR=/usr/src/linux-headers-$ABI
    if [ ! -d "$KDIR" ]; then
        log "installing linux-headers-$ABI"
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq "linux-headers-$ABI" >/dev/null
    fi
    cp "$HERE"/module/* "$WORK"/
    make -s -C "$KDIR" M="$WORK" modules >"$OUT/module.log" 2>&1 || {
        cat "$OUT/module.log" >&2; log "the module did not build against $KDIR"; exit 1; }
    cp "$WORK/lwpvmm.ko" "$OUT/lwpvmm.ko"
    echo "$ABI" >"$OUT/abi"
fi
# The Linux guest's initramfs, its module swapped for this kernel's.
sed "s#^file /lwpvmm.ko .*#file /lwpvmm.ko $OUT/lwpvmm.ko 0644 0 0#" "$LINUX/initramfs.list" >"$OUT/initramfs.list"
for m in $PACKAGE_MODULES; do
    echo "file /${m##*/}.ko $OUT/${m##*/}.ko 0644 0 0" >>"$OUT/initramfs.list"
done
"$LINUX/gen_init_cpio" "$OUT/initramfs.list" >"$OUT/initramfs.cpio"
log "wrote $OUT/vmlinuz ($ABI) and $OUT/initramfs.cpio"
