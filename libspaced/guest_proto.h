/*
 * guest_proto.h — message types and field layouts of the guest protocol
 * spoken by spaced-guest (docs/guest-protocol.md is the full description).
 *
 * Frames follow frame.h. A requester opens a stream by sending a request type
 * with a fresh non-zero id; all answers carry that id and the last one is a
 * RESULT frame with SPACED_FRAME_F_END, which carries the status, a message
 * and the canonical text of the serving execution identity.
 */
#ifndef SPACED_GUEST_PROTO_H
#define SPACED_GUEST_PROTO_H

/* Requests (requester -> guest); each opens a stream under a new id. */
enum spaced_guest_req {
	SPACED_GUEST_HELLO = 0x0001,       /* (none) */
	SPACED_GUEST_FS_READ = 0x0010,     /* s path, u offset, u length (UINT64_MAX: to the end) */
	SPACED_GUEST_FS_WRITE = 0x0011,    /* s path, u mode, u flags; then DATA frames, last with END */
	SPACED_GUEST_FS_LIST = 0x0012,     /* s path, u depth (>= 1) */
	SPACED_GUEST_FS_STAT = 0x0013,     /* s path */
	SPACED_GUEST_FS_MKDIR = 0x0014,    /* s path, u mode (creates parents) */
	SPACED_GUEST_FS_MOVE = 0x0015,     /* s from, s to */
	SPACED_GUEST_FS_REMOVE = 0x0016,   /* s path, u recursive */
	SPACED_GUEST_EXEC = 0x0020,        /* u argc, s argv..., u envc, s env..., s cwd, u timeout_ms, u flags */
	SPACED_GUEST_PROC_LIST = 0x0021,   /* (none) */
	SPACED_GUEST_PROC_ATTACH = 0x0022, /* u proc */
	SPACED_GUEST_PROC_SIGNAL = 0x0023, /* u proc, i signal */
	SPACED_GUEST_PROC_KILL = 0x0024,   /* u proc */
	SPACED_GUEST_TERM_OPEN = 0x0030,   /* u argc, s argv..., u envc, s env..., s cwd, u rows, u cols */
	SPACED_GUEST_WATCH = 0x0040,       /* s path */
};

/* Stream input (requester -> guest) on an open stream id. */
enum spaced_guest_in {
	SPACED_GUEST_IN_DATA = 0x0100,   /* raw bytes of FS_WRITE; END flag commits */
	SPACED_GUEST_IN_STDIN = 0x0101,  /* raw bytes for EXEC (flag STDIN) or TERM; END closes */
	SPACED_GUEST_IN_RESIZE = 0x0102, /* u rows, u cols (TERM) */
	SPACED_GUEST_IN_CANCEL = 0x0103, /* (none): ends WATCH, kills EXEC/TERM, aborts READ/WRITE */
	SPACED_GUEST_IN_SIGNAL = 0x0104, /* i signal: sent to a foreground EXEC's process group */
};

/* Answers (guest -> requester). */
enum spaced_guest_out {
	SPACED_GUEST_OUT_RESULT = 0x0200,  /* END: i status, s message, s identity, extras */
	SPACED_GUEST_OUT_DATA = 0x0201,    /* raw file bytes (FS_READ) */
	SPACED_GUEST_OUT_STDOUT = 0x0202,  /* raw bytes (EXEC, ATTACH, TERM output) */
	SPACED_GUEST_OUT_STDERR = 0x0203,  /* raw bytes */
	SPACED_GUEST_OUT_STARTED = 0x0204, /* u proc, u pid */
	SPACED_GUEST_OUT_ENTRIES = 0x0205, /* repeated: s path, u type, u size, u mode, i mtime */
	SPACED_GUEST_OUT_EVENT = 0x0206,   /* u kind, s path, s path2 (move target) */
	SPACED_GUEST_OUT_PROCS = 0x0207,   /* repeated: u proc, u pid, u running, i exit, i signal, s argv0 */
};

/* FS_WRITE flags. */
#define SPACED_GUEST_WRITE_MKDIRS 0x1u
/* EXEC flags. */
#define SPACED_GUEST_EXEC_BACKGROUND 0x1u
#define SPACED_GUEST_EXEC_STDIN 0x2u

/* File types in ENTRIES and the FS_STAT result. */
enum spaced_guest_ftype {
	SPACED_GUEST_FT_FILE = 1,
	SPACED_GUEST_FT_DIR = 2,
	SPACED_GUEST_FT_SYMLINK = 3,
	SPACED_GUEST_FT_OTHER = 4,
};

/* EVENT kinds. */
enum spaced_guest_event {
	SPACED_GUEST_EV_CREATE = 1,
	SPACED_GUEST_EV_MODIFY = 2,
	SPACED_GUEST_EV_DELETE = 3,
	SPACED_GUEST_EV_MOVE = 4, /* path -> path2; one side is "" when it lies outside the watch */
	SPACED_GUEST_EV_OVERFLOW = 5,
};

/* The transport port that carries this protocol (CONNECT 1024 / CONN 1024). */
#define SPACED_GUEST_API_PORT 1024

/* Limits. */
#define SPACED_GUEST_MAX_ARGS 1024
#define SPACED_GUEST_PATH_MAX 4096
#define SPACED_GUEST_RING 65536 /* output kept per background process and stream */

#endif
