/*
 * log.h — the log lines of spaced's daemons.
 *
 * A line is written in logfmt ("level=info event=stream-cut sandbox=S
 * reason=\"the client does not read\"") by the daemon; spaced_log() prefixes
 * it with the component ("sbx-manager: …") in text form, or turns it into one
 * JSON object per line in JSON form (chosen by spaced_log_set_format, or on
 * first use from SPACED_LOG_FORMAT):
 *   {"time":"2026-12-01T16:30:00.123Z","component":"sbx-manager","level":"info",…}
 * A line that is not logfmt becomes {"time","component","msg"}. The form is
 * chosen once per process (spaced_log_init) and inherited by the programs a
 * daemon starts through SPACED_LOG_FORMAT in their environment.
 */
#ifndef SPACED_LOG_H
#define SPACED_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

enum spaced_log_format { SPACED_LOG_TEXT = 0, SPACED_LOG_JSON = 1 };

/* "text" or "json" into *out; -1 for anything else. */
int spaced_log_format_parse(const char *s, enum spaced_log_format *out);

/* Sets this process's form; SPACED_LOG_FORMAT in the environment is set to
 * match, so that programs started from here log the same way. */
void spaced_log_set_format(enum spaced_log_format f);

/* The form from SPACED_LOG_FORMAT (text when unset or unknown). */
enum spaced_log_format spaced_log_format_from_env(void);

/* This process's form (on first use: from SPACED_LOG_FORMAT). */
enum spaced_log_format spaced_log_get_format(void);

/* Writes one line for component on stderr, in the process's form. */
void spaced_log(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void spaced_vlog(const char *component, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* The JSON object (one line, no newline; free() it) of a logfmt line, with
 * time (Unix ms, formatted as RFC 3339 UTC) and component. NULL on ENOMEM. */
char *spaced_logfmt_to_json(const char *component, const char *line, long long unix_ms);

/* Rewrites, in the string s (cap bytes), every control byte (below 0x20,
 * and 0x7f) as text: \n, \r, \t, or \xNN (cut at cap - 1). A line made of
 * what a tenant chose (a path in a reason) stays one line: no forged line
 * follows it. spaced_vlog does it to every line; a daemon that writes its
 * own lines does it too. */
void spaced_log_escape_controls(char *s, size_t cap);

#endif
