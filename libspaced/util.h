/*
 * util.h — small helpers shared by every spaced module: bounded buffers,
 * constant-time comparison, wiping of secrets, strict base64url, RFC 3339 time.
 */
#ifndef SPACED_UTIL_H
#define SPACED_UTIL_H

#include <dirent.h>
#include <sys/types.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer that never grows past `max` bytes. The contents stay
 * NUL-terminated (one byte beyond len) so text can be handed to C strings. */
struct spaced_buf {
	uint8_t *data;
	size_t len;
	size_t cap;
	size_t max;
};

/* Starts an empty buffer limited to `max` bytes of content. Allocates nothing. */
void spaced_buf_init(struct spaced_buf *b, size_t max);

/* Makes room for `extra` more bytes. Returns 0, SPACED_ETOOBIG when len+extra
 * would pass the limit, or SPACED_ENOMEM. */
int spaced_buf_reserve(struct spaced_buf *b, size_t extra);

/* Appends `n` bytes (same errors as spaced_buf_reserve; nothing is appended on error). */
int spaced_buf_append(struct spaced_buf *b, const void *p, size_t n);

/* Appends a C string without its NUL. */
int spaced_buf_puts(struct spaced_buf *b, const char *s);

/* Appends an unsigned 64-bit integer in little-endian byte order. */
int spaced_buf_put_le64(struct spaced_buf *b, uint64_t v);

/* Wipes and releases the contents; the buffer may be reused after spaced_buf_init. */
void spaced_buf_free(struct spaced_buf *b);

/* Hands the contents to the caller (NUL-terminated, to be free()d) and resets b. */
uint8_t *spaced_buf_take(struct spaced_buf *b, size_t *len);

/* Constant-time equality of two byte strings of the same length n. */
bool spaced_ct_eq(const void *a, const void *b, size_t n);

/* Constant-time equality of two byte strings whose lengths may differ: the
 * lengths are compared in the open (they are not secret), the bytes in constant time. */
bool spaced_ct_eq_len(const void *a, size_t alen, const void *b, size_t blen);

/* FNV-1a of the string s: a hash for tables keyed by names (not for
 * anything an attacker must not steer: it is not keyed). */
uint32_t spaced_fnv1a(const char *s);

/* The rule that shares one capacity among tenants (a worker's streams,
 * node-api's answer memory): 0 when a tenant holding mine, while in_use of
 * cap is in use in all, may take more; 1 once half of cap is in use and it
 * holds an eighth (one tenant holds half at most); 2 once three quarters are
 * in use and it holds a 128th of cap or few (whichever is more): the last
 * quarter stays for those holding little. */
int spaced_fair_share(size_t in_use, size_t cap, size_t mine, size_t few);

/* Overwrites n bytes at p with zeros in a way the compiler cannot elide. */
void spaced_wipe(void *p, size_t n);

/* Length of the unpadded base64url encoding of n bytes. */
size_t spaced_b64url_encoded_len(size_t n);

/* Upper bound of the decoded length of an encoding of n characters. */
size_t spaced_b64url_decoded_max(size_t n);

/* Encodes n bytes as unpadded base64url into out (room for
 * spaced_b64url_encoded_len(n)+1 bytes, NUL-terminated). */
void spaced_b64url_encode(char *out, const uint8_t *in, size_t n);

/* Strict unpadded base64url decoding of public data (not constant-time): the whole input must be consumed; padding,
 * other alphabets, whitespace, a length of 1 mod 4 and non-zero trailing bits are
 * all rejected with SPACED_EBASE64. out must hold spaced_b64url_decoded_max(n)
 * bytes; *outlen receives the decoded length on success. */
int spaced_b64url_decode(uint8_t *out, size_t *outlen, const char *in, size_t n);

/* The same strict decoding in constant time, for secrets (k4.secret). */
int spaced_b64url_decode_secret(uint8_t *out, size_t *outlen, const char *in, size_t n);

/* Parses an RFC 3339 date-time ("2026-11-30T14:00:00Z", "…+01:00", optional
 * fraction of a second, which is truncated) into Unix seconds. Anything else,
 * including out-of-range fields, is SPACED_EFORMAT. */
int spaced_time_parse(const char *s, size_t n, int64_t *out);

/* Formats Unix seconds as "YYYY-MM-DDTHH:MM:SSZ" into out (at least 21 bytes).
 * Returns 0, or SPACED_EINVAL for years outside 0000–9999. */
int spaced_time_format(int64_t t, char out[21]);

/* Writes a formatted one-line reason into why (whysz bytes, truncated) when
 * why is not NULL: the "why" buffers that fallible system-facing calls fill. */
void spaced_why(char *why, size_t whysz, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Replaces, in the string s (cap bytes), every occurrence of from (not
 * empty) by to; what no longer fits is cut at cap - 1. For a reason that
 * names host paths: the reader is told its own. */
void spaced_str_replace(char *s, size_t cap, const char *from, const char *to);

/* Makes s valid UTF-8 in place: every byte that does not begin or continue
 * a well-formed sequence (a cut one at the end included) becomes '?'. */
void spaced_utf8_clean(char *s);

/* The current wall-clock time in Unix seconds. */
int64_t spaced_now(void);

/* A monotonic clock reading in nanoseconds (for measurements, never for validity). */
uint64_t spaced_mono_ns(void);

/* The names in the open directory d, without "." and "..", sorted bytewise
 * (strcmp: the canonical order of tree walks, treehash.h): *names holds *n
 * strings of its own (spaced_dir_names_free). Returns 0, SPACED_ENOMEM or
 * SPACED_EIO (readdir failed); on failure nothing is left to free. */
int spaced_dir_names(DIR *d, char ***names, size_t *n);
void spaced_dir_names_free(char **names, size_t n);

/* Replaces path with p[0..n) through tmp (a name in the same file system)
 * and a rename: a reader sees the old content or the new, never a torn one.
 * tmp is reused when it exists — spaced_file_prepare() made it earlier —
 * so that a write on a hot path allocates no inode (on ext4 without a
 * journal, an allocation scans every inode freed in the last minutes of its
 * group: milliseconds on a worker that creates and deletes sandboxes).
 * An existing path is swapped with tmp (RENAME_EXCHANGE): tmp then holds
 * the old content. Not durable, the new content may be lost in a crash
 * (a file derived again at start); durable: fsync before the swap.
 * mode: of a tmp made here. Returns 0 or SPACED_EIO (tmp removed). */
int spaced_file_replace(const char *tmp, const char *path, const void *p, size_t n, unsigned mode, bool durable);

/* openat(2) of path beneath dirfd (AT_FDCWD: the working directory) that
 * follows no symlink on the way nor at its end and never leaves dirfd
 * (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
 * O_NOFOLLOW and O_CLOEXEC added to flags): for paths in a tree a tenant
 * made. -1 with errno (ELOOP for a symlink, EXDEV for a way out). */
int spaced_open_beneath(int dirfd, const char *path, int flags);

/* Creates tmp empty (with mode) when it does not exist, for a later
 * spaced_file_replace(); best effort. */
void spaced_file_prepare(const char *tmp, unsigned mode);

/* Copies [off, off + len) of in to the same offsets of out: copy_file_range
 * (reflinks or in-kernel copies where the filesystem has them), read and
 * write where it cannot serve these two files (another filesystem: EXDEV).
 * 0, or SPACED_ESYS with errno set. Stops early, with 0, where in ends.
 * Copied a few MiB at a time through pace (pace.h; NULL: none). */
struct spaced_pace;
int spaced_copy_range(int in, int out, off_t off, off_t len, struct spaced_pace *pace);

/* Sets the nice value of pid's session as the scheduler sees it: its
 * autogroup (/proc/PID/autogroup). With autogroups on, the kernel weighs
 * each session of the root CPU cgroup as one, so a process's own nice value
 * only ranks it among its session's processes. Best effort: nothing happens
 * on a kernel without autogroups, nor for a process in a CPU cgroup of its
 * own (autogroups apply to the root CPU cgroup only). A negative value needs
 * CAP_SYS_NICE. */
void spaced_session_nice(pid_t pid, int nice);

#endif
