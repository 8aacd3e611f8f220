/*
 * version.h - ferry's version, as GET /version answers it.  Bumped by
 * hand at a release.
 *
 * Not here: the wire protocol's version (msg.h, FY_PROTO_VERSION), which
 * changes only when messages do.
 */
#ifndef FY_VERSION_H
#define FY_VERSION_H

#define FY_VERSION "0.1.0"

#endif /* FY_VERSION_H */
