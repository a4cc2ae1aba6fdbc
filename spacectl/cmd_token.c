/* spacectl token — plain PASETO v4.public on any payload. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "spaced_error.h"
#include "paserk.h"
#include "paseto.h"
#include "signer.h"
#include "util.h"

#define PAYLOAD_MAX (1u << 20)

static int token_keygen(int argc, char **argv)
{
	int json = argc > 1 && strcmp(argv[1], "--json") == 0;
	if (argc > 1 + json)
		return cli_usage("usage: spacectl token keygen [--json]\n");
	struct spaced_secret_key *sk;
	struct spaced_public_key pk;
	char sec[SPACED_PASERK_SECRET_LEN + 1], pub[SPACED_PASERK_PUBLIC_LEN + 1], pid[SPACED_PASERK_PID_LEN + 1];
	if (spaced_secret_key_generate(&sk) < 0)
		return cli_fail("token keygen", "out of memory");
	spaced_secret_key_to_paserk(sk, sec);
	spaced_secret_key_public(sk, &pk);
	spaced_paserk_public_encode(&pk, pub);
	spaced_paserk_pid(&pk, pid);
	if (json)
		printf("{\"secret\":\"%s\",\"public\":\"%s\",\"kid\":\"%s\"}\n", sec, pub, pid);
	else
		printf("secret: %s\npublic: %s\nkid:    %s\n", sec, pub, pid);
	spaced_wipe(sec, sizeof sec);
	spaced_secret_key_free(sk);
	return 0;
}

struct token_opts {
	const char *key, *footer, *implicit, *arg;
};

static int parse_opts(int argc, char **argv, struct token_opts *o)
{
	static const struct option longopts[] = {
		{"key", required_argument, NULL, 'k'},
		{"footer", required_argument, NULL, 'f'},
		{"implicit", required_argument, NULL, 'i'},
		{NULL, 0, NULL, 0},
	};
	int c;
	memset(o, 0, sizeof *o);
	optind = 1;
	while ((c = getopt_long(argc, argv, "+k:f:i:", longopts, NULL)) != -1) {
		switch (c) {
		case 'k': o->key = optarg; break;
		case 'f': o->footer = optarg; break;
		case 'i': o->implicit = optarg; break;
		default: return -1;
		}
	}
	if (o->key == NULL || optind != argc - 1)
		return -1;
	o->arg = argv[optind];
	return 0;
}

/* The argument itself, or standard input when it is "-". */
static char *arg_or_stdin(const char *arg, size_t *len)
{
	if (strcmp(arg, "-") != 0) {
		*len = strlen(arg);
		return strdup(arg);
	}
	return cli_read_stdin(PAYLOAD_MAX, len);
}

static int token_sign(int argc, char **argv)
{
	struct token_opts o;
	if (parse_opts(argc, argv, &o) < 0)
		return cli_usage("usage: spacectl token sign --key k4.secret.… [--footer F] [--implicit I] PAYLOAD|-\n");
	struct spaced_secret_key *sk = NULL;
	int r = spaced_secret_key_from_paserk(&sk, o.key, strlen(o.key));
	if (r < 0)
		return cli_fail("token sign", "--key: %s", spaced_strerror(r));
	size_t mlen;
	char *msg = arg_or_stdin(o.arg, &mlen), *token = NULL;
	if (msg == NULL) {
		spaced_secret_key_free(sk);
		return cli_fail("token sign", "cannot read the payload");
	}
	r = spaced_paseto_sign(sk, (const uint8_t *)msg, mlen, (const uint8_t *)o.footer,
	                       o.footer ? strlen(o.footer) : 0, (const uint8_t *)o.implicit,
	                       o.implicit ? strlen(o.implicit) : 0, &token);
	spaced_secret_key_free(sk);
	free(msg);
	if (r < 0)
		return cli_fail("token sign", "%s", spaced_strerror(r));
	printf("%s\n", token);
	free(token);
	return 0;
}

static int token_verify(int argc, char **argv)
{
	struct token_opts o;
	if (parse_opts(argc, argv, &o) < 0)
		return cli_usage("usage: spacectl token verify --key k4.public.… [--footer F] [--implicit I] TOKEN|-\n");
	struct spaced_public_key pk;
	int r = spaced_paserk_public_decode(&pk, o.key, strlen(o.key));
	if (r < 0)
		return cli_fail("token verify", "--key: %s", spaced_strerror(r));
	size_t tlen;
	char *token = arg_or_stdin(o.arg, &tlen);
	if (token == NULL)
		return cli_fail("token verify", "cannot read the token");
	if (strcmp(o.arg, "-") == 0 && tlen > 0 && token[tlen - 1] == '\n')
		token[--tlen] = 0; /* a token piped in ends with one newline */
	uint8_t *msg = NULL;
	size_t mlen = 0;
	r = spaced_paseto_verify(token, tlen, pk.pk, (const uint8_t *)o.footer,
	                         o.footer ? strlen(o.footer) : 0, (const uint8_t *)o.implicit,
	                         o.implicit ? strlen(o.implicit) : 0, &msg, &mlen);
	free(token);
	if (r < 0)
		return cli_fail("token verify", "%s (%s)", spaced_strerror(r), spaced_errname(r));
	fwrite(msg, 1, mlen, stdout);
	putchar('\n');
	free(msg);
	return 0;
}

int cmd_token(int argc, char **argv)
{
	static const char u[] = "usage: spacectl token keygen|sign|verify …\n";
	if (argc < 2)
		return cli_usage(u);
	if (strcmp(argv[1], "keygen") == 0)
		return token_keygen(argc - 1, argv + 1);
	if (strcmp(argv[1], "sign") == 0)
		return token_sign(argc - 1, argv + 1);
	if (strcmp(argv[1], "verify") == 0)
		return token_verify(argc - 1, argv + 1);
	return cli_usage(u);
}
