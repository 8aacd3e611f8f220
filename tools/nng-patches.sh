#!/bin/sh
# nng-patches.sh: the sha256 of tools/nng-patches/*.patch taken together
# in name order ("none" where there are none): build-nng.sh writes it into
# build/nng/VERSION and `make nng` compares it, so a new or changed patch
# rebuilds nng.
set -eu
files=$(ls tools/nng-patches/*.patch 2>/dev/null | sort || true)
if [ -z "$files" ]; then echo none; exit 0; fi
cat $files | sha256sum | awk '{ print $1 }'
