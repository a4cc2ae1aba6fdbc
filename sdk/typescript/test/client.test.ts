/**
 * Unit tests of the TypeScript SDK's route rules against an in-process fake
 * control plane and fake worker on 127.0.0.1 (what a real cluster cannot
 * easily show: duplicate identity headers, a capability in its last seconds, an
 * expired session, a sandbox between two executions, unsupported create
 * settings). The same rules against real workers: tests/conformance.
 *
 *     npm run build && npm test
 */
import assert from "node:assert/strict";
import * as http from "node:http";
import * as net from "node:net";
import { after, before, beforeEach, describe, it } from "node:test";

import {
  Connection,
  ControlPlaneError,
  DenyError,
  FileNotFoundInSandbox,
  NotSupportedError,
  RefreshRouteError,
  Route,
  RouteCache,
  Sandbox,
  SpacedEvent,
  SpacedError,
  TransportError,
  UnverifiedAnswerError,
  identityText,
  parseSize,
} from "../src/index";

const SBX = "sbx-0123456789abcdef";

const ident = (gen: number, worker = "worker-1") => ({ sandbox: SBX, generation: gen, worker, substrate: "process", activation: `act-${gen}`, pod_uid: null });
const text = (gen: number, worker = "worker-1") => identityText(ident(gen, worker));
const when = (s: number) => new Date(Date.now() + s * 1000).toISOString().replace(/\.\d+Z$/, "Z");

type WorkerFn = (method: string, path: string, auth: string) => [number, [string, string][], string | object];

class Fake {
  server!: http.Server;
  url = "";
  routes: object[] = [];
  routeErrors: [number, object][] = [];
  routeCalls = 0;
  workerCalls: { method: string; path: string; auth: string }[] = [];
  cpCalls: { method: string; path: string; body: string; key: string }[] = [];
  worker: WorkerFn = () => [500, [], "no worker"];
  /** status 0: the answer is lost (the connection ends without one) */
  cpAnswer?: (method: string, path: string, body: string) => [number, object];

  async start(): Promise<void> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks).toString();
        const send = (status: number, out: string | object, headers: [string, string][] = []) => {
          const b = Buffer.from(typeof out === "string" ? out : JSON.stringify(out));
          const flat: string[] = [];
          for (const [k, v] of headers) flat.push(k, v);
          flat.push("Content-Length", String(b.length));
          res.writeHead(status, flat);
          res.end(b);
        };
        const url = req.url ?? "";
        if (url.startsWith("/w/")) {
          this.workerCalls.push({ method: req.method!, path: url.slice(2), auth: String(req.headers.authorization) });
          const [st, h, out] = this.worker(req.method!, url.slice(2), String(req.headers.authorization));
          send(st, out, h);
          return;
        }
        this.cpCalls.push({ method: req.method!, path: url, body, key: String(req.headers["idempotency-key"] ?? "") });
        if (url.endsWith("/route") && req.method === "POST") {
          this.routeCalls++;
          const e = this.routeErrors.shift();
          if (e) return send(e[0], e[1]);
          const r = this.routes.length > 1 ? this.routes.shift()! : this.routes[0];
          return send(200, r);
        }
        if (this.cpAnswer) {
          const [st, doc] = this.cpAnswer(req.method!, url, body);
          if (st === 0) return req.socket.destroy();
          return send(st, doc);
        }
        send(404, { error: "not-found", message: "no such endpoint" });
      });
    });
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.url = `http://127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
  }

  route(gen: number, worker = "worker-1", cap?: string, expires = 120): object {
    return { identity: ident(gen, worker), worker_url: `${this.url}/w`, capability: cap ?? `cap-${gen}`, expires_at: when(expires), class: "control" };
  }
}

const ok = (t: string, body = "data"): WorkerFn => () => [200, [["X-Spaced-Identity", t]], body];

describe("route rules", () => {
  const f = new Fake();
  let events: SpacedEvent[];
  let conn: Connection;
  let sbx: Sandbox;
  const entry = () => conn.cache.get(conn.cacheScope, SBX);

  before(() => f.start());
  after(() => f.server.close());
  beforeEach(() => {
    events = [];
    f.routes = [];
    f.routeErrors = [];
    f.routeCalls = 0;
    f.workerCalls = [];
    f.cpCalls = [];
    f.cpAnswer = undefined;
    conn = new Connection({ cpUrl: f.url, apiKey: "k", routeCache: new RouteCache(), onEvent: (e) => events.push(e), keepAlive: false });
    sbx = new Sandbox(SBX, conn);
  });

  it("writes identities canonically and refuses what is not one", () => {
    assert.equal(text(8, "worker-b"), `sandbox=${SBX};generation=8;worker=worker-b;substrate=process;activation=act-8;pod_uid=`);
    for (const bad of [{}, { ...ident(1), generation: 0 }, { ...ident(1), generation: 1.5 }, { ...ident(1), extra: "x" }, { ...ident(1), worker: "a;b" }]) {
      assert.throws(() => identityText(bad));
    }
    assert.throws(() => new Route({ identity: ident(1), worker_url: "http://x", capability: "c", expires_at: "soon" }), SpacedError);
  });

  it("repairs a stale route with one retry, compare-and-swaps the entry and keeps its expiry (V2–V4)", async () => {
    f.routes = [f.route(1), f.route(2, "worker-2")];
    f.worker = ok(text(1), "one");
    assert.equal((await sbx.files.read("/a")).toString(), "one");
    const exp0 = entry()!.entryExpiresAt;
    f.worker = (_m, _p, auth) =>
      auth === "Bearer cap-1" ? [409, [], { outcome: "REFRESH_ROUTE", reason: "deactivated", sandbox: SBX }] : [200, [["X-Spaced-Identity", text(2, "worker-2")]], "two"];
    const n0 = f.workerCalls.length;
    assert.equal((await sbx.files.read("/a")).toString(), "two");
    assert.deepEqual(f.workerCalls.slice(n0).map((c) => c.auth), ["Bearer cap-1", "Bearer cap-2"]);
    assert.equal(entry()!.route.capability, "cap-2");
    assert.equal(entry()!.entryExpiresAt, exp0);
    assert.ok(events.some((e) => e.event === "cache" && e.cache === "replaced"));
  });

  it("reports a second REFRESH_ROUTE after one retry", async () => {
    f.routes = [f.route(1)];
    f.worker = () => [409, [], { outcome: "REFRESH_ROUTE", reason: "deactivated" }];
    await assert.rejects(sbx.files.read("/a"), (e: unknown) => e instanceof RefreshRouteError && e.refreshed && /after one retry/.test(e.message));
    assert.equal(f.workerCalls.length, 2);
    assert.equal(f.routeCalls, 2);
  });

  it("never serves another key's route from a shared cache", async () => {
    f.routes = [f.route(1)];
    f.worker = ok(text(1), "one");
    assert.equal((await sbx.files.read("/a")).toString(), "one");
    const other = new Connection({ cpUrl: f.url, apiKey: "k2", routeCache: conn.cache, keepAlive: false });
    assert.notEqual(other.cacheScope, conn.cacheScope);
    assert.equal(other.cache.get(other.cacheScope, SBX), undefined);
    f.routes = [f.route(2, "worker-1", "cap-of-k2")];
    f.worker = ok(text(2), "two");
    const calls = f.routeCalls;
    assert.equal((await new Sandbox(SBX, other).files.read("/a")).toString(), "two");
    assert.equal(f.routeCalls, calls + 1);
    assert.equal(f.workerCalls[f.workerCalls.length - 1].auth, "Bearer cap-of-k2");
    assert.equal(entry()!.route.capability, "cap-1");
  });

  it("never lets a late refusal evict a newer entry (V3)", () => {
    const stale = new Route(f.route(1));
    conn.cache.seed(conn.cacheScope, SBX, f.route(2));
    const newer = entry();
    assert.equal(conn.cache.replaceIf(conn.cacheScope, SBX, stale, new Route(f.route(3))), "other");
    assert.equal(entry(), newer);
    assert.equal(conn.cache.forgetIf(conn.cacheScope, SBX, stale), false);
    assert.equal(entry(), newer);
  });

  it("never retries a DENY and drops the refused entry (V1, C5)", async () => {
    f.routes = [f.route(1)];
    const cases: [number, string | object][] = [
      [401, { outcome: "DENY", reason: "bad-signature" }],
      [403, { outcome: "DENY", reason: "wrong-purpose" }],
      [409, { outcome: "DENY", reason: "x" }],
      [409, "not json"],
    ];
    for (const [st, body] of cases) {
      f.worker = () => [st, [], body];
      const n0 = f.workerCalls.length;
      const r0 = f.routeCalls;
      await assert.rejects(sbx.files.read("/a"), DenyError);
      assert.equal(f.workerCalls.length - n0, 1);
      assert.equal(f.routeCalls - r0, 1);
      assert.equal(entry(), undefined);
    }
  });

  it("refuses answers that do not name the route's execution", async () => {
    f.routes = [f.route(1)];
    const cases: [string, string][][] = [[], [["X-Spaced-Identity", text(2)]], [["X-Spaced-Identity", text(1)], ["X-Spaced-Identity", text(1)]]];
    for (const h of cases) {
      f.worker = () => [200, h, "secret"];
      const n0 = f.workerCalls.length;
      await assert.rejects(sbx.files.read("/a"), (e: unknown) => e instanceof UnverifiedAnswerError && !/secret/.test(e.message));
      assert.equal(f.workerCalls.length - n0, 1);
      assert.equal(entry(), undefined);
    }
    f.worker = () => [404, [["X-Spaced-Identity", text(1)]], { code: "SPACED_ENOENT", error: "no such file" }];
    await assert.rejects(sbx.files.read("/a"), FileNotFoundInSandbox);
    assert.equal(await sbx.files.exists("/a"), false);
  });

  it("sends a read twice and a write once after a transport failure", async () => {
    let count = 0;
    const sink = net.createServer((s) => {
      count++;
      s.once("data", () => s.destroy());
    });
    await new Promise<void>((r) => sink.listen(0, "127.0.0.1", r));
    const r = f.route(1) as Record<string, unknown>;
    r.worker_url = `http://127.0.0.1:${(sink.address() as net.AddressInfo).port}`;
    f.routes = [r];
    await assert.rejects(sbx.files.write("/a", "x"), (e: unknown) => e instanceof TransportError && !e.retried);
    assert.equal(count, 1);
    await assert.rejects(sbx.files.read("/a"), (e: unknown) => e instanceof TransportError && e.retried);
    assert.equal(count, 3);
    await assert.rejects(sbx.files.mkdir("/d"), TransportError);
    assert.equal(count, 4);
    sink.close();
  });

  it("reports the raw outcome with retries off", async () => {
    const c = new Connection({ cpUrl: f.url, apiKey: "k", routeCache: new RouteCache(), noRetry: true, keepAlive: false });
    f.routes = [f.route(1)];
    f.worker = () => [409, [], { outcome: "REFRESH_ROUTE", reason: "older-generation" }];
    await assert.rejects(new Sandbox(SBX, c).files.read("/a"), (e: unknown) => e instanceof RefreshRouteError && e.reason === "older-generation" && !e.refreshed);
    assert.equal(f.workerCalls.length, 1);
  });

  it("does not use a capability in its last seconds, keeping the entry's expiry; an expired entry starts a new session", async () => {
    f.routes = [f.route(1, "worker-1", "new")];
    f.worker = ok(text(1));
    conn.cache.seed(conn.cacheScope, SBX, f.route(1, "worker-1", "old", 3), 12345678901);
    await sbx.files.read("/a");
    assert.equal(f.workerCalls[f.workerCalls.length - 1].auth, "Bearer new");
    assert.equal(entry()!.entryExpiresAt, 12345678901);
    conn.cache.seed(conn.cacheScope, SBX, f.route(1), 1);
    await sbx.files.read("/a");
    assert.ok(entry()!.entryExpiresAt > Date.now() / 1000 + 3000);
  });

  it("waits for a moving sandbox, not for a paused one", async () => {
    const moving: [number, object] = [409, { error: "not-running", state: "moving", message: "moving" }];
    f.routeErrors = [moving, moving, moving];
    f.routes = [f.route(2)];
    f.worker = ok(text(2));
    assert.equal((await sbx.files.read("/a")).toString(), "data");
    assert.equal(f.routeCalls, 4);
    conn.cache.remove(conn.cacheScope, SBX);
    f.routeErrors = [[409, { error: "not-running", state: "paused", message: "paused" }]];
    await assert.rejects(sbx.files.read("/a"), (e: unknown) => e instanceof ControlPlaneError && e.status === 409);
  });

  it("sends a create with an idempotency key once more when its answer is lost, and only then", async () => {
    let posts = 0;
    f.cpAnswer = (method, path) => {
      if (path === "/v1/sandboxes" && method === "POST") {
        posts++;
        if (posts === 1) return [0, {}]; // made, and the answer lost
        return [200, { id: SBX, state: "running", generation: 1, route: ident(1) }];
      }
      return [404, { error: "not-found", message: "no such endpoint" }];
    };
    const s = await Sandbox.create({ idempotencyKey: "job-7", connection: conn });
    assert.equal(s.id, SBX);
    assert.deepEqual(
      f.cpCalls.filter((c) => c.method === "POST" && c.path === "/v1/sandboxes").map((c) => c.key),
      ["job-7", "job-7"],
    );
    posts = 0;
    await assert.rejects(Sandbox.create({ connection: conn }), TransportError);
    assert.equal(posts, 1);
  });

  it("waits and sends a rate-limited call again, a bounded number of times, and no other 429", async () => {
    let posts = 0;
    f.cpAnswer = (method, path) => {
      if (path === "/v1/sandboxes" && method === "POST") {
        posts++;
        if (posts <= 2) return [429, { error: "rate-limited", message: "slow down", retry_after: 0 }];
        return [201, { id: SBX, state: "running", generation: 1, route: ident(1) }];
      }
      if (path.endsWith("/network")) {
        posts++;
        return [429, { error: "quota-exceeded", message: "not a rate" }];
      }
      return [404, { error: "not-found", message: "no such endpoint" }];
    };
    assert.equal((await Sandbox.create({ connection: conn })).id, SBX);
    assert.equal(posts, 3);
    assert.equal(events.filter((e) => e.event === "rate-limited").length, 2);
    posts = 0;
    await assert.rejects(conn.cp("POST", `/v1/sandboxes/${SBX}/network`, { mode: "allow" }),
      (e: unknown) => e instanceof ControlPlaneError && e.code === "quota-exceeded");
    assert.equal(posts, 1);
    f.cpAnswer = () => {
      posts++;
      return [429, { error: "rate-limited", retry_after: 0 }];
    };
    posts = 0;
    await assert.rejects(Sandbox.create({ connection: conn }), (e: unknown) => e instanceof ControlPlaneError && e.code === "rate-limited");
    assert.equal(posts, 4);
  });

  it("reports what the platform does not support instead of faking it", async () => {
    f.cpAnswer = (method, path, body) => {
      if (path === "/v1/sandboxes" && method === "POST") {
        for (const k of Object.keys(JSON.parse(body || "{}"))) {
          if (!["template", "cpus", "worker"].includes(k)) return [400, { error: "bad-request", message: `unknown member '${k}'` }];
        }
        return [201, { id: SBX, state: "running", generation: 1, route: ident(1) }];
      }
      if (method === "DELETE") return [200, {}];
      return [404, { error: "not-found", message: "no such endpoint" }];
    };
    await assert.rejects(Sandbox.create({ metadata: { a: "b" }, connection: conn }), NotSupportedError);
    await assert.rejects(Sandbox.create({ envs: { A: "1" }, connection: conn }), NotSupportedError);
    await assert.rejects(Sandbox.create({ template: "python", connection: conn }), NotSupportedError);
    assert.ok(!f.cpCalls.some((c) => c.method === "POST" && c.path === "/v1/sandboxes" && c.body.includes("template")));
    await assert.rejects(sbx.setTimeout(60), NotSupportedError);
    f.cpAnswer = () => [200, { sandboxes: [{ id: SBX, state: "running" }] }];
    await assert.rejects(Sandbox.list({ metadata: { a: "b" }, connection: conn }), NotSupportedError);
    f.routes = [{ ...f.route(1), class: "serviceport", port: 8080 }];
    await assert.rejects(sbx.expose(8080), NotSupportedError);
  });

  it("parses sizes", () => {
    assert.deepEqual([1, "512M", "2G", "10k"].map((x) => parseSize(x as number | string)), [1, 512 * 2 ** 20, 2 * 2 ** 30, 10 * 2 ** 10]);
    assert.throws(() => parseSize("lots"));
  });
});
