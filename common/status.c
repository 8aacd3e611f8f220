/* status.c - names of ferry's status codes. */
#include "common/status.h"

const char *fy_status_str(fy_status_t status)
{
    switch (status) {
    case FY_OK: return "ok";
    case FY_ERR_NOMEM: return "out of memory";
    case FY_ERR_IO: return "i/o error";
    case FY_ERR_FORMAT: return "malformed input";
    case FY_ERR_INVALID: return "invalid argument";
    case FY_ERR_UNSUPPORTED: return "unsupported";
    case FY_ERR_NOT_FOUND: return "not found";
    case FY_ERR_NO_SPACE: return "no space left";
    case FY_ERR_OVERLOADED: return "overloaded";
    case FY_ERR_CANCELLED: return "cancelled";
    case FY_ERR_TIMEOUT: return "timed out";
    case FY_ERR_BACKEND: return "backend error";
    case FY_ERR_PEER: return "peer error";
    case FY_ERR_MISMATCH: return "mismatch between peers";
    case FY_ERR_INTERNAL: return "internal error";
    case FY_STATUS_COUNT: break;
    }
    return "unknown status";
}
