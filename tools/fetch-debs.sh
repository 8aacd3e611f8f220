#!/usr/bin/env bash
# fetch-debs.sh DIR - download, as .deb files into DIR, the Debian libraries
# tools/gpu_check.sh needs to build and test ferry on a machine that has no
# package registry (a lent GPU host), with the runtime libraries they pull in.
# Run it on a Debian machine of the host's release (bookworm here); on the
# host, `. tools/use-debs.sh DIR` unpacks and uses them.
#
# The list: the Makefile's PKGS (-dev packages), nng (the build uses
# build/nng when it is carried, libnng otherwise), gnutls and the .pc files
# its own .pc requires (with one missing, `pkg-config --cflags` fails as a
# whole), cmocka for the tests, and make and pkg-config, which a GPU host may
# lack.  Base and toolchain libraries (libc, libgcc, libstdc++, the
# sanitizers' runtimes, ...) are left out on purpose: the host has its own,
# and their headers would shadow them.
set -euo pipefail
dir=${1:?usage: tools/fetch-debs.sh DIR}
pkgs="libucx-dev libnng-dev libmsgpack-dev libpcre2-dev libjansson-dev libsodium-dev libinih-dev
      libmicrohttpd-dev libgnutls28-dev libp11-kit-dev nettle-dev libtasn1-6-dev libidn2-dev
      libcurl4-openssl-dev libcmocka-dev make pkgconf pkgconf-bin"
base='^(libc6|libc6-dev|libc-dev-bin|libgcc-s1|libgcc-.*-dev|libstdc\+\+.*|gcc-.*|lib(a|l|t|ub|hwa)san.*'
base+='|libatomic1|libgomp1|libitm1|libquadmath0|libcrypt.*|libnsl.*|libtirpc.*|zlib1g|libzstd1|liblzma5'
base+='|libselinux1|libpcre2-8-0|libssl3|libgmp10|libtinfo6|libudev1|libsystemd0|libcap2|libcap-ng0|libacl1'
base+='|libattr1|libbz2-1.0|libgpg-error0|libgcrypt20|liblz4-1|libmd0|libbsd0|libffi8|libexpat1|libaudit.*'
base+='|libpam.*|libdb5.3|libreadline8|libsemanage.*|libsepol2|libkrb5.*|libk5crypto3|libgssapi-krb5-2'
base+='|libcom-err2|libkeyutils1|libdebian-installer4|libnewt0.52|libslang2|libtextwrap1)$'
# shellcheck disable=SC2086
deps=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances --no-pre-depends $pkgs 2>/dev/null | grep '^lib' | grep -v -- '-dev$' | grep -Ev "$base" || true)
mkdir -p "$dir"
cd "$dir"
# shellcheck disable=SC2086
apt-get download $(printf '%s\n' $pkgs $deps | sort -u)
echo "fetch-debs: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $dir"
