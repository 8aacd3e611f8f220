#!/bin/sh
# layers.sh - the include folders that keep each layer to the folders it
# may use (the Makefile's USES_*; docs/architecture.md, "Layers and
# folders").  Every include names its folder from the repository root
# ("kv/kv.h"); a layer's objects are compiled with -IDIR/LAYER alone, so
# a header of a folder the layer may not use is not found.
#
#   sh tools/layers.sh links DIR 'LAYER=FOLDER...' ...
#       makes DIR/LAYER/ (a / in LAYER becomes -): for each FOLDER a real
#       folder of links to FOLDER's headers (*.h, *.cuh), never to its
#       subfolders, so kernels/cpu/ is seen only where it is named.  The
#       tree is made again only when the list of links (DIR/links.txt)
#       changes; run from the repository root, DIR relative to it.
#   sh tools/layers.sh check CC DIR 'LAYER=FOLDER...' ...
#       for each LAYER, asks CC (-E, with -IDIR/LAYER alone) whether it
#       finds each header of every FOLDER named, and fails, naming the
#       header, unless the layer finds exactly those of its own FOLDERs;
#       then includes a header the layer may not use and fails unless
#       that include fails.
#   sh tools/layers.sh names FOLDER...
#       fails, naming file and line, where a C, header or CUDA file under
#       a FOLDER includes a quoted name that is not the path of a file
#       from the repository root ("kv.h", "../tinymodel.h"): such a name
#       resolves from the includer's own folder and hides the layer.
#   sh tools/layers.sh noconfig FOLDER... [--except FILE...]
#       fails, naming file and line, where a C, header or CUDA file under
#       a FOLDER includes common/config.h or names fy_config_t or a
#       fy_conf_ getter: configuration is read once, in worker/, router/
#       and tools/, into typed structs (docs/architecture.md).  With
#       --except, the FILEs (paths from the root) are the folders'
#       readers, the only files there that may.
#   sh tools/layers.sh nogetters FILE...
#       fails, naming file and line, where a FILE reads a key itself: a
#       fy_conf_ getter, a fy_netconf_ reader or a fy_cluster_ helper that
#       takes the configuration.  For a file that holds the configuration
#       to change and write it (tools/serve.c) but reads its keys once,
#       through its reader.
set -eu

usage() {
    echo "usage: sh tools/layers.sh links DIR 'LAYER=FOLDER...' ... | check CC DIR 'LAYER=FOLDER...' ... | names FOLDER... | noconfig FOLDER... [--except FILE...] | nogetters FILE..." >&2
    exit 2
}

# the headers of one folder, one a line (its subfolders' are not)
headers() {
    for h in "$1"/*.h "$1"/*.cuh; do
        [ -f "$h" ] && echo "$h"
    done
    return 0
}

layer_dir() {
    echo "$1/$(echo "$2" | tr / -)"
}

# "LAYER HEADER" for every header a layer may include
wanted() {
    for spec; do
        for f in ${spec#*=}; do
            headers "$f" | sed "s|^|${spec%%=*} |"
        done
    done
}

links() {
    dir=$1
    shift
    case $dir in /* | *..*) echo "layers: DIR must be a relative path under the repository: $dir" >&2; exit 2 ;; esac
    want=$(wanted "$@")
    [ -f "$dir/links.txt" ] && [ "$want" = "$(cat "$dir/links.txt")" ] && return 0
    rm -rf "$dir"
    mkdir -p "$dir"
    for spec; do
        l=$(layer_dir "$dir" "${spec%%=*}")
        for f in ${spec#*=}; do
            mkdir -p "$l/$f"
            # from $l/$f back up to the repository root
            up=$(echo "$l/$f" | sed 's|[^/][^/]*|..|g')
            hs=$(headers "$f" | sed "s|^|$up/|")
            [ -z "$hs" ] || ln -s $hs "$l/$f/"
        done
    done
    echo "$want" >"$dir/links.txt"
}

check() {
    cc=$1 dir=$2
    shift 2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # every header of every folder any layer names, each asked for
    for spec; do
        for f in ${spec#*=}; do echo "$f"; done
    done | sort -u >"$tmp/folders"
    : >"$tmp/all"
    while read -r f; do headers "$f" >>"$tmp/all"; done <"$tmp/folders"
    sort -u -o "$tmp/all" "$tmp/all"
    [ -s "$tmp/all" ] || { echo "layers: no headers in the folders named" >&2; exit 1; }
    while read -r h; do
        printf '#if __has_include("%s")\n"%s"\n#endif\n' "$h" "$h"
    done <"$tmp/all" >"$tmp/probe.c"
    bad=0 n=0
    for spec; do
        layer=${spec%%=*}
        for f in ${spec#*=}; do headers "$f"; done | sort -u >"$tmp/want"
        if ! $cc -E -P -I"$(layer_dir "$dir" "$layer")" "$tmp/probe.c" >"$tmp/out" 2>"$tmp/err"; then
            echo "layers: $cc -E failed on the probe for $layer:" >&2
            cat "$tmp/err" >&2
            exit 1
        fi
        sed -n 's/^"\(.*\)"$/\1/p' "$tmp/out" | sort -u >"$tmp/seen"
        for h in $(comm -13 "$tmp/want" "$tmp/seen"); do
            echo "layers: $layer finds $h, which USES_$layer does not name" >&2
            bad=1
        done
        for h in $(comm -23 "$tmp/want" "$tmp/seen"); do
            echo "layers: $layer cannot find $h, which USES_$layer names" >&2
            bad=1
        done
        # and a real include the wrong way: it must not build
        wrong=$(comm -13 "$tmp/want" "$tmp/all" | head -n 1)
        if [ -n "$wrong" ]; then
            printf '#include "%s"\n' "$wrong" >"$tmp/wrong.c"
            if $cc -E -I"$(layer_dir "$dir" "$layer")" "$tmp/wrong.c" >/dev/null 2>"$tmp/err"; then
                echo "layers: $layer includes $wrong and builds" >&2
                bad=1
            elif ! grep -qF "$wrong" "$tmp/err"; then
                echo "layers: including $wrong in $layer failed, but not for want of the file:" >&2
                cat "$tmp/err" >&2
                bad=1
            fi
        fi
        n=$((n + 1))
    done
    [ $bad = 0 ] || exit 1
    echo "layers: each of $n layers finds exactly the headers of the folders it may use"
}

names() {
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    find "$@" -path bench/results -prune -o -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
        -print | sort | xargs grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' /dev/null >"$tmp/inc" || true
    # "FILE:LINE:#include "NAME"..."; awk opens each NAME itself (no
    # process per include): one that does not open from here is not a
    # path from the root
    if ! awk -F: '{
        name = $0; sub(/^[^"]*"/, "", name); sub(/".*$/, "", name)
        ok = name ~ /\.[A-Za-z]+$/ && name !~ /^\// && name !~ /^\.\.?\// && name !~ /\/\.\.\//
        if (ok) { ok = (getline junk < name) >= 0; close(name) }
        if (!ok) { printf "layers: %s:%s: \"%s\" does not name its folder from the repository root\n", $1, $2, name; bad = 1 }
        n++
    } END { if (bad) exit 1; printf "layers: %d includes name their folder from the repository root\n", n }' "$tmp/inc" >"$tmp/out"; then
        cat "$tmp/out" >&2
        exit 1
    fi
    cat "$tmp/out"
}

noconfig() {
    folders='' except=''
    while [ $# -gt 0 ] && [ "$1" != --except ]; do
        folders="$folders $1"
        shift
    done
    [ $# -gt 0 ] && shift && except="$*"
    [ -n "$folders" ] || usage
    hits=$(find $folders -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print | sort |
        { if [ -n "$except" ]; then grep -vxF "$(printf '%s\n' $except)"; else cat; fi; } |
        xargs grep -nE '#[[:space:]]*include[[:space:]]*"common/config\.h"|\bfy_config_t\b|\bfy_conf_[a-z]+\(' /dev/null ||
        true)
    if [ -n "$hits" ]; then
        if [ -n "$except" ]; then
            echo "$hits" | sed "s|^|layers: reads the configuration outside its reader ($except): |" >&2
        else
            echo "$hits" | sed 's/^/layers: reads the configuration below worker\/: /' >&2
        fi
        exit 1
    fi
    echo "layers: no configuration read under$folders${except:+ but in $except}"
}

nogetters() {
    hits=$(grep -nE '\bfy_conf_[a-z]+\(|\bfy_netconf_[a-z_]+\(|\bfy_cluster_(secret|prefix_secret|auth|served_model_name|ranks|kv|secret_path)\(' "$@" /dev/null || true)
    if [ -n "$hits" ]; then
        echo "$hits" | sed 's/^/layers: reads a configuration key outside its reader: /' >&2
        exit 1
    fi
    echo "layers: no key read in $*"
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
links) [ $# -ge 1 ] || usage; links "$@" ;;
check) [ $# -ge 2 ] || usage; check "$@" ;;
names) [ $# -ge 1 ] || usage; names "$@" ;;
noconfig) [ $# -ge 1 ] || usage; noconfig "$@" ;;
nogetters) [ $# -ge 1 ] || usage; nogetters "$@" ;;
*) usage ;;
esac
