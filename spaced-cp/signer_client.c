/* signer_client.c — starts spaced-cp-signer and asks it questions (one at a
 * time, under signer_mu; a signer that died is started again and asked once
 * more). This file never sees a secret key: the signer answers with tokens and
 * public keys only. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cp.h"
#include "spaced_error.h"

#define SIGNER_MSG_MAX 16384

int cp_signer_start(struct cp *cp)
{
	int sv[2];
	char exe[PATH_MAX], signer[PATH_MAX + 32], keys[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n < 0)
		return SPACED_ESYS;
	exe[n] = 0;
	char *slash = strrchr(exe, '/');
	if (slash == NULL)
		return SPACED_ESYS;
	*slash = 0;
	const char *env = getenv("SPACED_CP_SIGNER");
	snprintf(signer, sizeof signer, "%s", env != NULL ? env : exe);
	if (env == NULL)
		snprintf(signer, sizeof signer, "%s/spaced-cp-signer", exe);
	snprintf(keys, sizeof keys, "%s/signer.keys", cp->state_dir);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return SPACED_ESYS;
	pid_t pid = fork();
	if (pid < 0) {
		close(sv[0]);
		close(sv[1]);
		return SPACED_ESYS;
	}
	if (pid == 0) {
		if (dup2(sv[1], 3) < 0)
			_exit(127);
		execl(signer, "spaced-cp-signer", "--keys", keys, (char *)NULL);
		fprintf(stderr, "spaced-cp: cannot start %s: %s\n", signer, strerror(errno));
		_exit(127);
	}
	close(sv[1]);
	cp->signer_fd = sv[0];
	cp->signer_pid = pid;
	return 0;
}

void cp_signer_stop(struct cp *cp)
{
	if (cp->signer_fd >= 0)
		close(cp->signer_fd);
	cp->signer_fd = -1;
	if (cp->signer_pid > 0)
		waitpid(cp->signer_pid, NULL, 0);
	cp->signer_pid = 0;
}

int cp_signer_ask(struct cp *cp, char type, const char *payload, char **answer)
{
	size_t n = payload ? strlen(payload) : 0;
	int r;
	char *buf = malloc(SIGNER_MSG_MAX + 1);
	if (buf == NULL)
		return SPACED_ENOMEM;
	if (n + 1 > SIGNER_MSG_MAX) {
		r = SPACED_ETOOBIG;
		goto out;
	}
	buf[0] = type;
	if (n > 0)
		memcpy(buf + 1, payload, n);
	pthread_mutex_lock(&cp->signer_mu);
	ssize_t got = -1;
	for (int attempt = 0; attempt < 2 && got <= 0; attempt++) {
		if (attempt > 0) {
			/* the signer died: start it again (it reloads its keys) and ask once more */
			cp_signer_stop(cp);
			if (cp_signer_start(cp) < 0)
				break;
			buf[0] = type;
			if (n > 0)
				memcpy(buf + 1, payload, n);
		}
		got = send(cp->signer_fd, buf, n + 1, MSG_NOSIGNAL);
		if (got == (ssize_t)(n + 1)) {
			do
				got = recv(cp->signer_fd, buf, SIGNER_MSG_MAX, 0);
			while (got < 0 && errno == EINTR);
		} else {
			got = -1;
		}
	}
	pthread_mutex_unlock(&cp->signer_mu);
	if (got <= 0) {
		r = SPACED_ECLOSED;
		goto out;
	}
	if (buf[0] != 0) {
		r = -(int)(uint8_t)buf[0];
		goto out;
	}
	buf[got] = 0;
	char *s = strdup(buf + 1);
	if (s == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	*answer = s;
	r = 0;
out:
	free(buf);
	return r;
}
