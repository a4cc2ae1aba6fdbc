/* tls.c — TLS contexts, checks and options (see tls.h). */
#include "tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "spaced_error.h"

/* TLS 1.2 suites: ECDHE key exchange and AEAD only; TLS 1.3's are all AEAD.
 * AES-128-GCM first: as strong as a 128-bit key exchange, and the cheapest
 * per byte with AES instructions. */
#define TLS12_CIPHERS "ECDHE+AES128GCM:ECDHE+AES256GCM:ECDHE+CHACHA20"
#define TLS13_SUITES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

void spaced_tls_errors(char *out, size_t outsz)
{
	size_t n = 0;
	unsigned long e;
	if (outsz == 0)
		return;
	out[0] = 0;
	while ((e = ERR_get_error()) != 0) {
		char one[256];
		ERR_error_string_n(e, one, sizeof one);
		/* "error:0A000086:SSL routines::certificate verify failed": keep the reason */
		const char *r = strrchr(one, ':');
		r = r ? r + 1 : one;
		int k = snprintf(out + n, outsz - n, "%s%s", n ? "; " : "", r);
		if (k < 0 || (size_t)k >= outsz - n)
			break;
		n += (size_t)k;
	}
	if (n == 0)
		snprintf(out, outsz, "no detail");
}

/* The settings both sides share. */
static int common(SSL_CTX *ctx, char *err, size_t errsz)
{
	if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1 ||
	    SSL_CTX_set_cipher_list(ctx, TLS12_CIPHERS) != 1 || SSL_CTX_set_ciphersuites(ctx, TLS13_SUITES) != 1) {
		snprintf(err, errsz, "cannot set the TLS versions and suites");
		return SPACED_EINVAL;
	}
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET |
	                             SSL_OP_CIPHER_SERVER_PREFERENCE);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
	return 0;
}

/* The key file must be a regular file that only its owner may read or
 * write (as ssh keys); then the chain and the key are loaded and matched. */
static int load_pair(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errsz)
{
	struct stat sb;
	char why[512];
	if (stat(key, &sb) < 0) {
		snprintf(err, errsz, "cannot read the TLS key %s: %s", key, strerror(errno));
		return SPACED_EINVAL;
	}
	if (!S_ISREG(sb.st_mode) || (sb.st_mode & 077) != 0) {
		snprintf(err, errsz, "the TLS key %s must be a regular file that only its owner can read (chmod 600)", key);
		return SPACED_EPERM;
	}
	ERR_clear_error();
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		spaced_tls_errors(why, sizeof why);
		snprintf(err, errsz, "cannot use the TLS certificate %s: %s", cert, why);
		return SPACED_EINVAL;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
		spaced_tls_errors(why, sizeof why);
		snprintf(err, errsz, "cannot use the TLS key %s: %s", key, why);
		return SPACED_EINVAL;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		ERR_clear_error();
		snprintf(err, errsz, "the TLS key %s does not belong to the certificate %s", key, cert);
		return SPACED_EINVAL;
	}
	return 0;
}

int spaced_tls_server_ctx(const char *cert, const char *key, const char *client_ca, bool require_client_cert,
                          SSL_CTX **out, char *err, size_t errsz)
{
	char why[512];
	int r;
	if (!cert || !key) {
		snprintf(err, errsz, "a TLS listener needs a certificate and its key");
		return SPACED_EINVAL;
	}
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx) {
		snprintf(err, errsz, "cannot make a TLS context");
		return SPACED_ENOMEM;
	}
	if ((r = common(ctx, err, errsz)) < 0 || (r = load_pair(ctx, cert, key, err, errsz)) < 0)
		goto fail;
	SSL_CTX_set_num_tickets(ctx, 0);
	if (client_ca) {
		STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(client_ca);
		if (!names || SSL_CTX_load_verify_locations(ctx, client_ca, NULL) != 1) {
			sk_X509_NAME_pop_free(names, X509_NAME_free);
			spaced_tls_errors(why, sizeof why);
			snprintf(err, errsz, "cannot use the client CA file %s: %s", client_ca, why);
			r = SPACED_EINVAL;
			goto fail;
		}
		SSL_CTX_set_client_CA_list(ctx, names);
		X509_VERIFY_PARAM_set_purpose(SSL_CTX_get0_param(ctx), X509_PURPOSE_SSL_CLIENT);
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (require_client_cert ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), NULL);
		SSL_CTX_set_verify_depth(ctx, 4);
	}
	*out = ctx;
	return 0;
fail:
	SSL_CTX_free(ctx);
	return r;
}

int spaced_tls_client_ctx(const char *ca_file, const char *cert, const char *key, SSL_CTX **out, char *err,
                          size_t errsz)
{
	char why[512];
	int r;
	if ((cert == NULL) != (key == NULL)) {
		snprintf(err, errsz, "a TLS client certificate goes with its key");
		return SPACED_EINVAL;
	}
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx) {
		snprintf(err, errsz, "cannot make a TLS context");
		return SPACED_ENOMEM;
	}
	if ((r = common(ctx, err, errsz)) < 0)
		goto fail;
	ERR_clear_error();
	if (ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1 : SSL_CTX_set_default_verify_paths(ctx) != 1) {
		spaced_tls_errors(why, sizeof why);
		snprintf(err, errsz, "cannot use the CA file %s: %s", ca_file ? ca_file : "(system)", why);
		r = SPACED_EINVAL;
		goto fail;
	}
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_verify_depth(ctx, 8);
	X509_VERIFY_PARAM_set_purpose(SSL_CTX_get0_param(ctx), X509_PURPOSE_SSL_SERVER);
	if (cert && (r = load_pair(ctx, cert, key, err, errsz)) < 0)
		goto fail;
	*out = ctx;
	return 0;
fail:
	SSL_CTX_free(ctx);
	return r;
}

/* host without brackets into buf; 1 when it is an IP literal. */
static int unbracket(const char *host, char *buf, size_t bufsz)
{
	size_t n = strlen(host);
	if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
		host++;
		n -= 2;
	}
	if (n == 0 || n >= bufsz)
		return -1;
	memcpy(buf, host, n);
	buf[n] = 0;
	unsigned char a[16];
	return inet_pton(AF_INET, buf, a) == 1 || inet_pton(AF_INET6, buf, a) == 1;
}

int spaced_tls_expect_host(X509_VERIFY_PARAM *param, const char *host)
{
	char h[256];
	int ip = unbracket(host, h, sizeof h);
	if (ip < 0)
		return SPACED_EINVAL;
	if (ip)
		return X509_VERIFY_PARAM_set1_ip_asc(param, h) == 1 ? 0 : SPACED_EINVAL;
	X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
	return X509_VERIFY_PARAM_set1_host(param, h, 0) == 1 ? 0 : SPACED_EINVAL;
}

int spaced_tls_client_bind(SSL *ssl, const char *host)
{
	char h[256];
	int ip = unbracket(host, h, sizeof h);
	if (ip < 0 || spaced_tls_expect_host(SSL_get0_param(ssl), host) < 0)
		return SPACED_EINVAL;
	if (!ip && SSL_set_tlsext_host_name(ssl, h) != 1) /* no SNI for literals (RFC 6066, 3) */
		return SPACED_EINVAL;
	return 0;
}

int spaced_tls_peer_name(const SSL *ssl, char *out, size_t outsz)
{
	X509 *x = SSL_get0_peer_certificate(ssl);
	if (!x)
		return SPACED_ENOENT;
	if (SSL_get_verify_result(ssl) != X509_V_OK)
		return SPACED_EPEER;
	const X509_NAME *subj = X509_get_subject_name(x);
	int i = X509_NAME_get_index_by_NID(subj, NID_commonName, -1);
	if (i < 0 || X509_NAME_get_index_by_NID(subj, NID_commonName, i) >= 0)
		return SPACED_EPEER; /* none, or two */
	const ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, i));
	int n = ASN1_STRING_length(d);
	const unsigned char *p = ASN1_STRING_get0_data(d);
	int t = ASN1_STRING_type(d);
	if ((t != V_ASN1_UTF8STRING && t != V_ASN1_PRINTABLESTRING && t != V_ASN1_IA5STRING) || n <= 0 ||
	    (size_t)n >= outsz)
		return SPACED_EPEER;
	for (int k = 0; k < n; k++)
		if (p[k] <= 0x20 || p[k] >= 0x7f)
			return SPACED_EPEER;
	memcpy(out, p, (size_t)n);
	out[n] = 0;
	return n;
}

/* ---- options ---- */

int spaced_tls_opt(struct spaced_tls_opts *o, const char *name, const char *value)
{
	static const struct {
		const char *name;
		size_t off;
	} tab[] = {
		{"--tls-cert", offsetof(struct spaced_tls_opts, cert)},
		{"--tls-key", offsetof(struct spaced_tls_opts, key)},
		{"--tls-client-ca", offsetof(struct spaced_tls_opts, client_ca)},
		{"--tls-ca", offsetof(struct spaced_tls_opts, ca)},
		{"--tls-client-cert", offsetof(struct spaced_tls_opts, client_cert)},
		{"--tls-client-key", offsetof(struct spaced_tls_opts, client_key)},
	};
	if (strcmp(name, "--plaintext") == 0) {
		o->plaintext = true;
		return 2;
	}
	for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
		if (strcmp(name, tab[i].name) != 0)
			continue;
		if (!value)
			return -1;
		memcpy((char *)o + tab[i].off, &value, sizeof value);
		return 1;
	}
	return 0;
}

int spaced_tls_opts_check(const struct spaced_tls_opts *o, char *err, size_t errsz)
{
	bool files = o->cert || o->key;
	if (o->plaintext && (files || o->client_ca)) {
		snprintf(err, errsz, "--plaintext and --tls-cert/--tls-key/--tls-client-ca exclude each other");
		return SPACED_EINVAL;
	}
	if (!o->plaintext && !files) {
		snprintf(err, errsz, "no TLS certificate: give --tls-cert FILE --tls-key FILE (TLS on every listener), "
		                     "or --plaintext to serve without TLS on purpose");
		return SPACED_EINVAL;
	}
	if (files && (!o->cert || !o->key)) {
		snprintf(err, errsz, "--tls-cert and --tls-key go together");
		return SPACED_EINVAL;
	}
	if ((o->client_cert == NULL) != (o->client_key == NULL)) {
		snprintf(err, errsz, "--tls-client-cert and --tls-client-key go together");
		return SPACED_EINVAL;
	}
	return 0;
}

/* ---- issuing ---- */

/* Writes a PEM file through a temporary file and a rename; the private key
 * (key != NULL) with mode 0600, the certificate with 0644. */
static int write_pem(const char *path, EVP_PKEY *key, X509 *cert, char *err, size_t errsz)
{
	char tmp[4200];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
		snprintf(err, errsz, "path too long: %s", path);
		return SPACED_EINVAL;
	}
	unlink(tmp);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, key ? 0600 : 0644);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		snprintf(err, errsz, "cannot write %s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return SPACED_EIO;
	}
	int ok = key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) : PEM_write_X509(f, cert);
	ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
	ok = fclose(f) == 0 && ok;
	if (!ok || rename(tmp, path) < 0) {
		unlink(tmp);
		snprintf(err, errsz, "cannot write %s", path);
		return SPACED_EIO;
	}
	return 0;
}

/* Adds extension nid with value (OpenSSL's configuration syntax). */
static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX v3;
	X509V3_set_ctx_nodb(&v3);
	X509V3_set_ctx(&v3, issuer, cert, NULL, NULL, 0);
	X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
	if (!ext)
		return -1;
	int ok = X509_add_ext(cert, ext, -1);
	X509_EXTENSION_free(ext);
	return ok ? 0 : -1;
}

int spaced_tls_issue(const char *ca_cert, const char *ca_key, const char *out_cert, const char *out_key,
                     const char *cn, const char *sans, bool server, int days, char *err, size_t errsz)
{
	EVP_PKEY *key = NULL, *ikey = NULL;
	X509 *cert = NULL, *icert = NULL;
	FILE *f = NULL;
	int r = SPACED_EINVAL;
	char why[512];
	bool self = ca_cert == NULL;
	if ((ca_cert == NULL) != (ca_key == NULL) || !cn || !*cn || days < 1) {
		snprintf(err, errsz, "a certificate needs a name, a lifetime, and its CA's certificate and key together");
		return SPACED_EINVAL;
	}
	ERR_clear_error();
	if (!self) {
		if (!(f = fopen(ca_cert, "r")) || !(icert = PEM_read_X509(f, NULL, NULL, NULL))) {
			snprintf(err, errsz, "cannot read the CA certificate %s", ca_cert);
			goto out;
		}
		fclose(f);
		if (!(f = fopen(ca_key, "r")) || !(ikey = PEM_read_PrivateKey(f, NULL, NULL, NULL))) {
			snprintf(err, errsz, "cannot read the CA key %s", ca_key);
			goto out;
		}
		fclose(f);
		f = NULL;
	}
	unsigned char serial[16];
	BIGNUM *bn = NULL;
	if (!(key = EVP_EC_gen("P-256")) || !(cert = X509_new()) || RAND_bytes(serial, sizeof serial) != 1) {
		r = SPACED_ENOMEM;
		snprintf(err, errsz, "cannot make a key");
		goto out;
	}
	serial[0] &= 0x7f; /* positive */
	if (!(bn = BN_bin2bn(serial, sizeof serial, NULL)) || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert))) {
		BN_free(bn);
		r = SPACED_ENOMEM;
		snprintf(err, errsz, "cannot make a serial number");
		goto out;
	}
	BN_free(bn);
	X509_NAME *name = X509_get_subject_name(cert);
	if (X509_set_version(cert, 2) != 1 ||
	    !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0) ||
	    !X509_gmtime_adj(X509_getm_notBefore(cert), -3600) ||
	    !X509_gmtime_adj(X509_getm_notAfter(cert), (long)days * 86400) || X509_set_pubkey(cert, key) != 1 ||
	    X509_set_issuer_name(cert, self ? name : X509_get_subject_name(icert)) != 1) {
		snprintf(err, errsz, "cannot fill the certificate for %s", cn);
		goto out;
	}
	X509 *issuer = self ? cert : icert;
	int e = add_ext(cert, issuer, NID_subject_key_identifier, "hash");
	if (!self)
		e |= add_ext(cert, issuer, NID_authority_key_identifier, "keyid:always");
	if (self) {
		e |= add_ext(cert, issuer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
		e |= add_ext(cert, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
	} else {
		e |= add_ext(cert, issuer, NID_basic_constraints, "critical,CA:FALSE");
		e |= add_ext(cert, issuer, NID_key_usage, "critical,digitalSignature");
		e |= add_ext(cert, issuer, NID_ext_key_usage, server ? "serverAuth" : "clientAuth");
		if (sans && *sans)
			e |= add_ext(cert, issuer, NID_subject_alt_name, sans);
	}
	if (e) {
		spaced_tls_errors(why, sizeof why);
		snprintf(err, errsz, "cannot add the extensions of %s (%s): %s", cn, sans ? sans : "", why);
		goto out;
	}
	if (X509_sign(cert, self ? key : ikey, EVP_sha256()) <= 0) {
		spaced_tls_errors(why, sizeof why);
		snprintf(err, errsz, "cannot sign the certificate of %s: %s", cn, why);
		goto out;
	}
	if ((r = write_pem(out_key, key, NULL, err, errsz)) < 0 || (r = write_pem(out_cert, NULL, cert, err, errsz)) < 0)
		goto out;
	r = 0;
out:
	if (f)
		fclose(f);
	ERR_clear_error();
	EVP_PKEY_free(key);
	EVP_PKEY_free(ikey);
	X509_free(cert);
	X509_free(icert);
	return r;
}
