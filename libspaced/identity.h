/*
 * identity.h — the execution (route) identity of I2 and its canonical forms.
 *
 * An execution identity names one runtime incarnation of a sandbox and its
 * placement: {sandbox, generation, worker, substrate, activation, pod_uid}.
 * Names are 1–63 characters of [A-Za-z0-9._-]; pod_uid may be empty (it is set
 * only on Kubernetes); generation is 1 … 2^53-1 (exact in every JSON reader).
 */
#ifndef SPACED_IDENTITY_H
#define SPACED_IDENTITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define SPACED_NAME_MAX 64 /* room for a name, NUL included */
#define SPACED_GENERATION_MAX ((UINT64_C(1) << 53) - 1)
/* Room for the canonical text of any identity, NUL included. */
#define SPACED_IDENTITY_TEXT_MAX 512

struct spaced_identity {
	char sandbox[SPACED_NAME_MAX];
	uint64_t generation;
	char worker[SPACED_NAME_MAX];
	char substrate[SPACED_NAME_MAX];
	char activation[SPACED_NAME_MAX];
	char pod_uid[SPACED_NAME_MAX]; /* "" when not on Kubernetes */
};

/* True when s (n bytes) is a valid name: 1–63 characters of [A-Za-z0-9._-]. */
bool spaced_name_valid(const char *s, size_t n);

/* Whether name may be the parent cgroup of a process's executions (the
 * directory below its own cgroup that spaced_sub_cap_all caps): "spaced" or
 * "spaced.NAME", NAME a name. The launcher takes it from
 * SPACED_CGROUP_PARENT (spaced-node --cgroup-parent), "spaced" when unset or
 * not valid. */
bool spaced_cgroup_parent_valid(const char *name);

/* Fills *out from its parts after checking each one (pod_uid may be NULL or "").
 * Returns 0 or SPACED_EINVAL; *out is untouched on error. */
int spaced_identity_set(struct spaced_identity *out, const char *sandbox, uint64_t generation,
                        const char *worker, const char *substrate, const char *activation,
                        const char *pod_uid);

/* True when every field of a and b is equal. */
bool spaced_identity_equal(const struct spaced_identity *a, const struct spaced_identity *b);

/* True when next is cur under another activation: every other field equal,
 * the activation not (S4: the same execution of the same generation, on the
 * same worker, activated again — never a new incarnation). */
bool spaced_identity_activation_change(const struct spaced_identity *cur, const struct spaced_identity *next);

/* The canonical text form, used on the wire (the X-Spaced-Identity header, guest
 * answers) and as a key: "sandbox=S;generation=G;worker=W;substrate=T;activation=A;pod_uid=P"
 * in exactly this order, generation in decimal without leading zeros. Writes at
 * most outsz bytes including the NUL. Returns the length, or SPACED_ETOOBIG. */
int spaced_identity_encode(const struct spaced_identity *id, char *out, size_t outsz);

/* Parses the canonical text form strictly (same order, no extra or missing
 * fields, no leading zeros). Returns 0 or SPACED_EFORMAT / SPACED_EINVAL. */
int spaced_identity_decode(struct spaced_identity *out, const char *s, size_t n);

/* The identity as a new JSON object {"sandbox":…, "generation":…, "worker":…,
 * "substrate":…, "activation":…, "pod_uid":…} (pod_uid null when empty). NULL on
 * allocation failure. The caller owns the reference. */
json_t *spaced_identity_to_json(const struct spaced_identity *id);

/* Reads an identity from a JSON object of the form above; unknown members are
 * an error. Returns 0, SPACED_EJSON or SPACED_EINVAL. */
int spaced_identity_from_json(struct spaced_identity *out, json_t *obj);

#endif
