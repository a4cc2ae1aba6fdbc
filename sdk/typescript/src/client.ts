/**
 * The client side of the route: the control plane, the route cache and one
 * operation sent to the worker that serves a sandbox, with the recovery rules
 * of DESIGN V1–V4 in one place (`Connection.call`), as spacectl's client_call():
 *
 * - 401/403 DENY: never retried (V1, C5); the cache entry is dropped when it
 *   still holds the refused route.
 * - 409 REFRESH_ROUTE: the route is resolved again at the control plane and the
 *   request rebuilt and sent exactly once more (V2), at once; the cache entry is
 *   then replaced only when it still holds the refused route (V3), keeping its
 *   expiry (V4). A second refusal is reported.
 * - A 409 that is not a REFRESH_ROUTE body is a DENY (V1).
 * - Every ALLOW answer must carry X-Spaced-Identity (once) naming the route's
 *   execution; one that does not is refused unread (UNVERIFIED), never retried,
 *   and the cache entry that led to it dropped (I2, I3).
 * - Transport failure: an idempotent request (read, list, stat) is sent once
 *   more on a fresh connection; a write or a command is never sent again.
 */
import { createHash } from "node:crypto";
import type * as http from "node:http";

import {
  ConfigError,
  ControlPlaneError,
  DenyError,
  FileNotFoundInSandbox,
  NotFoundError,
  OperationError,
  RefreshRouteError,
  SpacedError,
  TransportError,
  UnverifiedAnswerError,
} from "./errors";
import { BodySource, ExchangeError, exchange, headerAll, isBodySource, loadCa, splitUrl, workerAgent } from "./http";
import {
  CAP_MARGIN,
  CacheVerdict,
  DEFAULT_CACHE,
  RESOLVE_WAIT,
  Route,
  RouteCache,
  SESSION_TTL,
  cacheVerdictText,
  nameValid,
  nowS,
} from "./routes";

export type Outcome = "ALLOW" | "REFRESH_ROUTE" | "DENY" | "TRANSPORT" | "UNVERIFIED";

/** One operation on a sandbox's worker. */
export interface Request {
  method: string;
  /** after `/v1/sandboxes/{id}/` (already encoded) */
  op: string;
  body?: Buffer | BodySource;
  contentType?: string;
  /** may be sent again after a transport failure */
  idempotent?: boolean;
  timeoutMs?: number;
}

/** The final answer of Connection.call, whatever its outcome. */
export interface CallAnswer {
  outcome: Outcome;
  status: number;
  reason: string;
  identity: string;
  body: Buffer;
  attempts: number;
  refreshed: boolean;
  cacheVerdict?: CacheVerdict;
  notReplayable: boolean;
  workerUrl: string;
}

/** times a control-plane call refused for its tenant's rate (429 rate-limited) is sent again */
export const RATE_RETRIES = 3;

/** What `spacectl -v` prints, as events. */
export type SpacedEvent = { event: string; [k: string]: unknown };

export interface ConnectionOptions {
  /** default: $SPACED_CP_URL */
  cpUrl?: string;
  /** default: $SPACED_API_KEY */
  apiKey?: string;
  /** the CA file https:// and wss:// peers are verified against; default: $SPACED_CA_FILE, else Node's trust store */
  caFile?: string;
  /** default: the process-wide cache */
  routeCache?: RouteCache;
  /** send each request once and report the raw outcome (spacectl --no-retry) */
  noRetry?: boolean;
  /** called for every answer, refusal, repair and stream event */
  onEvent?: (ev: SpacedEvent) => void;
  /** keep worker connections for the next request (idle < 2 s); default true */
  keepAlive?: boolean;
  /** how long a request waits for its answer (default 300 s) */
  requestTimeoutMs?: number;
}

/** (outcome, reason) of a worker's answer (V1). */
export function classify(status: number, body: Buffer): { outcome: Outcome; reason: string } {
  if (status !== 401 && status !== 403 && status !== 409) return { outcome: "ALLOW", reason: "" };
  let doc: Record<string, unknown> = {};
  try {
    const d = JSON.parse(body.toString("utf8"));
    if (d && typeof d === "object" && !Array.isArray(d)) doc = d;
  } catch {
    /* not JSON: a DENY with an unknown reason */
  }
  const reason = typeof doc.reason === "string" ? doc.reason : "unknown";
  if (status === 409 && doc.outcome === "REFRESH_ROUTE") return { outcome: "REFRESH_ROUTE", reason };
  return { outcome: "DENY", reason };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A control plane and the caller's key, the route cache and kept connections;
 * shared by every Sandbox made from it.
 */
export class Connection {
  readonly cpUrl: string;
  readonly apiKey: string;
  readonly cache: RouteCache;
  /**
   * What this connection's route cache entries are kept under: the control
   * plane and a digest of the key. A route holds a live capability, and
   * connections of several tenants' keys in one process share the default cache.
   */
  readonly cacheScope: string;
  readonly noRetry: boolean;
  readonly onEvent?: (ev: SpacedEvent) => void;
  readonly requestTimeoutMs: number;
  readonly agent: http.Agent | undefined;
  readonly tlsAgent: http.Agent | undefined;
  /** the CA certificates (caFile / $SPACED_CA_FILE), undefined: Node's trust store */
  readonly ca: Buffer | undefined;

  constructor(opts: ConnectionOptions = {}) {
    this.cpUrl = (opts.cpUrl || process.env.SPACED_CP_URL || "").replace(/\/+$/, "");
    this.apiKey = opts.apiKey || process.env.SPACED_API_KEY || "";
    if (!this.cpUrl || !this.apiKey) {
      throw new ConfigError(
        "SPACED_CP_URL and SPACED_API_KEY must be set (spacectl dev up writes them), or cpUrl and apiKey given",
      );
    }
    splitUrl(this.cpUrl);
    try {
      this.ca = loadCa(opts.caFile);
    } catch (e) {
      throw new ConfigError((e as Error).message);
    }
    this.cache = opts.routeCache ?? DEFAULT_CACHE;
    this.cacheScope =
      this.cpUrl + "#" + createHash("sha256").update("spaced route cache\0" + this.apiKey).digest("hex").slice(0, 32);
    this.noRetry = !!opts.noRetry;
    this.onEvent = opts.onEvent;
    this.requestTimeoutMs = opts.requestTimeoutMs ?? 300_000;
    this.agent = workerAgent(opts.keepAlive ?? true);
    this.tlsAgent = workerAgent(opts.keepAlive ?? true, true, this.ca);
  }

  /** Closes the kept connections. */
  close(): void {
    this.agent?.destroy();
    this.tlsAgent?.destroy();
  }

  /** The kept-alive agent for url's scheme. */
  agentFor(url: string): http.Agent | undefined {
    return url.startsWith("https:") ? this.tlsAgent : this.agent;
  }

  emit(ev: SpacedEvent): void {
    if (!this.onEvent) return;
    try {
      this.onEvent(ev);
    } catch {
      /* a hook never breaks an operation */
    }
  }

  // ---- the control plane ----

  /**
   * One control-plane call: [status, document]. Throws ControlPlaneError
   * (NotFoundError for 404 no such sandbox) for a status not in ok,
   * TransportError when the control plane cannot be reached. A call refused
   * for its tenant's rate (429 rate-limited: nothing was done) is sent again
   * after the retry_after it names (at most 5 s), up to RATE_RETRIES times,
   * unless noRetry.
   */
  async cp(
    method: string,
    path: string,
    body?: unknown,
    ok: number[] = [200, 201, 202],
    headers: Record<string, string> = {},
  ): Promise<[number, Record<string, any>]> {
    for (let attempt = 0; ; attempt++) {
      const [status, doc] = await this.cpOnce(method, path, body, headers);
      const limited = status === 429 && doc.error === "rate-limited";
      if (!limited || this.noRetry || attempt === RATE_RETRIES) {
        if (!ok.includes(status)) throw cpError(method, path, status, doc);
        return [status, doc];
      }
      const ra = Number.isFinite(doc.retry_after) ? Math.min(Math.max(doc.retry_after, 0.05), 5) : 1;
      this.emit({ event: "rate-limited", method, path, retryAfter: ra });
      await new Promise((r) => setTimeout(r, ra * 1000));
    }
  }

  private async cpOnce(
    method: string,
    path: string,
    body: unknown,
    headers: Record<string, string>,
  ): Promise<[number, Record<string, any>]> {
    const data = body !== undefined ? Buffer.from(JSON.stringify(body)) : Buffer.from(method === "POST" ? "{}" : "");
    let a;
    try {
      a = await exchange(
        undefined,
        this.cpUrl,
        method,
        path,
        {
          Authorization: `Bearer ${this.apiKey}`,
          Accept: "application/json",
          "Content-Type": "application/json",
          ...headers,
        },
        data,
        120_000,
        64 << 20,
        this.ca,
      );
    } catch (e) {
      const msg = (e as Error).message;
      throw new TransportError(`control plane: ${msg}`, msg);
    }
    let doc: Record<string, any> = {};
    try {
      if (a.body.length) doc = JSON.parse(a.body.toString("utf8"));
    } catch {
      doc = {};
    }
    if (doc === null || typeof doc !== "object") doc = {};
    return [a.status, doc];
  }

  private async betweenExecutions(sandbox: string, state: string): Promise<boolean> {
    if (state === "moving" || state === "starting") return true;
    if (state !== "stopped") return false;
    try {
      const [, doc] = await this.cp("GET", `/v1/sandboxes/${sandbox}`);
      return typeof doc.operation === "string";
    } catch {
      return false;
    }
  }

  /**
   * POST /v1/sandboxes/{id}/route: the current route. While the sandbox is
   * between two executions, waits for the new one (at most RESOLVE_WAIT s).
   */
  async resolve(sandbox: string): Promise<Route> {
    const path = `/v1/sandboxes/${sandbox}/route`;
    const deadline = Date.now() + RESOLVE_WAIT * 1000;
    for (;;) {
      try {
        const [, doc] = await this.cp("POST", path, {}, [200]);
        return new Route(doc);
      } catch (e) {
        if (!(e instanceof ControlPlaneError)) throw e;
        const state = e.body.state;
        if (e.status !== 409 || typeof state !== "string" || Date.now() > deadline) throw e;
        if (!(await this.betweenExecutions(sandbox, state))) throw e;
        await sleep(100);
      }
    }
  }

  // ---- the route cache ----

  /**
   * The route an operation starts from: a usable cache entry, else a fresh one
   * stored as the entry (keeping the entry's expiry while it lasts, V4).
   */
  async routeGet(sandbox: string): Promise<Route> {
    if (!nameValid(sandbox)) throw new SpacedError(`${JSON.stringify(sandbox)} is not a sandbox ID`);
    return this.cache.withLock(this.cacheScope, sandbox, async () => {
      const now = nowS();
      const e = this.cache.get(this.cacheScope, sandbox);
      if (e && e.entryExpiresAt > now && e.route.expiresAt > now + CAP_MARGIN) return e.route;
      // a miss, or the capability nears its expiry: the entry's expiry is kept
      // while it lasts (V4); an expired entry starts a new session
      const entryExp = e && e.entryExpiresAt > now ? e.entryExpiresAt : now + SESSION_TTL;
      const rt = await this.resolve(sandbox);
      this.cache.put(this.cacheScope, sandbox, rt, entryExp);
      this.emit({ event: "resolved", sandbox, identity: rt.identity, workerUrl: rt.workerUrl, why: e ? "expiry" : "miss" });
      return rt;
    });
  }

  /**
   * After a REFRESH_ROUTE to refused: a fresh route, and the cache entry
   * replaced only while it still holds refused (V3, V4).
   */
  async routeRepair(sandbox: string, refused: Route): Promise<[Route, CacheVerdict]> {
    const fresh = await this.resolve(sandbox);
    const verdict = this.cache.replaceIf(this.cacheScope, sandbox, refused, fresh);
    this.emit({ event: "repair", sandbox, identity: fresh.identity, workerUrl: fresh.workerUrl, cache: verdict, text: cacheVerdictText(verdict) });
    return [fresh, verdict];
  }

  routeForget(sandbox: string, refused: Route): void {
    if (this.cache.forgetIf(this.cacheScope, sandbox, refused)) this.emit({ event: "forget", sandbox, identity: refused.identity });
  }

  // ---- one operation ----

  /**
   * Sends req along the recovery rules (module doc). Resolves to the final
   * answer whatever its outcome; rejects only when no route could be had.
   */
  async call(sandbox: string, req: Request): Promise<CallAnswer> {
    let rt = await this.routeGet(sandbox);
    let refused: Route | undefined;
    let repaired = false;
    let transportRetry = false;
    let attempts = 0;
    let a: CallAnswer;
    for (;;) {
      attempts++;
      a = { outcome: "TRANSPORT", status: 0, reason: "", identity: "", body: Buffer.alloc(0), attempts, refreshed: repaired, notReplayable: false, workerUrl: rt.workerUrl };
      try {
        const headers: Record<string, string> = { Authorization: `Bearer ${rt.capability}` };
        if (req.contentType) headers["Content-Type"] = req.contentType;
        // the retry after a transport failure goes on a fresh connection
        const ans = await exchange(transportRetry ? undefined : this.agentFor(rt.workerUrl), rt.workerUrl, req.method, `/v1/sandboxes/${sandbox}/${req.op}`, headers, req.body, req.timeoutMs ?? this.requestTimeoutMs, undefined, this.ca);
        a.status = ans.status;
        a.body = ans.body;
        const ids = headerAll(ans, "X-Spaced-Identity");
        a.identity = ids.length === 1 ? ids[0] : ""; // given once, or it is not taken
        const c = classify(ans.status, ans.body);
        a.outcome = c.outcome;
        a.reason = c.reason;
      } catch (e) {
        if (!(e instanceof ExchangeError)) throw e;
        a.outcome = "TRANSPORT";
        a.reason = e.message;
        this.emit({ event: "transport", sandbox, workerUrl: rt.workerUrl, reason: a.reason, method: req.method });
        // an idempotent read may go once more on a fresh connection; a write or
        // a command may have happened: never sent again
        if (req.idempotent && !this.noRetry && !transportRetry) {
          transportRetry = true;
          continue;
        }
        break;
      }
      // an answer that does not name the route's execution is refused (I2, I3)
      if (a.outcome === "ALLOW" && a.identity !== rt.identity) {
        a.reason = a.identity
          ? `answer ${a.status} from ${a.identity}, not from the route's execution ${rt.identity}`
          : `answer ${a.status} without X-Spaced-Identity (not an execution's answer)`;
        a.outcome = "UNVERIFIED";
        a.body = Buffer.alloc(0);
      }
      this.emit({ event: "answer", sandbox, outcome: a.outcome, status: a.status, reason: a.reason, identity: a.identity, workerUrl: rt.workerUrl, route: rt.identity, method: req.method });
      if (a.outcome === "DENY" || a.outcome === "UNVERIFIED") {
        this.routeForget(sandbox, rt);
        break; // V1, C5: never retried
      }
      if (a.outcome !== "REFRESH_ROUTE" || this.noRetry || repaired) break;
      if (isBodySource(req.body) && !req.body.rewind()) {
        a.notReplayable = true; // its body cannot be sent again
        break;
      }
      // V2: resolve the current execution, one rebuilt retry, at once; the
      // cache is repaired (V3, V4) after the retry
      const fresh = await this.resolve(sandbox);
      this.emit({ event: "resolved", sandbox, identity: fresh.identity, workerUrl: fresh.workerUrl, why: "refresh" });
      refused = rt;
      rt = fresh;
      repaired = true;
    }
    if (repaired && refused) {
      a.cacheVerdict = this.cache.replaceIf(this.cacheScope, sandbox, refused, rt);
      this.emit({ event: "cache", sandbox, cache: a.cacheVerdict, text: cacheVerdictText(a.cacheVerdict) });
    }
    a.attempts = attempts;
    a.refreshed = repaired;
    return a;
  }

  /** call(), then an ALLOW 2xx answer is returned and anything else thrown. */
  async callOk(sandbox: string, req: Request, what: string): Promise<CallAnswer> {
    const a = await this.call(sandbox, req);
    throwFor(a, what, this.noRetry);
    return a;
  }
}

export function cpError(method: string, path: string, status: number, doc: Record<string, any>): ControlPlaneError {
  const code = typeof doc.error === "string" ? doc.error : "";
  const msg = typeof doc.message === "string" ? doc.message : "";
  const text = `control plane: ${method} ${path}: ${status} ${code}${msg ? ": " : ""}${msg}`;
  if (status === 404 && msg !== "no such endpoint") return new NotFoundError(text, status, code, doc);
  return new ControlPlaneError(text, status, code, doc);
}

/** True for a control-plane answer that says the endpoint does not exist. */
export function isNoEndpoint(e: unknown): boolean {
  return e instanceof ControlPlaneError && (e.status === 405 || (e.status === 404 && e.body.message === "no such endpoint"));
}

/** Throws the error an answer stands for, unless it is an ALLOW 2xx. */
export function throwFor(a: CallAnswer, what: string, noRetry = false): void {
  switch (a.outcome) {
    case "TRANSPORT": {
      const retried = a.attempts > 1;
      throw new TransportError(
        `${what}: transport failure: ${a.reason}${retried ? " (after one retry on a fresh connection)" : " (not retried)"}`,
        a.reason,
        a.attempts,
        retried,
      );
    }
    case "DENY":
      throw new DenyError(`${what}: DENY (${a.reason}): not retried`, a.reason, a.attempts, a.refreshed);
    case "UNVERIFIED":
      throw new UnverifiedAnswerError(`${what}: refused: ${a.reason}`, a.reason, a.attempts, a.refreshed);
    case "REFRESH_ROUTE": {
      const tail = a.refreshed ? " after one retry" : a.notReplayable ? " (its body cannot be sent again)" : noRetry ? " (retries off)" : "";
      throw new RefreshRouteError(`${what}: REFRESH_ROUTE (${a.reason})${tail}`, a.reason, a.attempts, a.refreshed);
    }
    default:
      break;
  }
  if (a.status < 200 || a.status > 299) {
    let code = "";
    let msg = a.body.subarray(0, 200).toString("utf8");
    try {
      const d = JSON.parse(a.body.toString("utf8"));
      code = typeof d.code === "string" ? d.code : "";
      msg = typeof d.error === "string" ? d.error : "";
    } catch {
      /* not JSON */
    }
    const C = code === "SPACED_ENOENT" ? FileNotFoundInSandbox : OperationError;
    throw new C(`${what}: ${a.status} ${code}${msg ? ": " : ""}${msg}`, a.status, code, a.identity);
  }
}
