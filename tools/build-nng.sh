#!/bin/sh
# build-nng.sh PYNNG_VERSION SHA256FILE PREFIX
# Builds nng from the source pynng's sdist on PyPI carries (pynng 0.9.0:
# nng 1.11.0) as a static library, installed under PREFIX (lib/libnng.a,
# include/nng/).  Debian 12's nng 1.5.2 has a use-after-free on push
# sockets (nng issue 1653) and a receive that never ends when a pipe
# closes mid-message (nng pull request 1636), both fixed in 1.6; see
# docs/architecture.md, "Dependencies".
#
# The patches in tools/nng-patches/ (in name order) are applied to the
# source before it is built: fixes ferry needs that no release on PyPI
# carries yet (each patch says what it fixes).  VERSION records the
# release, the sdist's sha256 and the patches' (`make nng` rebuilds when
# either differs).
#
# The sdist is downloaded only (nothing is installed), in pip's
# hash-checking mode: pip refuses a file whose sha256 is not the one
# SHA256FILE pins before it runs any of the package's code, and the file
# is checked again here before it is unpacked.  Nothing but nng is built
# (no tests, no tools, no TLS, no HTTP/WebSocket: ferry speaks tcp and
# ipc), with -fPIC, as a Release build.  Fails with a message if any step
# fails; PREFIX is only replaced once the new build is complete.
set -eu
version=$1
sums=$2
prefix=$3
name="pynng-$version.tar.gz"
tmp=build/pip
src=build/nng-src
obj=build/nng-build
want=$(awk -v n="$name" '$2 == n { print $1 }' "$sums")
if [ -z "$want" ]; then echo "nng: no sha256 for $name in $sums" >&2; exit 1; fi
command -v cmake >/dev/null || { echo "nng: cmake not found (make deps installs it)" >&2; exit 1; }
mkdir -p "$tmp"
if [ ! -f "$tmp/$name" ]; then
    echo "nng: downloading pynng $version's sdist from PyPI (download only; it carries nng's source)"
    printf 'pynng==%s --hash=sha256:%s\n' "$version" "$want" >"$tmp/pynng-req.txt"
    # --no-binary pynng, not :all:: pip prepares the sdist's metadata in
    # an isolated environment whose build tools may come as wheels
    python3 -m pip download --no-deps --no-binary pynng --disable-pip-version-check -q --retries 1 --timeout 30 \
        -d "$tmp" -r "$tmp/pynng-req.txt"
fi
got=$(sha256sum "$tmp/$name" | awk '{ print $1 }')
if [ "$want" != "$got" ]; then
    echo "nng: sha256 mismatch for $name: expected $want, got $got" >&2
    rm -f "$tmp/$name"
    exit 1
fi
rm -rf "$src" "$obj"
mkdir -p "$src"
tar -xzf "$tmp/$name" -C "$src" --strip-components=1 "pynng-$version/nng"
hdr="$src/nng/include/nng/nng.h"
[ -f "$hdr" ] || { echo "nng: $name holds no nng/include/nng/nng.h" >&2; exit 1; }
nver=$(awk '/#define NNG_(MAJOR|MINOR|PATCH)_VERSION/ { v = v (v == "" ? "" : ".") $3 } END { print v }' "$hdr")
patches=$(ls tools/nng-patches/*.patch 2>/dev/null | sort || true)
for p in $patches; do
    patch -s -p1 -d "$src/nng" <"$p" || { echo "nng: $p does not apply to nng $nver" >&2; exit 1; }
done
psum=$(sh tools/nng-patches.sh)
echo "nng: building nng $nver from $name (sha256 $got) with $(echo $patches | wc -w) patch(es) into $prefix"
cmake -S "$src/nng" -B "$obj" -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_INSTALL_PREFIX="$(pwd)/$prefix.part" -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_SHARED_LIBS=OFF \
    -DNNG_TESTS=OFF -DNNG_TOOLS=OFF -DNNG_ENABLE_NNGCAT=OFF -DNNG_ENABLE_TLS=OFF -DNNG_ENABLE_HTTP=OFF \
    -DNNG_ENABLE_COMPAT=OFF -DNNG_ENABLE_COVERAGE=OFF >"$obj.log" 2>&1 ||
    { cat "$obj.log" >&2; echo "nng: cmake could not configure nng (above)" >&2; exit 1; }
rm -rf "$prefix.part"
cmake --build "$obj" -j "${NNG_JOBS:-2}" >>"$obj.log" 2>&1 && cmake --install "$obj" >>"$obj.log" 2>&1 ||
    { tail -n 40 "$obj.log" >&2; echo "nng: building nng failed (above; all of it in $obj.log)" >&2; exit 1; }
[ -f "$prefix.part/lib/libnng.a" ] || { echo "nng: the build left no $prefix.part/lib/libnng.a" >&2; exit 1; }
printf '%s %s %s\n' "$nver" "$got" "$psum" >"$prefix.part/VERSION"
rm -rf "$prefix" "$obj" "$src"
mv "$prefix.part" "$prefix"
echo "nng: $prefix/lib/libnng.a is nng $nver"
