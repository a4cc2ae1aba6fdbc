/* spacectl cap — issue, inspect and check capabilities. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include "cap.h"
#include "cli.h"
#include "compare.h"
#include "spaced_error.h"
#include "keyring.h"
#include "paserk.h"
#include "paseto.h"
#include "signer.h"
#include "util.h"

struct cap_opts {
	const char *key, *bundle, *sandbox, *worker, *substrate, *activation, *pod_uid, *protocol;
	const char *installed, *jti;
	uint64_t generation;
	uint32_t purposes;
	long port, ttl;
	int json, tombstone;
	const char *arg;
};

enum { O_KEY = 1, O_BUNDLE, O_SANDBOX, O_GEN, O_WORKER, O_SUBSTRATE, O_ACT, O_POD, O_PURPOSE,
       O_PORT, O_PROTO, O_TTL, O_JSON, O_INSTALLED, O_TOMBSTONE, O_JTI };

static int parse_cap_opts(int argc, char **argv, struct cap_opts *o, const char *what)
{
	static const struct option longopts[] = {
		{"key", required_argument, NULL, O_KEY},
		{"bundle", required_argument, NULL, O_BUNDLE},
		{"sandbox", required_argument, NULL, O_SANDBOX},
		{"generation", required_argument, NULL, O_GEN},
		{"worker", required_argument, NULL, O_WORKER},
		{"substrate", required_argument, NULL, O_SUBSTRATE},
		{"activation", required_argument, NULL, O_ACT},
		{"pod-uid", required_argument, NULL, O_POD},
		{"purpose", required_argument, NULL, O_PURPOSE},
		{"port", required_argument, NULL, O_PORT},
		{"protocol", required_argument, NULL, O_PROTO},
		{"ttl", required_argument, NULL, O_TTL},
		{"json", no_argument, NULL, O_JSON},
		{"installed", required_argument, NULL, O_INSTALLED},
		{"tombstone", no_argument, NULL, O_TOMBSTONE},
		{"jti", required_argument, NULL, O_JTI},
		{NULL, 0, NULL, 0},
	};
	int c;
	char *end;
	memset(o, 0, sizeof *o);
	o->substrate = "process";
	o->activation = "a1";
	o->ttl = SPACED_CAP_LIFETIME;
	optind = 1;
	while ((c = getopt_long(argc, argv, "+", longopts, NULL)) != -1) {
		switch (c) {
		case O_KEY: o->key = optarg; break;
		case O_BUNDLE: o->bundle = optarg; break;
		case O_SANDBOX: o->sandbox = optarg; break;
		case O_GEN:
			o->generation = strtoull(optarg, &end, 10);
			if (*optarg == 0 || *end != 0 || o->generation == 0)
				return cli_fail(what, "--generation must be a positive integer"), -1;
			break;
		case O_WORKER: o->worker = optarg; break;
		case O_SUBSTRATE: o->substrate = optarg; break;
		case O_ACT: o->activation = optarg; break;
		case O_POD: o->pod_uid = optarg; break;
		case O_PURPOSE: {
			uint32_t p = spaced_purpose_parse(optarg);
			if (p == 0)
				return cli_fail(what, "unknown purpose '%s'", optarg), -1;
			o->purposes |= p;
			break;
		}
		case O_PORT:
			o->port = strtol(optarg, &end, 10);
			if (*optarg == 0 || *end != 0 || o->port < 1 || o->port > 65535)
				return cli_fail(what, "--port must be 1–65535"), -1;
			break;
		case O_PROTO: o->protocol = optarg; break;
		case O_TTL:
			o->ttl = strtol(optarg, &end, 10);
			if (*optarg == 0 || *end != 0 || o->ttl < 1 || o->ttl > SPACED_CAP_LIFETIME)
				return cli_fail(what, "--ttl must be 1–%d seconds", SPACED_CAP_LIFETIME), -1;
			break;
		case O_JSON: o->json = 1; break;
		case O_INSTALLED: o->installed = optarg; break;
		case O_TOMBSTONE: o->tombstone = 1; break;
		case O_JTI: o->jti = optarg; break;
		default: return -1;
		}
	}
	if (optind < argc)
		o->arg = argv[optind++];
	if (optind != argc)
		return -1;
	return 0;
}

static int cap_issue(int argc, char **argv)
{
	static const char u[] =
		"usage: spacectl cap issue --key k4.secret.… --sandbox S --generation N --worker W\n"
		"       [--substrate T] [--activation A] [--pod-uid U] --purpose P... [--port N --protocol X]\n"
		"       [--ttl S] [--jti ID]\n";
	struct cap_opts o;
	if (parse_cap_opts(argc, argv, &o, "cap issue") < 0 || o.arg != NULL || o.key == NULL ||
	    o.sandbox == NULL || o.worker == NULL || o.generation == 0 || o.purposes == 0)
		return cli_usage(u);
	struct spaced_cap cap;
	memset(&cap, 0, sizeof cap);
	if (spaced_identity_set(&cap.id, o.sandbox, o.generation, o.worker, o.substrate, o.activation,
	                        o.pod_uid) < 0)
		return cli_fail("cap issue", "invalid identity (names are 1–63 of [A-Za-z0-9._-])");
	cap.purposes = o.purposes;
	cap.cls = (o.purposes & SPACED_PURPOSE_SERVICEPORT) ? SPACED_CLASS_SERVICEPORT : SPACED_CLASS_CONTROL;
	cap.port = (uint16_t)o.port;
	if (o.protocol != NULL) {
		if (strlen(o.protocol) >= sizeof cap.protocol)
			return cli_fail("cap issue", "unknown protocol '%s'", o.protocol);
		strcpy(cap.protocol, o.protocol);
	}
	cap.iat = cap.nbf = spaced_now();
	cap.exp = cap.iat + o.ttl;
	if (o.jti != NULL) {
		if (strlen(o.jti) >= sizeof cap.jti)
			return cli_fail("cap issue", "--jti too long");
		strcpy(cap.jti, o.jti);
	} else {
		uint8_t rnd[16];
		randombytes_buf(rnd, sizeof rnd);
		spaced_b64url_encode(cap.jti, rnd, sizeof rnd);
	}
	if (spaced_cap_validate(&cap) < 0)
		return cli_fail("cap issue", "inconsistent claims: a serviceport capability needs exactly "
		                             "--purpose serviceport with --port and --protocol (tcp, udp, http, "
		                             "https, ws, grpc); a control capability neither");
	struct spaced_secret_key *sk;
	int r = spaced_secret_key_from_paserk(&sk, o.key, strlen(o.key));
	if (r < 0)
		return cli_fail("cap issue", "--key: %s", spaced_strerror(r));
	char *token = NULL;
	r = spaced_cap_issue(sk, &cap, &token);
	spaced_secret_key_free(sk);
	if (r < 0)
		return cli_fail("cap issue", "%s", spaced_strerror(r));
	printf("%s\n", token);
	free(token);
	return 0;
}

static char *token_arg(const char *arg, size_t *len)
{
	char *t;
	if (arg == NULL)
		return NULL;
	if (strcmp(arg, "-") != 0) {
		*len = strlen(arg);
		return strdup(arg);
	}
	t = cli_read_stdin(SPACED_PASETO_TOKEN_MAX + 1, len);
	if (t != NULL && *len > 0 && t[*len - 1] == '\n')
		t[--*len] = 0;
	return t;
}

/* A keyring from --key (valid now) or --bundle; NULL with a message otherwise. */
static struct spaced_keyring *keyring_from(const struct cap_opts *o, const char *what)
{
	struct spaced_keyring *kr;
	if (spaced_keyring_new(&kr) < 0)
		return cli_fail(what, "out of memory"), NULL;
	int r = 0;
	if (o->bundle != NULL) {
		r = spaced_keyring_load_file(kr, o->bundle);
		if (r < 0)
			cli_fail(what, "--bundle %s: %s", o->bundle, spaced_strerror(r));
	} else {
		struct spaced_public_key pk;
		r = spaced_paserk_public_decode(&pk, o->key, strlen(o->key));
		if (r < 0)
			cli_fail(what, "--key: %s", spaced_strerror(r));
		else
			r = spaced_keyring_add(kr, &pk, INT64_MIN / 2, INT64_MAX / 2);
	}
	if (r < 0) {
		spaced_keyring_free(kr);
		return NULL;
	}
	return kr;
}

static int cap_inspect(int argc, char **argv)
{
	static const char u[] = "usage: spacectl cap inspect [--key k4.public.… | --bundle FILE] [--json] TOKEN|-\n";
	struct cap_opts o;
	if (parse_cap_opts(argc, argv, &o, "cap inspect") < 0 || o.arg == NULL)
		return cli_usage(u);
	size_t tlen;
	char *token = token_arg(o.arg, &tlen);
	if (token == NULL)
		return cli_fail("cap inspect", "cannot read the token");
	struct spaced_paseto t = {0};
	int rc = 1, r = spaced_paseto_parse(&t, token, tlen);
	json_t *claims = NULL;
	json_error_t jerr;
	if (r < 0) {
		cli_fail("cap inspect", "%s", spaced_strerror(r));
		goto out;
	}
	claims = json_loadb((const char *)t.msg, t.msg_len, JSON_REJECT_DUPLICATES, &jerr);
	if (claims == NULL) {
		cli_fail("cap inspect", "claims are not valid JSON: %s", jerr.text);
		goto out;
	}
	const char *status = "UNVERIFIED (no key given)";
	const char *why = NULL;
	char whybuf[128];
	if (o.key != NULL || o.bundle != NULL) {
		struct spaced_keyring *kr = keyring_from(&o, "cap inspect");
		if (kr == NULL)
			goto out;
		const char *cls = json_string_value(json_object_get(claims, "class"));
		enum spaced_cap_class c = (cls && strcmp(cls, "serviceport") == 0) ? SPACED_CLASS_SERVICEPORT
		                                                                   : SPACED_CLASS_CONTROL;
		struct spaced_cap cap;
		r = spaced_cap_verify(kr, NULL, token, tlen, c, spaced_now(), &cap);
		spaced_keyring_free(kr);
		if (r == 0) {
			status = "VERIFIED";
		} else {
			struct spaced_decision d = spaced_decision_from_error(r);
			snprintf(whybuf, sizeof whybuf, "%s (%s)", spaced_reason_name(d.reason), spaced_strerror(r));
			status = "REFUSED";
			why = whybuf;
		}
	}
	if (o.json) {
		json_t *out = json_pack("{s:s, s:s?, s:O, s:s#}", "status", status, "reason", why, "claims",
		                        claims, "footer", (const char *)t.footer, (int)t.footer_len);
		char *s = out ? json_dumps(out, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
		json_decref(out);
		if (s == NULL) {
			cli_fail("cap inspect", "the footer is not valid UTF-8 text");
			goto out;
		}
		printf("%s\n", s);
		free(s);
	} else {
		char *s = json_dumps(claims, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		printf("status: %s%s%s\nfooter: %.*s\nclaims: %s\n", status, why ? ": " : "", why ? why : "",
		       (int)t.footer_len, (const char *)t.footer, s ? s : "?");
		free(s);
	}
	rc = why != NULL ? 1 : 0;
out:
	json_decref(claims);
	spaced_paseto_clear(&t);
	free(token);
	return rc;
}

static int cap_check(int argc, char **argv)
{
	static const char u[] =
		"usage: spacectl cap check (--key k4.public.… | --bundle FILE) --installed IDENTITY [--tombstone]\n"
		"       --purpose P [--port N --protocol X] TOKEN|-\n"
		"IDENTITY is the canonical form: sandbox=S;generation=G;worker=W;substrate=T;activation=A;pod_uid=P\n";
	struct cap_opts o;
	if (parse_cap_opts(argc, argv, &o, "cap check") < 0 || o.arg == NULL ||
	    (o.key == NULL && o.bundle == NULL) || o.installed == NULL || o.purposes == 0 ||
	    (o.purposes & (o.purposes - 1)) != 0)
		return cli_usage(u);
	struct spaced_record rec = {.epoch = 1, .active = !o.tombstone};
	if (spaced_identity_decode(&rec.id, o.installed, strlen(o.installed)) < 0)
		return cli_fail("cap check", "--installed is not a canonical identity");
	struct spaced_keyring *kr = keyring_from(&o, "cap check");
	if (kr == NULL)
		return 1;
	size_t tlen;
	char *token = token_arg(o.arg, &tlen);
	if (token == NULL) {
		spaced_keyring_free(kr);
		return cli_fail("cap check", "cannot read the token");
	}
	struct spaced_cap cap;
	enum spaced_cap_class cls = o.purposes == SPACED_PURPOSE_SERVICEPORT ? SPACED_CLASS_SERVICEPORT
	                                                                     : SPACED_CLASS_CONTROL;
	int r = spaced_cap_verify(kr, NULL, token, tlen, cls, spaced_now(), &cap);
	struct spaced_decision d = spaced_decision_from_error(r);
	if (r == 0) {
		struct spaced_request req = {o.purposes, (uint16_t)o.port, o.protocol};
		d = spaced_compare(&cap, &req, &rec, SPACED_COMPARE_STRICT);
	}
	printf("%s %s\n", spaced_verdict_name(d.verdict), spaced_reason_name(d.reason));
	free(token);
	spaced_keyring_free(kr);
	return d.verdict == SPACED_ALLOW ? 0 : 1;
}

int cmd_cap(int argc, char **argv)
{
	static const char u[] = "usage: spacectl cap issue|inspect|check …\n";
	if (argc < 2)
		return cli_usage(u);
	if (strcmp(argv[1], "issue") == 0)
		return cap_issue(argc - 1, argv + 1);
	if (strcmp(argv[1], "inspect") == 0)
		return cap_inspect(argc - 1, argv + 1);
	if (strcmp(argv[1], "check") == 0)
		return cap_check(argc - 1, argv + 1);
	return cli_usage(u);
}
