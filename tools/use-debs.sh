# use-debs.sh - source it on a GPU host:  . tools/use-debs.sh DIR
# Unpacks every .deb that tools/fetch-debs.sh put in DIR under /opt/debs
# (never into /) and points the compiler, the linker, pkg-config and the
# loader there.  Debian keeps some headers (curl's) in the multiarch folder,
# so that goes on CPATH too.  Safe to source more than once.
_fy_d=${1:?usage: . tools/use-debs.sh DIR}
mkdir -p /opt/debs
for _fy_f in "$_fy_d"/*.deb; do dpkg -x "$_fy_f" /opt/debs; done
_fy_lib=/opt/debs/usr/lib/x86_64-linux-gnu
export CPATH=/opt/debs/usr/include:/opt/debs/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
export LIBRARY_PATH=$_fy_lib${LIBRARY_PATH:+:$LIBRARY_PATH}
export LD_LIBRARY_PATH=$_fy_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$_fy_lib/pkgconfig:/opt/debs/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=/opt/debs
export UCX_MODULE_DIR=$_fy_lib/ucx
export PATH=/opt/debs/usr/bin:$PATH
unset _fy_d _fy_f _fy_lib
