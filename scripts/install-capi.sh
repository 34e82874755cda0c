#!/usr/bin/env bash
# Installs gdr's two C libraries like C libraries, with cargo-c's `cargo cinstall`:
# - libgdrapi (the gdrcopy 2.6 drop-in, crates/gdr-capi):
#   LIBDIR/libgdrapi.so.2.6.0, and the links libgdrapi.so.2 (soname), libgdrapi.so.2.6 (gdrcopy's
#   name for the file) and libgdrapi.so (what NCCL dlopens); INCLUDEDIR/gdrapi.h;
#   LIBDIR/pkgconfig/gdrapi.pc
# - libgdr_alloc (gdr's allocator, crates/gdr-alloc-preload; `gdr run` preloads it):
#   LIBDIR/libgdr_alloc.so.0.1.0 with the links libgdr_alloc.so.0 (soname) and libgdr_alloc.so;
#   INCLUDEDIR/gdr_alloc.h; LIBDIR/pkgconfig/gdr_alloc.pc
# Then `cc app.c $(pkg-config --cflags --libs gdrapi)` builds a program that runs as it is:
# a LIBDIR the dynamic loader searches gets `ldconfig` (run here when root, and installing
# into the live system); any other LIBDIR gets an rpath in the .pc files.
#
# Usage: scripts/install-capi.sh [--prefix DIR] [--libdir DIR] [--destdir DIR]
#   --prefix   where to install (default /usr/local)
#   --libdir   library directory (default PREFIX/lib)
#   --destdir  staging root for packaging: files go to DESTDIR/PREFIX/..., no ldconfig
# Installs cargo-c (pinned version, from crates.io) first when `cargo cinstall` is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
libdir=
destdir=
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --libdir) libdir=${2:?--libdir needs a directory}; shift 2 ;;
    --destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-capi.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $prefix in /*) ;; *) prefix=$(cd "$prefix" 2>/dev/null && pwd || echo "$PWD/$prefix") ;; esac
libdir=${libdir:-$prefix/lib}
if [ -n "$destdir" ]; then
  mkdir -p "$destdir"
  destdir=$(cd "$destdir" && pwd)
fi

# cargo-c 0.10.24 is the newest that builds with Rust 1.95; older ones (Debian's 0.9.14) cannot
# read this workspace's Cargo.lock (version 4).
cargo_c=0.10.24
have=$(cargo cinstall --version 2>/dev/null | grep -o '0\.[0-9]*\.[0-9]*' | head -1 || true)
if [ -z "$have" ] || [ "$(printf '%s\n0.10.0\n' "$have" | sort -V | head -1)" != 0.10.0 ]; then
  echo "install-capi.sh: installing cargo-c $cargo_c (once; it compiles for several minutes)"
  cargo install cargo-c --locked --version "$cargo_c"
fi

for crate in gdr-capi gdr-alloc-preload; do
  cargo cinstall --release --locked -p $crate --library-type cdylib \
    --prefix "$prefix" --libdir "$libdir" \
    ${destdir:+--destdir "$destdir"}
done

lib=$destdir$libdir
ln -sf libgdrapi.so.2.6.0 "$lib/libgdrapi.so.2.6"
for pc in "$lib/pkgconfig/gdrapi.pc" "$lib/pkgconfig/gdr_alloc.pc"; do
  [ -f "$pc" ] || { echo "install-capi.sh: cargo cinstall made no $pc" >&2; exit 1; }
done

# Does the dynamic loader search LIBDIR (ld.so.conf or its default directories)?
searched=no
for d in /lib /usr/lib /lib64 /usr/lib64 $(ldconfig -v -N -X 2>/dev/null | grep -o '^/[^:]*'); do
  [ "$d" = "$libdir" ] && searched=yes
done
if [ $searched = yes ]; then
  if [ -z "$destdir" ] && [ "$(id -u)" = 0 ]; then
    ldconfig
  elif [ -z "$destdir" ]; then
    echo "install-capi.sh: run 'sudo ldconfig' so the loader finds libgdrapi.so.2"
  fi
else
  # Not a loader directory: programs linked through pkg-config carry the path themselves.
  for pc in "$lib/pkgconfig/gdrapi.pc" "$lib/pkgconfig/gdr_alloc.pc"; do
    sed -i 's|^Libs: -L\${libdir} |Libs: -L${libdir} -Wl,-rpath,${libdir} |' "$pc"
    grep -q 'rpath' "$pc" || { echo "install-capi.sh: could not add the rpath to $pc" >&2; exit 1; }
  done
fi
echo "installed libgdrapi 2.6 and libgdr_alloc into $destdir$prefix (libdir $libdir)"
ls -l "$lib"/libgdrapi.so* "$lib"/libgdr_alloc.so* "$lib"/pkgconfig/gdrapi.pc \
  "$lib"/pkgconfig/gdr_alloc.pc "$destdir$prefix"/include/gdrapi.h \
  "$destdir$prefix"/include/gdr_alloc.h | sed 's/^/  /'
