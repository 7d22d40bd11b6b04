#!/bin/sh
# Builds lwpvmm's Linux guest into OUTDIR: vmlinux from Debian's
# linux-source-6.1 with lwpvmm.config on top of tinyconfig and the
# host-quirk patches in patches/, the same kernel as a bzImage (vmlinuz,
# in tinyconfig's xz), the guest module lwpvmm.ko (module/) built against
# that tree, initramfs.cpio holding the LWP self-test as /init (which loads
# the module), and rootfs.ext4 holding the same files.
#
# --test-images adds the bzImage in each other compression the kernel's
# build offers (vmlinuz.gzip, .bzip2, .lzma, .lzo, .lz4, .zstd): only
# tests/linux.rs needs them, to check lwpvmm's host-side decompression of
# each, so tests/common and .ci/run ask for them and a user need not.
#
# The kernel and module are cached in OUTDIR keyed by a hash of the source
# package version, the kernel recipe below, the config fragment, the
# patches and the module's source: a second run only rebuilds the (tiny)
# initramfs and disk image. make's steps go to OUTDIR/build.log; the
# terminal gets each phase and, while the kernel builds, a line a minute
# with the time so far and make's latest step. LWPVMM_KEEP_TREE=1 keeps
# the kernel tree (OUTDIR/linux-source-6.1) for rebuilding the module by
# hand. module-on-debian.sh builds the same module against Debian's own
# kernel headers. docs/linux-guest.md explains every part and gives the
# build's time ("Building it").
set -eu

usage() {
    echo "usage: $0 [--test-images] OUTDIR" >&2
    echo "  --test-images  also the bzImage in every other compression (vmlinuz.FORMAT, for the tests)" >&2
    exit 2
}
TEST_IMAGES=0
while [ $# -gt 0 ]; do
    case $1 in
    --test-images) TEST_IMAGES=1; shift ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
    esac
done
[ $# -eq 1 ] || usage
OUT=$1
HERE=$(cd "$(dirname "$0")" && pwd)
TARBALL=/usr/src/linux-source-6.1.tar.xz
JOBS=$(nproc 2>/dev/null || echo 2)
# What to expect of a first build (docs/linux-guest.md, "Building it":
# 10 min 41 s on a busy 2-core host).
EXPECT="about 11 min on 2 busy cores, less on more"
# A reproducible kernel: the same sources and configuration give the same
# bytes, so a kernel built again (for the test images of a cached one) is
# the one cached.
export KBUILD_BUILD_TIMESTAMP="Thu Jan  1 00:00:00 UTC 2026"
export KBUILD_BUILD_VERSION=1 KBUILD_BUILD_USER=lwpvmm KBUILD_BUILD_HOST=lwpvmm

log() { echo "lwpvmm linux: $*" >&2; }

START=$(date +%s)
# The time since the start, as "4 min 05 s".
elapsed() {
    s=$(($(date +%s) - START))
    printf '%d min %02d s' $((s / 60)) $((s % 60))
}

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
TREE="$OUT/linux-source-6.1"
# What the initramfs step needs from the kernel tree, kept when the 1.5 GB
# build tree is removed.
SUPPORT="$OUT/support"
LOG="$OUT/build.log"

# Runs make in the kernel tree, its steps to build.log; on failure the
# log's end, where make says why, goes to the terminal.
kmake() {
    make -C "$TREE" ARCH=x86_64 "$@" >>"$LOG" 2>&1 || {
        log "make $* failed after $(elapsed); the end of $LOG:"
        tail -n 40 "$LOG" >&2
        exit 1
    }
}

# A line a minute while the kernel builds, so that no stretch of it is
# silent: the time so far and make's latest step (kbuild's "  CC  file").
# Its sleep holds none of the script's outputs, so that a caller reading
# them to their end is not kept waiting by a sleep left over.
TICKER=""
ticker_start() {
    while sleep 60 </dev/null >/dev/null 2>&1; do
        step=$(grep '^  [A-Z]' "$LOG" 2>/dev/null | tail -n 1 | tr -s ' ' | sed 's/^ //')
        log "$(elapsed) so far (a first build takes $EXPECT): ${step:-starting}"
    done &
    TICKER=$!
}
ticker_stop() {
    [ -z "$TICKER" ] || kill "$TICKER" 2>/dev/null || :
    TICKER=""
}
# A tree this run extracted goes however the script ends (1.5 GB), unless
# kept. (An EXIT trap that fails changes the script's status: this one
# cannot.)
BUILT_TREE=0
cleanup() {
    ticker_stop
    if [ "$BUILT_TREE" = 1 ] && [ "${LWPVMM_KEEP_TREE:-0}" != 1 ]; then
        rm -rf "$TREE"
    fi
}
trap cleanup EXIT

# ---- kernel recipe ----
# What makes the kernel's bytes, hashed into the cache key (up to the end
# marker): the tree, its configuration, vmlinux, vmlinuz and the module.
build_kernel() {
    rm -rf "$TREE" "$SUPPORT" "$OUT/vmlinux" "$OUT/vmlinux.key" "$OUT/vmlinuz" "$OUT"/vmlinuz.* \
        "$OUT/lwpvmm.ko"
    log "extracting $TARBALL and applying patches/"
    BUILT_TREE=1
    tar xf "$TARBALL" -C "$OUT"
    for p in "$HERE"/patches/*.patch; do
        patch -s -p1 -d "$TREE" <"$p"
    done
    log "configuring: tinyconfig and lwpvmm.config"
    kmake tinyconfig
    "$TREE/scripts/kconfig/merge_config.sh" -m -O "$TREE" "$TREE/.config" "$HERE/lwpvmm.config" >>"$LOG" 2>&1
    kmake olddefconfig
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
    log "compiling and linking vmlinux ($(elapsed) so far; make's steps: $LOG)"
    kmake -j"$JOBS" vmlinux modules_prepare
    cp "$TREE/vmlinux" "$OUT/vmlinux"
    # The same kernel as a bzImage, as a user has it in /boot, in the
    # configuration's compression (xz, tinyconfig's).
    log "the bzImage, vmlinuz ($(elapsed) so far)"
    kmake -j"$JOBS" bzImage
    cp "$TREE/arch/x86/boot/bzImage" "$OUT/vmlinuz"
    # The module, out of tree as a user builds it on their own kernel. The
    # vmlinux half of the symbol versions is all it links against (KVM=m
    # is never built).
    log "the module ($(elapsed) so far)"
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
}

# The compressions of the test images: every other one the kernel's build
# offers.
FORMATS="GZIP BZIP2 LZMA LZO LZ4 ZSTD"

# Configures the tree's bzImage compression to $1 (XZ, or one of FORMATS).
set_compression() {
    for other in $FORMATS XZ; do
        "$TREE/scripts/config" --file "$TREE/.config" --disable "KERNEL_$other"
    done
    "$TREE/scripts/config" --file "$TREE/.config" --enable "KERNEL_$1"
    kmake olddefconfig
    grep -qx "CONFIG_KERNEL_$1=y" "$TREE/.config" || { log "CONFIG_KERNEL_$1 did not take"; exit 1; }
}

# The test images, vmlinuz.FORMAT, from the tree build_kernel left, for
# lwpvmm's host-side decompression (src/vmm/payload.rs). Only the
# decompressor depends on the compression: `-o vmlinux` takes the linked
# vmlinux as it is, where make would recompile what reads the
# compression's settings (asm/boot.h's heap size) and relink vmlinux for
# each. Each image goes in under its name whole, so a build cut short
# leaves none half-written.
build_test_images() {
    for format in $FORMATS; do
        name=vmlinuz.$(echo "$format" | tr 'A-Z' 'a-z')
        log "the test image $name ($(elapsed) so far)"
        set_compression "$format"
        kmake -j"$JOBS" -o vmlinux bzImage
        cp "$TREE/arch/x86/boot/bzImage" "$OUT/$name.part"
        mv "$OUT/$name.part" "$OUT/$name"
    done
    set_compression XZ
}
# ---- end of the kernel recipe ----

VERSION=$(dpkg-query -W -f '${Version}' linux-source-6.1 2>/dev/null || echo unknown)
KEY=$( (echo "$VERSION"; sed -n '/^# ---- kernel recipe ----/,/^# ---- end of the kernel recipe ----/p' "$HERE/build.sh"
    cat "$HERE/lwpvmm.config" "$HERE"/patches/*.patch "$HERE"/module/*) | sha256sum | cut -c1-16)

kernel_cached() {
    [ -f "$OUT/vmlinux" ] && [ -f "$OUT/vmlinuz" ] && [ -f "$OUT/lwpvmm.ko" ] &&
        [ -f "$SUPPORT/gen_init_cpio.c" ] && [ "$(cat "$OUT/vmlinux.key" 2>/dev/null)" = "$KEY" ]
}
images_cached() {
    for format in $FORMATS; do
        [ -f "$OUT/vmlinuz.$(echo "$format" | tr 'A-Z' 'a-z')" ] || return 1
    done
}

IMAGES_TODO=0
if kernel_cached && { [ "$TEST_IMAGES" = 0 ] || images_cached; }; then
    log "kernel $KEY is cached"
else
    # The tree is gone once a build is done: the test images of a cached
    # kernel need it built again (the same bytes, the build being
    # reproducible).
    kernel_cached && log "kernel $KEY is cached without the test images (--test-images): building it again for them"
    log "building kernel $KEY: a first build takes $EXPECT (docs/linux-guest.md, \"Building it\")"
    : >"$LOG"
    ticker_start
    build_kernel
    ticker_stop
    echo "$KEY" >"$OUT/vmlinux.key"
    IMAGES_TODO=$TEST_IMAGES
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
# it: CONFIG_DEVTMPFS_MOUNT), /proc a mount point. /sbin/init is a link to
# /init, the first place Linux looks without init=: a Firecracker client
# that names only a root drive gets the self-test too.
ROOT="$OUT/rootfs"
rm -rf "$ROOT" "$OUT/rootfs.ext4"
mkdir -p "$ROOT/dev" "$ROOT/proc" "$ROOT/sbin"
ln -s /init "$ROOT/sbin/init"
for src in "$HERE"/init/*.c; do
    prog=$(basename "$src" .c)
    name=$prog
    [ "$prog" = selftest ] && name=init
    cp "$OUT/bin/$prog" "$ROOT/$name"
done
cp "$OUT/lwpvmm.ko" "$ROOT/lwpvmm.ko"
mke2fs -q -F -t ext4 -L lwpvmm-root -E root_owner=0:0 -d "$ROOT" "$OUT/rootfs.ext4" 32M
log "wrote $OUT/vmlinux, vmlinuz, initramfs.cpio and rootfs.ext4 in $(elapsed)"

if [ "$IMAGES_TODO" = 1 ]; then
    ticker_start
    build_test_images
    ticker_stop
    log "wrote the test images $OUT/vmlinuz.FORMAT ($FORMATS) in $(elapsed) in all"
fi
