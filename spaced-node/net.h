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
#define NET_PASTA_FD_RESERVE 256u /* pasta's own descriptors (tap, epoll, socket pools, …) */
#define NET_PASTA_FDS_PER_CONN 2u /* a connection pasta carries: its host socket and its timer */
#define NET_UPLINK "100.88.255.253" /* the egress namespace's own side towards pasta */
#define NET_UPLINK_GW "100.88.255.254"
/* The host ports the sandboxes' UDP leaves from (pasta binds a host socket to
 * each): Linux's ephemeral range (32768-60999) and above it, where the host's
 * services do not listen; wide, as flows to one destination share it */
#define NET_UDP_PORTS "32768-65535"

/* Takes the worker's egress down for a decommission (`spaced-node net-down
 * --state DIR`, with no spaced-node serving DIR): stops spaced-netd and pasta
 * (each named by its pid file and checked by its process name), unmounts
 * STATE/net/ns and removes the pid files. Executions still running lose their
 * network. Returns 0 (also when nothing was up) or < 0 with why. */
int net_down(const char *state_dir, char *why, size_t whysz);

/* The connections pasta carries for all executions together (--net-conns,
 * at most what pasta's open-file limit holds), split: each of the worker's
 * slots (its uid ranges) is guaranteed *guaranteed of them (half of the
 * total, in equal parts; 1 at least, NET_CONN_MAX at most), and past that an
 * execution draws from *pool, the rest, shared by all. An execution's
 * connections past its share are refused once the pool is full, so none
 * keeps another from its guaranteed share (docs/network.md). */
void net_conn_share(const struct mgr_config *cfg, uint32_t *guaranteed, uint32_t *pool);

/* True when this worker gives executions egress (substrate mode, pasta and nft present). */
bool net_enabled(const struct mgr_config *cfg);

/* True when the egress namespace is there but pasta or spaced-netd is not
 * running (each named by its pid file, checked by its process name): every
 * execution's egress or DNS is down until net_revive. Cheap (a few small
 * reads): the gate asks every 5 s. */
bool net_needs_revive(const struct mgr_config *cfg);

/* Starts again what of pasta and spaced-netd is not running, with the
 * namespace as it is (its links, rules and executions kept), under
 * STATE/net/lock taken exclusively; nothing when the namespace is gone
 * meanwhile (netd took an idle one down). *what names what was started
 * ("" for nothing). 0, or < 0 with why. */
int net_revive(const struct mgr_config *cfg, char *what, size_t whatsz, char *why, size_t whysz);

/* Stores the sandbox's policy (JSON object, validated) in STATE/net/policy/<sandbox>.json
 * (fsync, rename). Returns 0, SPACED_EINVAL (why set) or SPACED_EIO. */
int net_policy_store(const struct mgr_config *cfg, const char *sandbox, json_t *policy, char *why, size_t whysz);

/* Gives the started execution of rec (its launcher in e_dir) its network:
 * the egress namespace, pasta and spaced-netd made ready when missing, the
 * veth pair, addresses, routes, /etc/resolv.conf, and the packet filter of
 * its stored policy (default: mode allow). Returns 0 or SPACED_E*, why set. */
int net_attach(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir, char *why, size_t whysz);

/* The same for a VM of the qemu substrate, whose network namespace is QEMU's
 * (process qemu, pinned by the caller): the veth's inner end eth0 joins the
 * bridge br0 there (spaced-vm bridged the VM's tap to it); nothing of the
 * VM's own is written (the guest configures its address). */
int net_attach_vm(const struct mgr_config *cfg, const struct mgr_rec *rec, pid_t qemu, char *why, size_t whysz);

/* The guest's address and gateway (its resolver) for rec's slot, as text
 * (16 bytes each). Returns 0, SPACED_ENOENT when the worker gives no egress. */
int net_vm_addresses(const struct mgr_config *cfg, const struct mgr_rec *rec, char *guest, char *gw);

/* A pooled execution's network (pool.c), made before any sandbox claims it:
 * the link as net_attach makes it, under the default policy's filter, held
 * by no sandbox (nothing runs in a pooled execution but its guest, which
 * runs nothing before it has an identity). Returns 0 or SPACED_E*. */
int net_attach_pooled(const struct mgr_config *cfg, const struct mgr_rec *rec, const char *e_dir, char *why,
                      size_t whysz);

/* At the claim of a pooled execution by rec's sandbox, before its identity
 * reaches it: the slot becomes the sandbox's, and the filter its stored
 * policy's when that is not the default (which the filter already is). */
int net_claim(const struct mgr_config *cfg, const struct mgr_rec *rec, char *why, size_t whysz);
/* net_claim with flags. NET_CLAIM_QUICK: for the executor's loop, which
 * must not wait — SPACED_EBUSY (nothing done) when the filter would have to
 * change (a policy other than the default) or a teardown holds the egress
 * lock; the slot file is written without waiting for the disk (it is
 * derived state: every attach writes it again). */
#define NET_CLAIM_QUICK 1u
int net_claim_as(const struct mgr_config *cfg, const struct mgr_rec *rec, unsigned flags, char *why, size_t whysz);
/* Whether sandbox has a stored policy (policy/S.json; true when that
 * cannot be told): without one its policy is the default. */
bool net_policy_stored(const struct mgr_config *cfg, const char *sandbox);

/* True when policy (JSON) is, in canonical form, the default policy. */
bool net_policy_is_default(json_t *policy);

/* After rec's execution stopped: deletes the egress namespace's conntrack
 * entries of its slot's address (flush_slot_flows). Logs what it could not do. */
void net_release(const struct mgr_config *cfg, const struct mgr_rec *rec);

/* The "net" job: {"sandbox": S, "network": policy, "rec": R|absent}: stores the
 * policy and, when R names a live execution, applies it to that execution now. */
int net_job(const struct mgr_config *cfg, json_t *args, json_t **result, char *why, size_t whysz);

#endif
