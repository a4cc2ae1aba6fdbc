/**
 * Routes and the route cache (DESIGN V2–V4, docs/client.md "Routes and the route cache").
 *
 * A route is a `POST /v1/sandboxes/{id}/route` answer of the control plane: the
 * execution identity (I2), the worker's node-api address and a capability for
 * the control purposes. The cache keeps one entry per sandbox and scope (a
 * Connection's `cacheScope`: its control plane and a digest of its key, so that
 * connections of several tenants' keys sharing a cache never use each other's
 * routes): `{route, entryExpiresAt}`. `entryExpiresAt` is the caller's session
 * (SESSION_TTL seconds after the entry was first resolved); route repair never
 * moves it (V4). An entry is replaced after a refusal only while it still holds
 * the refused route (compare-and-swap on the capability, V3).
 *
 * The cache lives in memory, shared by every Sandbox of a process that uses the
 * same RouteCache (the default one unless given); spacectl keeps the same
 * entries on disk under flock(), one per process run.
 */
import { SpacedError } from "./errors";

/** The caller's session: an entry's life from its first resolution (s). */
export const SESSION_TTL = 3600;
/** A capability is not used in its last seconds. */
export const CAP_MARGIN = 5;
/** How long a resolution waits for a moving or starting sandbox (s). */
export const RESOLVE_WAIT = 30;

/** replaceIf verdicts */
export type CacheVerdict = "none" | "replaced" | "other";

const NAME = /^[A-Za-z0-9._-]{1,63}$/;
const IDENTITY_KEYS = ["sandbox", "generation", "worker", "substrate", "activation"] as const;

/** A spaced name (sandbox, worker, …): [A-Za-z0-9._-], 1–63 characters. */
export function nameValid(s: unknown): s is string {
  return typeof s === "string" && NAME.test(s);
}

/** Unix seconds now. */
export function nowS(): number {
  return Math.floor(Date.now() / 1000);
}

/** An RFC 3339 time as Unix seconds; throws on anything else. */
export function parseTime(s: unknown): number {
  if (typeof s !== "string" || !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/i.test(s.trim())) {
    throw new Error("not a time");
  }
  const t = Date.parse(s.trim());
  if (!Number.isFinite(t)) throw new Error("not a time");
  return Math.floor(t / 1000);
}

/** The execution identity (I2) as the control plane sends it. */
export interface IdentityDoc {
  sandbox: string;
  generation: number;
  worker: string;
  substrate: string;
  activation: string;
  pod_uid?: string | null;
}

/**
 * The canonical text of an identity (libspaced identity.h):
 * `sandbox=S;generation=N;worker=W;substrate=P;activation=A;pod_uid=U`.
 * Throws on anything that is not an identity.
 */
export function identityText(doc: unknown): string {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) throw new Error("not an identity");
  const o = doc as Record<string, unknown>;
  for (const k of Object.keys(o)) {
    if (!(IDENTITY_KEYS as readonly string[]).includes(k) && k !== "pod_uid") throw new Error("not an identity");
  }
  for (const k of IDENTITY_KEYS) if (!(k in o)) throw new Error("not an identity");
  const gen = o.generation;
  if (typeof gen !== "number" || !Number.isSafeInteger(gen) || gen <= 0) throw new Error("bad generation");
  for (const k of ["sandbox", "worker", "substrate", "activation"]) {
    if (!nameValid(o[k])) throw new Error(`bad ${k}`);
  }
  const pod = o.pod_uid === undefined || o.pod_uid === null ? "" : o.pod_uid;
  if (typeof pod !== "string" || (pod !== "" && !nameValid(pod))) throw new Error("bad pod_uid");
  return `sandbox=${o.sandbox};generation=${gen};worker=${o.worker};substrate=${o.substrate};activation=${o.activation};pod_uid=${pod}`;
}

/** A route answer as the control plane sends it (`spacectl route --json`). */
export interface RouteDoc {
  identity: IdentityDoc;
  worker_url: string;
  capability: string;
  expires_at: string;
  [k: string]: unknown;
}

/** One route. */
export class Route {
  readonly doc: RouteDoc;
  /** canonical identity text */
  readonly identity: string;
  readonly identityDoc: IdentityDoc;
  readonly workerUrl: string;
  readonly capability: string;
  /** Unix seconds */
  readonly expiresAt: number;

  constructor(doc: unknown) {
    try {
      if (doc === null || typeof doc !== "object") throw new Error("not an object");
      const d = doc as Record<string, unknown>;
      if (typeof d.capability !== "string" || !d.capability || typeof d.worker_url !== "string" || !d.worker_url) {
        throw new Error("no capability or worker_url");
      }
      this.identity = identityText(d.identity);
      this.expiresAt = parseTime(d.expires_at);
      this.doc = d as unknown as RouteDoc;
      this.identityDoc = d.identity as IdentityDoc;
      this.workerUrl = d.worker_url;
      this.capability = d.capability;
    } catch (e) {
      throw new SpacedError(`not a route (identity, worker_url, capability, expires_at): ${(e as Error).message}`);
    }
  }

  get sandbox(): string {
    return this.identityDoc.sandbox;
  }
  get generation(): number {
    return this.identityDoc.generation;
  }
  get worker(): string {
    return this.identityDoc.worker;
  }

  /** The same route: the same capability (what the cache compares, V3). */
  same(other: Route | undefined | null): boolean {
    return !!other && other.capability === this.capability;
  }
}

export interface CacheEntry {
  route: Route;
  entryExpiresAt: number;
}

/**
 * The route cache: one entry per (scope, sandbox), the scope a Connection's
 * `cacheScope`. Every
 * read-modify-write that waits (a miss's resolution) holds the entry's lock, as
 * spacectl holds flock() on the entry's lock file; compare-and-swap steps run
 * without awaiting, so they are atomic (V3).
 */
export class RouteCache {
  private entries = new Map<string, CacheEntry>();
  private locks = new Map<string, Promise<void>>();

  private static key(scope: string, sandbox: string): string {
    return `${scope}\u0000${sandbox}`;
  }

  /** Runs fn holding the entry's lock (a promise chain per entry). */
  async withLock<T>(scope: string, sandbox: string, fn: () => Promise<T>): Promise<T> {
    const k = RouteCache.key(scope, sandbox);
    const prev = this.locks.get(k) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const chained = prev.then(() => mine);
    this.locks.set(k, chained);
    await prev;
    try {
      return await fn();
    } finally {
      release();
      if (this.locks.get(k) === chained) this.locks.delete(k);
    }
  }

  get(scope: string, sandbox: string): CacheEntry | undefined {
    return this.entries.get(RouteCache.key(scope, sandbox));
  }

  put(scope: string, sandbox: string, route: Route, entryExpiresAt: number): void {
    this.entries.set(RouteCache.key(scope, sandbox), { route, entryExpiresAt });
  }

  remove(scope: string, sandbox: string): void {
    this.entries.delete(RouteCache.key(scope, sandbox));
  }

  /**
   * Stores a saved route (a `spacectl route --json` document) as the entry of
   * sandbox, as a stale cache would hold it. Returns the Route.
   */
  seed(scope: string, sandbox: string, routeDoc: unknown, entryExpiresAt?: number): Route {
    const route = routeDoc instanceof Route ? routeDoc : new Route(routeDoc);
    this.put(scope, sandbox, route, entryExpiresAt ?? nowS() + SESSION_TTL);
    return route;
  }

  /**
   * V3: replaces the entry with fresh only while it still holds refused,
   * keeping the entry's expiry (V4).
   */
  replaceIf(scope: string, sandbox: string, refused: Route, fresh: Route): CacheVerdict {
    const e = this.get(scope, sandbox);
    if (!e) return "none";
    if (!e.route.same(refused)) return "other";
    this.put(scope, sandbox, fresh, e.entryExpiresAt);
    return "replaced";
  }

  /** After a DENY (or an unverified answer): drops the entry when it still holds refused. */
  forgetIf(scope: string, sandbox: string, refused: Route): boolean {
    const e = this.get(scope, sandbox);
    if (e && e.route.same(refused)) {
      this.remove(scope, sandbox);
      return true;
    }
    return false;
  }
}

/** The process-wide cache. */
export const DEFAULT_CACHE = new RouteCache();

/** A phrase for a replaceIf verdict (as spacectl prints it). */
export function cacheVerdictText(v: CacheVerdict): string {
  if (v === "replaced") return "cache entry replaced, its expiry kept";
  if (v === "other") return "cache entry left alone: it holds another route";
  return "no cache entry";
}
