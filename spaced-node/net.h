/*
 * net.h — egress of executions (docs/network.md).
 *
 * Every execution of the process substrate already lives in a network
 * namespace of its own that the host's user namespace owns (root inside has
 * no CAP_NET_ADMIN over it). This worker keeps one more namespace, the
 * *egress namespace* (STATE/net/ns), that no execution can enter: each
 * execution gets a veth pair whose outer end (sx<slot>) lives there, and all
 * of its traffic is filtered there by nftables (table inet spaced) before
 * pasta (Debian's passt) carries it to the host's network as ordinary host
 * sockets. The worker's resolver (spaced-netd) answers the executions' DNS in
 * that namespace and pins the addresses of allowed domains into the
 * execution's nft set. Nothing in the host's own network namespace changes.
 *
 * Runs in the executor's job children (root): each call may block.
 */
#ifndef SPACED_NET_H
#define SPACED_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "mgr.h"
#include "node.h"

/* Addresses: slot k (the execution's uid range index) uses the /30 at
 * NET_POOL + 4k: .1 the egress side (gateway, resolver), .2 the execution. */
#define NET_POOL 0x64580000u /* 100.88.0.0 */
#define NET_SLOTS 16383u
#define NET_CONN_MAX 4096u /* tracked connections per execution */
#define NET_UPLINK "100.88.255.253" /* the egress namespace's own side towards pasta */
#define NET_UPLINK_GW "100.88.255.254"

/* True when this worker gives executions egress (substrate mode, pasta and nft present). */
bool net_enabled(const struct mgr_config *cfg);

/* Stores the sandbox's policy (JSON object, validated) in STATE/net/policy/<sandbox>.json
 * (fsync, rename). Returns 0, SPACED_EINVAL (why set) or SPACED_EIO. */
int net_policy_store(const struct mgr_config *cfg, const char *sandbox, json_t *policy, char *why, size_t whysz);

/* Gives the started execution of rec (its launcher in e_dir) its network:
 * the egress namespace, pasta and spaced-netd made ready when missing, the
 * veth pair, addresses, routes, /etc/resolv.conf, and the packet filter of
 * its stored policy (default: mode allow). Returns 0 or SPACED_E*, why set. */
int net_attach(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir, char *why, size_t whysz);

/* The "net" job: {"sandbox": S, "network": policy, "rec": R|absent}: stores the
 * policy and, when R names a live execution, applies it to that execution now. */
int net_job(const struct mgr_config *cfg, json_t *args, json_t **result, char *why, size_t whysz);

#endif
