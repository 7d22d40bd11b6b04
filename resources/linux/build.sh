#!/bin/sh
# Builds lwpvmm's Linux guest: OUTDIR/vmlinux from Debian's linux-source-6.1
# with lwpvmm.config on top of tinyconfig and the host-quirk patches in
# patches/, the guest module OUTDIR/lwpvmm.ko (module/) built against that
# tree, and OUTDIR/initramfs.cpio holding the LWP self-test as /init (which
# loads the module).
#
# The kernel and module are cached in OUTDIR keyed by a hash of the source
# package version, this script, the config fragment, the patches and the
# module's source: a second run only rebuilds the (tiny) initramfs.
# LWPVMM_KEEP_TREE=1 keeps the kernel tree (OUTDIR/linux-source-6.1) for
# rebuilding the module by hand. module-on-debian.sh builds the same module
# against Debian's own kernel headers. docs/linux-guest.md explains every part.
set -eu

usage() { echo "usage: $0 OUTDIR" >&2; exit 2; }
[ $# -eq 1 ] || usage
OUT=$1
HERE=$(cd "$(dirname "$0")" && pwd)
TARBALL=/usr/src/linux-source-6.1.tar.xz
JOBS=$(nproc 2>/dev/null || echo 2)
# A reproducible kernel: the same sources and configuration give the same
# bytes, also when switching the bzImage's compression relinks vmlinux.
export KBUILD_BUILD_TIMESTAMP="Thu Jan  1 00:00:00 UTC 2026"
export KBUILD_BUILD_VERSION=1 KBUILD_BUILD_USER=lwpvmm KBUILD_BUILD_HOST=lwpvmm

log() { echo "lwpvmm linux: $*" >&2; }

need_packages() {
    missing=""
    [ -f "$TARBALL" ] || missing="$missing linux-source-6.1"
    # The compressors of the bzImages below, one per format the kernel's
    # build offers.
    for tool in bison:bison flex:flex bc:bc make:make gcc:gcc bzip2:bzip2 xz:xz-utils \
        lzop:lzop lz4:lz4 zstd:zstd; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || missing="$missing ${tool#*:}"
    done
    [ -f /usr/include/gelf.h ] || missing="$missing libelf-dev"
    [ -f /usr/include/openssl/ssl.h ] || missing="$missing libssl-dev"
    # 32-bit programs need gcc-multilib: its libgcc (under /32/; without it
    # gcc names the 64-bit one) and the kernel headers for -m32.
    case "$(gcc -m32 -print-libgcc-file-name 2>/dev/null)" in
    */32/*) printf '#include <linux/types.h>\n' | gcc -m32 -E -x c - >/dev/null 2>&1 ||
        missing="$missing gcc-multilib" ;;
    *) missing="$missing gcc-multilib" ;;
    esac
    command -v mke2fs >/dev/null 2>&1 || missing="$missing e2fsprogs"
    [ -z "$missing" ] && return 0
    log "installing$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    # Waits for another apt-get's dpkg lock instead of failing at once.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq $missing >/dev/null
}

need_packages
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

VERSION=$(dpkg-query -W -f '${Version}' linux-source-6.1 2>/dev/null || echo unknown)
# The key covers the kernel's half of this script only (up to the userspace
# marker), so that changing the programs does not rebuild the kernel.
KEY=$( (echo "$VERSION"; sed '/^# ---- userspace ----/q' "$HERE/build.sh"; cat "$HERE/lwpvmm.config" "$HERE"/patches/*.patch "$HERE"/module/*) |
    sha256sum | cut -c1-16)
TREE="$OUT/linux-source-6.1"
# What the initramfs step needs from the kernel tree, kept when the 1.5 GB
# build tree is removed.
SUPPORT="$OUT/support"

if [ -f "$OUT/vmlinux" ] && [ -f "$OUT/lwpvmm.ko" ] && [ -f "$SUPPORT/gen_init_cpio.c" ] &&
    [ "$(cat "$OUT/vmlinux.key" 2>/dev/null)" = "$KEY" ]; then
    log "kernel $KEY is cached"
else
    log "building kernel $KEY (minutes the first time: docs/linux-guest.md, \"Building it\")"
    rm -rf "$TREE" "$SUPPORT" "$OUT/vmlinux" "$OUT/vmlinux.key" "$OUT/lwpvmm.ko"
    tar xf "$TARBALL" -C "$OUT"
    for p in "$HERE"/patches/*.patch; do
        log "applying $(basename "$p")"
        patch -s -p1 -d "$TREE" <"$p"
    done
    make -s -C "$TREE" ARCH=x86_64 tinyconfig >/dev/null
    "$TREE/scripts/kconfig/merge_config.sh" -m -O "$TREE" "$TREE/.config" "$HERE/lwpvmm.config" >/dev/null 2>&1
    make -s -C "$TREE" ARCH=x86_64 olddefconfig >/dev/null 2>&1
    # A fragment option that Kconfig dropped (a dependency missing in this
    # source version) would silently change the guest: refuse instead.
    grep -E '^(CONFIG_[A-Z0-9_]+=.*|# CONFIG_[A-Z0-9_]+ is not set)$' "$HERE/lwpvmm.config" |
    while read -r line; do
        case $line in
            "# "*) opt=${line#\# }; opt=${opt%% *}
                   if grep -q "^$opt=" "$TREE/.config"; then
                       log "config fragment: $opt is still set"; exit 1
                   fi ;;
            *) grep -qx "$line" "$TREE/.config" || { log "config fragment: $line did not take"; exit 1; } ;;
        esac
    done
    make -s -C "$TREE" ARCH=x86_64 -j"$JOBS" vmlinux modules_prepare
    cp "$TREE/vmlinux" "$OUT/vmlinux"
    # The same kernel as a bzImage, as a user has it in /boot: vmlinuz in
    # the configuration's compression (xz, tinyconfig's), and vmlinuz.FORMAT
    # in each other one, for lwpvmm's host-side decompression
    # (src/vmm/payload.rs). Switching the compression relinks the
    # decompressor only.
    make -s -C "$TREE" ARCH=x86_64 -j"$JOBS" bzImage
    cp "$TREE/arch/x86/boot/bzImage" "$OUT/vmlinuz"
    formats="GZIP BZIP2 LZMA XZ LZO LZ4 ZSTD"
    for format in $formats; do
        [ "$format" = XZ ] && continue
        for other in $formats; do
            "$TREE/scripts/config" --file "$TREE/.config" --disable "KERNEL_$other"
        done
        "$TREE/scripts/config" --file "$TREE/.config" --enable "KERNEL_$format"
        make -s -C "$TREE" ARCH=x86_64 olddefconfig >/dev/null 2>&1
        grep -qx "CONFIG_KERNEL_$format=y" "$TREE/.config" || { log "CONFIG_KERNEL_$format did not take"; exit 1; }
        make -s -C "$TREE" ARCH=x86_64 -j"$JOBS" bzImage
        cp "$TREE/arch/x86/boot/bzImage" "$OUT/vmlinuz.$(echo "$format" | tr 'A-Z' 'a-z')"
    done
    for other in $formats; do
        "$TREE/scripts/config" --file "$TREE/.config" --disable "KERNEL_$other"
    done
    "$TREE/scripts/config" --file "$TREE/.config" --enable KERNEL_XZ
    make -s -C "$TREE" ARCH=x86_64 olddefconfig >/dev/null 2>&1
    # The module, out of tree as a user builds it on their own kernel. The
    # vmlinux half of the symbol versions is all it links against (KVM=m
    # is never built).
    cp "$TREE/vmlinux.symvers" "$TREE/Module.symvers"
    rm -rf "$OUT/module"
    cp -r "$HERE/module" "$OUT/module"
    make -s -C "$TREE" ARCH=x86_64 M="$OUT/module" modules 2>&1 | tee "$OUT/module.log" >&2
    if grep -qi "warning" "$OUT/module.log"; then
        log "the module built with warnings (module.log)"; exit 1
    fi
    cp "$OUT/module/lwpvmm.ko" "$OUT/lwpvmm.ko"
    mkdir -p "$SUPPORT"
    cp -r "$TREE/tools/include/nolibc" "$SUPPORT/nolibc"
    cp "$TREE/usr/gen_init_cpio.c" "$SUPPORT/gen_init_cpio.c"
    [ "${LWPVMM_KEEP_TREE:-0}" = 1 ] || rm -rf "$TREE"
    echo "$KEY" >"$OUT/vmlinux.key"
fi

# ---- userspace ----
# The initramfs: always rebuilt, it takes a second. Static programs on the
# kernel's nolibc, without AVX (kvm_pvm does not preserve it across guest
# processes); the LWP programs use gcc's -mlwp intrinsics. Frame pointers
# let the host-side trace unwind their stacks.
mkdir -p "$OUT/bin"
cat >"$OUT/initramfs.list" <<LIST
dir /dev 0755 0 0
nod /dev/console 0600 0 0 c 5 1
nod /dev/zero 0666 0 0 c 1 5
dir /proc 0755 0 0
LIST
# Every init/*.c is a program: selftest.c becomes /init, the others /NAME;
# *-m32.c are 32-bit programs (gcc-multilib).
for src in "$HERE"/init/*.c; do
    prog=$(basename "$src" .c)
    bits=-m64
    case $prog in *-m32) bits=-m32 ;; esac
    gcc $bits -static -nostdlib -fno-stack-protector -fno-asynchronous-unwind-tables \
        -fno-omit-frame-pointer -O2 -Wall -Werror -mlwp -mno-avx -mno-avx2 -mno-avx512f \
        -I "$SUPPORT/nolibc" -include nolibc.h \
        -o "$OUT/bin/$prog" "$src" -lgcc
    name=/$prog
    [ "$prog" = selftest ] && name=/init
    echo "file $name $OUT/bin/$prog 0755 0 0" >>"$OUT/initramfs.list"
done
echo "file /lwpvmm.ko $OUT/lwpvmm.ko 0644 0 0" >>"$OUT/initramfs.list"
gcc -O2 -o "$OUT/gen_init_cpio" "$SUPPORT/gen_init_cpio.c"
"$OUT/gen_init_cpio" "$OUT/initramfs.list" >"$OUT/initramfs.cpio"

# The root file system image: what the initramfs holds, as ext4, built
# without root by mke2fs -d. /dev is empty (the kernel mounts devtmpfs on
# it: CONFIG_DEVTMPFS_MOUNT), /proc a mount point.
ROOT="$OUT/rootfs"
rm -rf "$ROOT" "$OUT/rootfs.ext4"
mkdir -p "$ROOT/dev" "$ROOT/proc"
for src in "$HERE"/init/*.c; do
    prog=$(basename "$src" .c)
    name=$prog
    [ "$prog" = selftest ] && name=init
    cp "$OUT/bin/$prog" "$ROOT/$name"
done
cp "$OUT/lwpvmm.ko" "$ROOT/lwpvmm.ko"
mke2fs -q -F -t ext4 -L lwpvmm-root -E root_owner=0:0 -d "$ROOT" "$OUT/rootfs.ext4" 32M
log "wrote $OUT/vmlinux, $OUT/initramfs.cpio and $OUT/rootfs.ext4"
