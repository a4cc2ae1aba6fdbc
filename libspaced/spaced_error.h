/*
 * spaced_error.h — the one error space of spaced (not glibc's <error.h>, which a
 * header of this name in the include path would hide).
 *
 * Every fallible function returns int: 0 on success, a negative SPACED_E* code
 * on failure. Output parameters are written only on success.
 */
#ifndef SPACED_ERROR_H
#define SPACED_ERROR_H

#define SPACED_ERRORS(X)                                                    \
	X(SPACED_OK,            0, "success")                                 \
	X(SPACED_ENOMEM,       -1, "out of memory")                           \
	X(SPACED_EINVAL,       -2, "invalid argument")                        \
	X(SPACED_ETOOBIG,      -3, "input exceeds its size limit")            \
	X(SPACED_EFORMAT,      -4, "malformed token")                         \
	X(SPACED_EHEADER,      -5, "wrong token version or purpose")          \
	X(SPACED_EBASE64,      -6, "invalid base64url encoding")              \
	X(SPACED_ESIG,         -7, "bad signature")                           \
	X(SPACED_EFOOTER,      -8, "footer mismatch")                         \
	X(SPACED_EKEY,         -9, "malformed key")                           \
	X(SPACED_EKEYTYPE,    -10, "wrong key version or type")               \
	X(SPACED_EUNKNOWNKEY, -11, "unknown key")                             \
	X(SPACED_EEXPIRED,    -12, "expired")                                 \
	X(SPACED_ENOTYET,     -13, "not yet valid")                           \
	X(SPACED_ECLAIM,      -14, "missing or invalid claim")                \
	X(SPACED_EJSON,       -15, "malformed JSON")                          \
	X(SPACED_EPURPOSE,    -16, "wrong purpose")                           \
	X(SPACED_EIO,         -17, "input/output error")                      \
	X(SPACED_ENOENT,      -18, "not found")                               \
	X(SPACED_EEXIST,      -19, "already exists")                          \
	X(SPACED_EPROTO,      -20, "protocol error")                          \
	X(SPACED_EPERM,       -21, "permission denied")                       \
	X(SPACED_ESYS,        -22, "system call failed")                      \
	X(SPACED_ECLOSED,     -23, "connection closed")                       \
	X(SPACED_ETIMEDOUT,   -24, "timed out")                               \
	X(SPACED_EIDENTITY,   -25, "execution identity mismatch")             \
	X(SPACED_EPEER,       -26, "peer verification failed")                \
	X(SPACED_EBUSY,       -27, "busy")                                    \
	X(SPACED_ESTALE,      -28, "stale state")

enum spaced_error {
#define SPACED_ERR_ENUM(name, val, str) name = (val),
	SPACED_ERRORS(SPACED_ERR_ENUM)
#undef SPACED_ERR_ENUM
};

/* Human-readable text for an error code; never NULL ("unknown error" for codes
 * outside the table). The string is static. */
const char *spaced_strerror(int err);

/* Short machine-readable name of an error code ("SPACED_ESIG"); never NULL. */
const char *spaced_errname(int err);

#endif
