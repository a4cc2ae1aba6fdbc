/*
 * spaced-cp-signer — the only process of the control plane that holds Ed25519
 * secret keys (C2). spaced-cp starts it with one end of a SOCK_SEQPACKET
 * socketpair on fd 3 and asks it a fixed table of questions:
 *
 *   'S' + capability claims JSON  → token signed by the active key
 *   'K'                           → {"keys":[{"key","kid","state","created"}]}  (public halves only)
 *   'R'                           → a new pending key (one at most); answers like 'K'
 *   'A' + kid                     → the pending key kid becomes the active one; the
 *                                   previous active key is wiped (its public half stays
 *                                   in the control plane's bundle until its tokens expire)
 *
 * Answers are one byte of status (0 = ok, else -SPACED_E*) followed by the payload.
 * Unknown types and malformed requests get an error status; the signer never
 * signs anything but capability claims that pass spaced_cap_claims_decode (so
 * never a lifetime over 120 s). Keys are kept in sodium_malloc'd memory and
 * persisted as k4.secret lines in a 0600 file, so a restart keeps them.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "cap.h"
#include "spaced_error.h"
#include "paserk.h"
#include "signer.h"
#include "util.h"

#define SIGNER_MSG_MAX 16384
#define MAX_KEYS 4

enum key_state { KEY_PENDING, KEY_ACTIVE };

struct held_key {
	struct spaced_secret_key *sk;
	struct spaced_public_key pk;
	char kid[SPACED_PASERK_PID_LEN + 1];
	enum key_state state;
	int64_t created;
};

static struct held_key keys[MAX_KEYS];
static int nkeys;
static const char *key_path;

/* The key file: one line per key, "<active|pending> <created> <k4.secret.…>",
 * written to a temporary file, synced, then renamed over the old one. Every
 * buffer that held a secret is wiped. */
static int keys_save(void)
{
	char tmp[4096], line[160];
	int r = SPACED_EIO, fd;
	snprintf(tmp, sizeof tmp, "%s.tmp", key_path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return SPACED_EIO;
	for (int i = 0; i < nkeys; i++) {
		char sec[SPACED_PASERK_SECRET_LEN + 1];
		spaced_secret_key_to_paserk(keys[i].sk, sec);
		int n = snprintf(line, sizeof line, "%s %lld %s\n", keys[i].state == KEY_ACTIVE ? "active" : "pending",
		                 (long long)keys[i].created, sec);
		sodium_memzero(sec, sizeof sec);
		ssize_t w = (n > 0 && (size_t)n < sizeof line) ? write(fd, line, (size_t)n) : -1;
		sodium_memzero(line, sizeof line);
		if (w != n)
			goto out;
	}
	if (fsync(fd) < 0)
		goto out;
	close(fd);
	fd = -1;
	if (rename(tmp, key_path) < 0)
		goto out;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	return r;
}

static int key_add(struct spaced_secret_key *sk, enum key_state st, int64_t created)
{
	if (nkeys == MAX_KEYS) {
		spaced_secret_key_free(sk);
		return SPACED_ETOOBIG;
	}
	struct held_key *k = &keys[nkeys++];
	k->sk = sk;
	spaced_secret_key_public(sk, &k->pk);
	spaced_paserk_pid(&k->pk, k->kid);
	k->state = st;
	k->created = created;
	return 0;
}

static int keys_load(void)
{
	static char text[8193];
	int r = SPACED_EIO;
	struct stat sb;
	ssize_t n = 0;
	int fd = open(key_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		if (errno != ENOENT)
			return SPACED_EIO;
		struct spaced_secret_key *sk;
		if ((r = spaced_secret_key_generate(&sk)) < 0)
			return r;
		if ((r = key_add(sk, KEY_ACTIVE, spaced_now())) < 0)
			return r;
		return keys_save();
	}
	if (fstat(fd, &sb) < 0 || (sb.st_mode & 077) != 0 || sb.st_size >= (off_t)sizeof text - 1) {
		fprintf(stderr, "spaced-cp-signer: %s must be a private file (0600) of at most 8 KiB\n", key_path);
		goto out;
	}
	while (n < (ssize_t)sizeof text - 1) {
		ssize_t got = read(fd, text + n, sizeof text - 1 - (size_t)n);
		if (got < 0)
			goto out;
		if (got == 0)
			break;
		n += got;
	}
	text[n] = 0;
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *s2 = NULL, *state = strtok_r(line, " ", &s2), *created = strtok_r(NULL, " ", &s2),
		     *sec = strtok_r(NULL, " ", &s2);
		struct spaced_secret_key *sk;
		r = SPACED_EFORMAT;
		if (state == NULL || created == NULL || sec == NULL || strtok_r(NULL, " ", &s2) != NULL)
			goto out;
		if ((r = spaced_secret_key_from_paserk(&sk, sec, strlen(sec))) < 0)
			goto out;
		if ((r = key_add(sk, strcmp(state, "active") == 0 ? KEY_ACTIVE : KEY_PENDING, atoll(created))) < 0)
			goto out;
	}
	r = nkeys > 0 ? 0 : SPACED_EFORMAT;
out:
	sodium_memzero(text, sizeof text);
	close(fd);
	return r;
}

static struct held_key *active_key(void)
{
	for (int i = 0; i < nkeys; i++)
		if (keys[i].state == KEY_ACTIVE)
			return &keys[i];
	return NULL;
}

static char *keys_json(void)
{
	json_t *arr = json_array();
	for (int i = 0; arr != NULL && i < nkeys; i++) {
		char pub[SPACED_PASERK_PUBLIC_LEN + 1];
		spaced_paserk_public_encode(&keys[i].pk, pub);
		json_array_append_new(arr, json_pack("{s:s,s:s,s:s,s:I}", "key", pub, "kid", keys[i].kid, "state",
		                                     keys[i].state == KEY_ACTIVE ? "active" : "pending",
		                                     "created", (json_int_t)keys[i].created));
	}
	json_t *root = json_pack("{s:o}", "keys", arr);
	char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
	json_decref(root);
	return s;
}

static int do_sign(const uint8_t *p, size_t n, char **out)
{
	struct spaced_cap cap;
	struct held_key *k = active_key();
	int r = spaced_cap_claims_decode(&cap, p, n);
	if (r < 0)
		return r;
	if (k == NULL)
		return SPACED_ENOENT;
	return spaced_cap_issue(k->sk, &cap, out);
}

static int do_rotate(void)
{
	for (int i = 0; i < nkeys; i++)
		if (keys[i].state == KEY_PENDING)
			return 0; /* one pending key at most: rotating again repeats it */
	struct spaced_secret_key *sk;
	int r = spaced_secret_key_generate(&sk);
	if (r < 0)
		return r;
	if ((r = key_add(sk, KEY_PENDING, spaced_now())) < 0)
		return r;
	return keys_save();
}

static int do_activate(const uint8_t *p, size_t n)
{
	int idx = -1;
	for (int i = 0; i < nkeys; i++)
		if (keys[i].state == KEY_PENDING && strlen(keys[i].kid) == n && memcmp(keys[i].kid, p, n) == 0)
			idx = i;
	if (idx < 0)
		return SPACED_ENOENT;
	struct held_key keep = keys[idx];
	for (int i = 0; i < nkeys; i++)
		if (i != idx)
			spaced_secret_key_free(keys[i].sk);
	keep.state = KEY_ACTIVE;
	keys[0] = keep;
	nkeys = 1;
	return keys_save();
}

static void answer(int fd, int status, const char *payload)
{
	size_t n = payload ? strlen(payload) : 0;
	uint8_t *buf = malloc(n + 1);
	if (buf == NULL)
		return;
	buf[0] = (uint8_t)(-status);
	if (n > 0)
		memcpy(buf + 1, payload, n);
	(void)send(fd, buf, n + 1, MSG_NOSIGNAL);
	free(buf);
}

int main(int argc, char **argv)
{
	static uint8_t msg[SIGNER_MSG_MAX];
	int fd = 3;
	if (argc != 3 || strcmp(argv[1], "--keys") != 0) {
		fprintf(stderr, "usage: spaced-cp-signer --keys FILE  (started by spaced-cp, fd 3 a socketpair)\n");
		return 2;
	}
	key_path = argv[2];
	/* Not dumpable: no ptrace or /proc/PID/mem reading by other processes of the same user. */
	prctl(PR_SET_DUMPABLE, 0);
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (sodium_init() < 0)
		return 1;
	umask(077);
	int r = keys_load();
	if (r < 0) {
		fprintf(stderr, "spaced-cp-signer: cannot load keys from %s: %s\n", key_path, spaced_strerror(r));
		return 1;
	}
	for (;;) {
		ssize_t got = recv(fd, msg, sizeof msg, 0);
		if (got <= 0) {
			if (got < 0 && errno == EINTR)
				continue;
			break;
		}
		char *out = NULL;
		switch (msg[0]) {
		case 'S':
			r = do_sign(msg + 1, (size_t)got - 1, &out);
			break;
		case 'K':
			r = got == 1 ? 0 : SPACED_EPROTO;
			break;
		case 'R':
			r = got == 1 ? do_rotate() : SPACED_EPROTO;
			break;
		case 'A':
			r = do_activate(msg + 1, (size_t)got - 1);
			break;
		default:
			r = SPACED_EPROTO;
			break;
		}
		if (r == 0 && msg[0] != 'S')
			out = keys_json();
		answer(fd, r == 0 && out == NULL ? SPACED_ENOMEM : r, r == 0 ? out : NULL);
		free(out);
	}
	for (int i = 0; i < nkeys; i++)
		spaced_secret_key_free(keys[i].sk);
	return 0;
}
