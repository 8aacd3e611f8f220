/*
 * status.h - the one status enum of ferry.
 *
 * Every function that can fail returns an fy_status_t; results travel
 * through out-pointers (named *_p) that are set only on success.  Foreign
 * error codes (errno, CUDA, UCX, nng, msgpack) are translated at the
 * boundary, and the function that first sees the error logs its cause.
 */
#ifndef FY_STATUS_H
#define FY_STATUS_H

typedef enum fy_status {
    FY_OK = 0,
    FY_ERR_NOMEM,       /* an allocation failed */
    FY_ERR_IO,          /* a system call on a file or socket failed */
    FY_ERR_FORMAT,      /* malformed input: model file, message, config */
    FY_ERR_INVALID,     /* an argument or parameter out of its range */
    FY_ERR_UNSUPPORTED, /* well-formed, but not something ferry handles */
    FY_ERR_NOT_FOUND,   /* a named thing (key, tensor, file) is absent */
    FY_ERR_NO_SPACE,    /* a fixed-size pool (KV blocks, queue) is full */
    FY_ERR_OVERLOADED,  /* refused at admission: the server is too busy */
    FY_ERR_CANCELLED,   /* the request was cancelled */
    FY_ERR_TIMEOUT,     /* a deadline passed */
    FY_ERR_BACKEND,     /* a compute backend (CUDA, ...) failed */
    FY_ERR_PEER,        /* a remote peer failed or disconnected */
    FY_ERR_MISMATCH,    /* two sides disagree: KV layout, protocol version, model */
    FY_ERR_INTERNAL,    /* an invariant broke: a bug in ferry */
    FY_STATUS_COUNT
} fy_status_t;

/* A short lowercase description of a status; never NULL. */
const char *fy_status_str(fy_status_t status);

#endif /* FY_STATUS_H */
