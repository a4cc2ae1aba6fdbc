/*
 * tls.h — TLS for spaced's listeners and clients, with OpenSSL: contexts made
 * from PEM files, the checks spaced wants on both sides, the name a verified
 * client certificate gives, and the TLS options every daemon takes.
 *
 * Both sides speak TLS 1.2 or 1.3 only (1.3 preferred), with forward-secret
 * AEAD suites only, no renegotiation, no compression, no session tickets or
 * session cache (spaced's clients open few, long connections).
 *
 * Servers: a certificate chain and its key from files; optionally a CA file
 * against which client certificates are verified (mutual TLS). A client
 * certificate is asked for and, when one is sent, must verify (chain, dates,
 * purpose "TLS client") or the handshake fails; whether one is required at
 * all is the caller's choice (spaced-cp takes public clients without one and
 * checks the name on its worker endpoints; see spaced_tls_peer_name).
 *
 * Clients: the server's chain is verified against a CA file (or the system's
 * trust store when none is given) and its name against the host the client
 * dialled (an IP address against the certificate's IP SANs, a name against
 * its DNS SANs). Verification is never turned off. Optionally a client
 * certificate and key (for mutual TLS).
 *
 * Library code: nothing is logged; errors come back as SPACED_E* with a
 * message in err.
 */
#ifndef SPACED_TLS_H
#define SPACED_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

/* A server context: cert (PEM chain, leaf first) and key (PEM; refused when
 * group or others may read or write it, or when it does not match cert).
 * client_ca (PEM, may be NULL): client certificates are asked for and
 * verified against it; require_client_cert: a client without one is refused
 * in the handshake. Returns 0 with *out (SSL_CTX_free), or SPACED_EINVAL /
 * SPACED_EPERM / SPACED_ENOMEM with the reason in err. */
int spaced_tls_server_ctx(const char *cert, const char *key, const char *client_ca, bool require_client_cert,
                          SSL_CTX **out, char *err, size_t errsz);

/* A client context: ca_file (PEM; NULL: the system's trust store) to verify
 * servers with; cert and key (both or neither) for mutual TLS. Bind each
 * connection to the host it dials with spaced_tls_expect_host. Returns 0
 * with *out, or SPACED_EINVAL / SPACED_EPERM / SPACED_ENOMEM with err. */
int spaced_tls_client_ctx(const char *ca_file, const char *cert, const char *key, SSL_CTX **out, char *err,
                          size_t errsz);

/* Makes the verification of param (SSL_get0_param of a connection, or
 * SSL_CTX_get0_param of a context that dials one host only) require that
 * the server's certificate names host: an IPv4/IPv6 literal (brackets
 * allowed) as an IP SAN, anything else as a DNS name (no partial wildcards).
 * Returns 0 or SPACED_EINVAL. */
int spaced_tls_expect_host(X509_VERIFY_PARAM *param, const char *host);

/* Prepares ssl to dial host: the expected name (spaced_tls_expect_host) and,
 * for a DNS name, SNI. Returns 0 or SPACED_EINVAL. */
int spaced_tls_client_bind(SSL *ssl, const char *host);

/* The name of ssl's peer certificate, verified: its subject's one common
 * name (CN), copied into out (outsz bytes with the NUL). Returns its length,
 * SPACED_ENOENT when the peer sent no certificate, SPACED_EPEER when it did
 * not verify or its CN is missing, repeated, not printable ASCII without
 * spaces, or longer than outsz - 1. */
int spaced_tls_peer_name(const SSL *ssl, char *out, size_t outsz);

/* The queued OpenSSL errors as text (the queue is emptied), for messages. */
void spaced_tls_errors(char *out, size_t outsz);

/* ---- issuing certificates (spacectl dev up, tests) ---- */

/* Makes an ECDSA P-256 key and a certificate for it valid for days (from an
 * hour ago), written to out_cert (PEM, 0644) and out_key (PEM, 0600), each
 * replaced through a rename. ca_cert/ca_key NULL: a self-signed CA named cn
 * (basicConstraints CA:TRUE, pathlen 0; keyCertSign, cRLSign); else a leaf
 * signed by that CA, named cn, with sans ("IP:127.0.0.1,DNS:localhost", or
 * NULL) as subject alternative names and the extended key usage serverAuth
 * (server) or clientAuth (not server). Returns 0 or SPACED_EINVAL /
 * SPACED_EIO / SPACED_ENOMEM with the reason in err. */
int spaced_tls_issue(const char *ca_cert, const char *ca_key, const char *out_cert, const char *out_key,
                     const char *cn, const char *sans, bool server, int days, char *err, size_t errsz);

/* ---- the TLS options of a daemon ---- */

/*
 *   --tls-cert FILE --tls-key FILE [--tls-client-ca FILE]   TLS on the listeners
 *   --tls-ca FILE --tls-client-cert FILE --tls-client-key FILE   outgoing https:// / wss://
 *   --plaintext   no TLS on the listeners (and http:// allowed out): only when asked for
 */
struct spaced_tls_opts {
	const char *cert, *key, *client_ca;
	const char *ca, *client_cert, *client_key;
	bool plaintext;
};

/* When name (a command-line option, "--tls-cert") is one of the options
 * above, stores value in o. Returns 1 for an option with a value (value
 * taken), 2 for --plaintext (no value taken), 0 when it is none of them, -1
 * when its value is missing (value NULL). */
int spaced_tls_opt(struct spaced_tls_opts *o, const char *name, const char *value);

/* Checks o for a daemon with listeners: TLS files (cert and key together) or
 * --plaintext, not both, not neither; --tls-client-ca needs them; the client
 * certificate and key go together. Returns 0 or SPACED_EINVAL with the reason
 * (a whole sentence naming the options) in err. */
int spaced_tls_opts_check(const struct spaced_tls_opts *o, char *err, size_t errsz);

#endif
