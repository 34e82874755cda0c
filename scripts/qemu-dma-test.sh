#!/usr/bin/env bash
# VFIO integration test of gdr-dma under QEMU (TCG): boots Debian's kernel on a q35 machine with
# an emulated Intel IOMMU, QEMU's edu DMA device and an ivshmem-plain device whose BAR2 (backed by
# a host file) stands in for a GPU's BAR1. Inside, both devices are bound to vfio-pci and the test
# binary (crates/gdr-dma/examples/vm_guest.rs) plus `gdr dma` run; results come back on the serial
# console as `GDRTEST PASS|FAIL name detail` lines. The host then checks what the guest wrote into
# the ivshmem file. Ends with `N passed, N failed`; exits non-zero on any failure or timeout.
#
# Prerequisites: qemu-system-x86_64 and cpio (apt-installed when missing, which needs root), and
# Debian's kernel and busybox-static packages (downloaded with apt-get into the cargo target
# directory's qemu-dma/cache once, which needs network, and root when the apt lists must be
# refreshed). When one cannot be had:
#   - not root and $CI unset (a developer's machine): prints `qemu-dma-test: skipped: <why>` and
#     exits 77, so a run without root or network says what it did not test instead of failing;
#   - root or $CI set (CI runs as root, with network): prints the reason and fails (exit 1), so
#     a broken CI machine cannot pass for a skipped test.
# Env:
#   GDR_QEMU_TIMEOUT  seconds before QEMU is killed (default 240)
#   GDR_QEMU_APPEND   more kernel command line (gdrskip=guest runs only the CLI checks)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# Build outputs and the cache live in cargo's target directory (CARGO_TARGET_DIR or the config's
# build.target-dir, not necessarily ./target).
TARGET=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
WORK=$TARGET/qemu-dma
CACHE=$WORK/cache
mkdir -p "$WORK" "$CACHE"
T0=$(date +%s)
TIMEOUT=${GDR_QEMU_TIMEOUT:-240}

log() { echo "qemu-dma-test: $*" >&2; }

# A prerequisite is missing: skip on a developer's machine without root, fail anywhere else.
prereq_fail() { # prereq_fail WHY
    if [ "$(id -u)" != 0 ] && [ -z "${CI:-}" ]; then
        echo "qemu-dma-test: skipped: $1; run it as root with network access (as CI does) to include it"
        exit 77
    fi
    echo "qemu-dma-test: FAIL: $1"
    echo "0 passed, 1 failed"
    exit 1
}

# --- packages -------------------------------------------------------------------------------
command -v apt-get >/dev/null 2>&1 ||
    prereq_fail "apt-get not found: the test fetches Debian's kernel and busybox with apt"
apt_updated=0
apt_update_once() {
    if [ "$apt_updated" = 0 ]; then
        log "apt-get update: refreshing the package lists (network)"
        apt-get update -qq >/dev/null 2>&1 ||
            prereq_fail "apt-get update failed (needs root and network)"
        apt_updated=1
    fi
}
need_tool() { # need_tool TOOL PACKAGE
    command -v "$1" >/dev/null 2>&1 && return 0
    [ "$(id -u)" = 0 ] || prereq_fail "$1 is not installed (package $2) and installing it needs root"
    log "installing $2 with apt-get (once; network)"
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null ||
        prereq_fail "apt-get install $2 failed"
}
need_tool qemu-system-x86_64 qemu-system-x86
need_tool cpio cpio

# Kernel and busybox are unpacked into the cache, not installed on this machine.
fetch_deb() { # fetch_deb PACKAGE [PATTERN...]: unpacks into $CACHE/PACKAGE (only PATTERNs if given)
    local pkg=$1 dir=$CACHE/$1
    shift
    [ -e "$dir/.done" ] && return 0
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    log "downloading Debian's $pkg into $CACHE (once; later runs reuse it)"
    (cd "$CACHE" && apt-get download -qq "$pkg" >/dev/null 2>&1) || return 1
    if [ $# -gt 0 ]; then
        dpkg-deb --fsys-tarfile "$CACHE"/"${pkg}"_*.deb | tar -x -C "$dir" --wildcards "$@" || return 1
    else
        dpkg-deb -x "$CACHE"/"${pkg}"_*.deb "$dir" || return 1
    fi
    rm -f "$CACHE"/"${pkg}"_*.deb
    touch "$dir/.done"
}
kernel_pkg() { # the versioned kernel package linux-image-amd64 points at, per the apt lists
    # awk reads to the end, so apt-cache never dies of a closed pipe (pipefail would end us).
    { apt-cache depends linux-image-amd64 2>/dev/null || true; } |
        awk '/Depends: linux-image-[0-9]/ && !k {k = $2} END {if (k) print k}'
}
fetch_kernel() {
    [ -n "$KPKG" ] && fetch_deb "$KPKG" './boot/vmlinuz-*' './lib/modules/*/modules.order' \
        './lib/modules/*/kernel/drivers/vfio/*' './lib/modules/*/kernel/virt/*'
}
KPKG=$(kernel_pkg)
# Missing or stale lists (naming a kernel the mirror no longer has): refresh them and ask again.
if ! fetch_kernel; then
    apt_update_once
    KPKG=$(kernel_pkg)
    [ -n "$KPKG" ] || prereq_fail "the apt lists have no linux-image-amd64 (not Debian?)"
    fetch_kernel || prereq_fail "cannot download $KPKG (needs network)"
fi
if ! fetch_deb busybox-static; then
    apt_update_once
    fetch_deb busybox-static || prereq_fail "cannot download busybox-static (needs network)"
fi
KDIR=$CACHE/$KPKG
BBDIR=$CACHE/busybox-static
KVER=${KPKG#linux-image-}
VMLINUZ=$KDIR/boot/vmlinuz-$KVER
MODDIR=$KDIR/lib/modules/$KVER
[ -e "$VMLINUZ" ] || { log "no kernel at $VMLINUZ"; exit 1; }

# --- binaries -------------------------------------------------------------------------------
log "building gdr and the guest test binary"
# The executables' paths as cargo reports them (wherever its target directory is).
artifacts=$(cargo build -q -p gdr-cli -p gdr-dma --bins --example vm_guest --message-format=json)
exe() { # exe TARGET-NAME: the executable cargo built for it
    printf '%s\n' "$artifacts" | python3 -c '
import json, sys
exe = [m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable")]
if not exe:
    sys.exit("qemu-dma-test: cargo built no " + sys.argv[1])
print(exe[-1])
' "$1"
}
GDR=$(exe gdr)
GUEST=$(exe vm_guest)

# --- initramfs ------------------------------------------------------------------------------
IRD=$WORK/initramfs
rm -rf "$IRD" && mkdir -p "$IRD"/{bin,dev,proc,sys,tmp,lib/modules}
cp "$BBDIR/bin/busybox" "$IRD/bin/busybox"
cp "$GDR" "$GUEST" "$IRD/bin/"
for lib in $(ldd "$GDR" "$GUEST" | awk '/=> \//{print $3} /^\s*\/lib/{print $1}' | sort -u); do
    mkdir -p "$IRD$(dirname "$lib")"
    cp -L "$lib" "$IRD$lib"
done
# ld.so is looked up at the path in the binary's interpreter field.
interp=$(readelf -l "$GDR" | awk -F': ' '/interpreter/{gsub(/\]/,"",$2); print $2}')
mkdir -p "$IRD$(dirname "$interp")" && cp -L "$interp" "$IRD$interp"

# vfio-pci and its dependencies, in load order. The package ships no modules.dep (depmod runs
# at install), so dependencies come from each module's own `depends=` field.
mods=()
mod_path() { # mod_path NAME -> path relative to MODDIR, from modules.order
    local n=$1
    awk -v a="/$n.ko" -v b="/${n//_/-}.ko" -v c="/${n//-/_}.ko" \
        'function ends(s,t){return length(s)>=length(t) && substr(s,length(s)-length(t)+1)==t}
         {f="/"$0; sub(/\.(xz|zst|gz)$/,"",f)} ends(f,a)||ends(f,b)||ends(f,c){print; exit}' \
        "$MODDIR/modules.order"
}
mod_cat() { # mod_cat FILE: the module, decompressed
    case "$1" in
        *.xz) xz -dc "$1" ;;
        *.zst) zstd -qdc "$1" ;;
        *) cat "$1" ;;
    esac
}
add_mod() { # add_mod NAME
    local rel dep x
    rel=$(mod_path "$1")
    [ -n "$rel" ] || { log "module $1 not found in $MODDIR"; exit 1; }
    for x in "${mods[@]:-}"; do [ "$x" = "$rel" ] && return 0; done
    for dep in $(mod_cat "$MODDIR/$rel" | grep -a -o 'depends=[A-Za-z0-9_,-]*' | head -n 1 | cut -d= -f2 | tr ',' ' '); do
        add_mod "$dep"
    done
    mods+=("$rel")
}
add_mod vfio_iommu_type1
add_mod vfio-pci
: > "$IRD/lib/modules/order"
for m in "${mods[@]}"; do
    base=$(basename "$m"); base=${base%.xz}; base=${base%.zst}
    mod_cat "$MODDIR/$m" > "$IRD/lib/modules/$base"
    echo "$base" >> "$IRD/lib/modules/order"
done
cp "$ROOT/scripts/qemu/init" "$IRD/init"
chmod +x "$IRD/init"
(cd "$IRD" && find . | cpio -o -H newc --quiet) | gzip -1 > "$WORK/initramfs.cpio.gz"

# --- the shared memory behind ivshmem ------------------------------------------------------
SEED=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
SHM=/dev/shm/gdr-dma-ivshmem-$$
trap 'rm -f "$SHM"' EXIT
fill=$("$GUEST" host-fill "$SHM" "$SEED") || { log "host-fill: $fill"; exit 1; }
log "peer memory $SHM: $fill"

# --- boot -----------------------------------------------------------------------------------
CONSOLE=$WORK/console.log
log "booting (seed $SEED, timeout ${TIMEOUT}s)"
# The guest's IOMMU fault test makes QEMU print `vtd_iova_to_slpte: ... permission error` and
# a few more lines about that fault: marked here as expected, so that nobody takes them for the
# failure.
annotate_qemu() {
    sed -u -e '/vtd_\|New fault is not recorded/s/$/  [expected: the guest'"'"'s IOMMU fault test]/' >&2
}
BOOT0=$(date +%s)
set +e
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 \
    -machine q35 -accel tcg -icount shift=0,sleep=off -cpu max -smp 1 -m 512 \
    -device intel-iommu,caching-mode=on,intremap=on \
    -device edu,addr=04.0 \
    -object memory-backend-file,id=gdrshm,mem-path="$SHM",size=8M,share=on \
    -device ivshmem-plain,memdev=gdrshm,addr=05.0 \
    -kernel "$VMLINUZ" -initrd "$WORK/initramfs.cpio.gz" \
    -append "console=ttyS0 intel_iommu=on panic=-1 loglevel=1 gdrseed=$SEED ${GDR_QEMU_APPEND:-}" \
    -display none -serial file:"$CONSOLE" -monitor none -no-reboot </dev/null 2> >(annotate_qemu)
QRC=$?
set -e
BOOT1=$(date +%s)

# --- results --------------------------------------------------------------------------------
tr -d '\r' < "$CONSOLE" > "$WORK/console.txt"
log "the guest's times (per case, and DMA time) are QEMU's virtual -icount clock, which runs ahead of the host's: the guest ran $((BOOT1 - BOOT0)) s"
grep -E '^GDRTEST ' "$WORK/console.txt" | sed 's/^/  /' || true
pass=$(grep -cE '^GDRTEST PASS ' "$WORK/console.txt" || true)
fail=$(grep -cE '^GDRTEST FAIL ' "$WORK/console.txt" || true)
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    echo "  FAIL qemu: killed after ${TIMEOUT}s"; fail=$((fail + 1))
fi
if ! grep -q '^GDRTEST DONE' "$WORK/console.txt"; then
    echo "  FAIL guest: did not finish (last console lines follow)"; fail=$((fail + 1))
    tail -n 30 "$WORK/console.txt" | sed 's/^/    | /'
fi
# What the guest copied into peer memory must be in the host's file.
if out=$("$GUEST" host-check "$SHM" "$SEED" 2>&1); then
    echo "  PASS host-side-peer-check $out"; pass=$((pass + 1))
else
    echo "  FAIL host-side-peer-check $out"; fail=$((fail + 1))
fi
T1=$(date +%s)
echo "qemu-dma-test: guest ran $((BOOT1 - BOOT0))s, whole test $((T1 - T0))s"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
