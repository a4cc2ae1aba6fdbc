#!/usr/bin/env node
// Conformance driver for the TypeScript SDK (@spaced/sdk, built into
// sdk/typescript/dist): one JSON request per line on stdin, one JSON answer per
// line on stdout (tests/conformance/README.md). Every answer carries "trace":
// the SDK's own account of the operation, from its onEvent hook.
"use strict";
const path = require("node:path");
const readline = require("node:readline");
const sdk = require(path.join(process.env.SPACED_TOP, "sdk", "typescript", "dist", "index.js"));

const events = [];
const conns = new Map();
const streams = new Map();

function conn(req) {
  const url = req.cp_url || process.env.SPACED_CP_URL;
  let c = conns.get(url);
  if (!c) {
    // each control plane its own cache, as spacectl's entries name their control plane
    c = new sdk.Connection({ cpUrl: url, routeCache: new sdk.RouteCache(), onEvent: (e) => events.push(e) });
    conns.set(url, c);
  }
  return c;
}

const sbx = (req) => new sdk.Sandbox(req.sbx, conn(req));
const b64 = (b) => Buffer.from(b).toString("base64");

function trace(evs) {
  const t = { allow: [], refresh: 0, deny: 0, unverified: 0, transport: 0, resolved_again: 0, cache: null };
  for (const e of evs) {
    switch (e.event) {
      case "answer":
        if (e.outcome === "ALLOW") t.allow.push(e.identity);
        else if (e.outcome === "REFRESH_ROUTE") t.refresh++;
        else if (e.outcome === "DENY") t.deny++;
        else if (e.outcome === "UNVERIFIED") t.unverified++;
        break;
      case "admitted":
        if (e.kind === "exec") t.allow.push(e.identity);
        break;
      case "refused":
        if (e.outcome === "REFRESH_ROUTE") t.refresh++;
        else t.deny++;
        break;
      case "transport":
        t.transport++;
        break;
      case "resolved":
        if (e.why === "refresh") t.resolved_again++;
        break;
      case "reopen":
        if (e.kind === "exec") {
          t.resolved_again++;
          t.cache = e.cache;
        }
        break;
      case "cache":
        t.cache = e.cache;
        break;
      default:
        break;
    }
  }
  return t;
}

async function handle(req) {
  switch (req.op) {
    case "hello":
      return { client: "typescript" };
    case "create": {
      const s = await sdk.Sandbox.create({ worker: req.worker, connection: conn(req) });
      return { id: s.id };
    }
    case "kill":
      await sbx(req).kill();
      return {};
    case "read":
      return { data_b64: b64(await sbx(req).files.read(req.path)) };
    case "write":
      await sbx(req).files.write(req.path, Buffer.from(req.data_b64, "base64"), { mkdirs: false });
      return {};
    case "list":
      return { entries: (await sbx(req).files.list(req.path)).map((e) => ({ name: e.name, type: e.type, size: e.size })) };
    case "stat": {
      const e = await sbx(req).files.stat(req.path);
      return { type: e.type, size: e.size };
    }
    case "mkdir":
      await sbx(req).files.mkdir(req.path);
      return {};
    case "mv":
      await sbx(req).files.move(req.src, req.dst);
      return {};
    case "remove":
      await sbx(req).files.remove(req.path, { recursive: !!req.recursive });
      return {};
    case "exec": {
      const opts = { envs: req.env || undefined, cwd: req.cwd || undefined };
      if (req.stdin_b64 !== undefined) opts.stdin = Buffer.from(req.stdin_b64, "base64");
      const r = await sbx(req).commands.run(req.argv, opts);
      return { stdout_b64: b64(r.stdoutBytes), stderr_b64: b64(r.stderrBytes), exit_code: r.exitCode };
    }
    case "read_many": {
      // n clients sharing this connection's cache, each its own hook: as n
      // spacectl processes sharing one cache directory
      const base = conn(req);
      const results = await Promise.all(
        Array.from({ length: req.n }, async () => {
          const evs = [];
          const c = new sdk.Connection({ cpUrl: base.cpUrl, apiKey: base.apiKey, routeCache: base.cache, onEvent: (e) => evs.push(e) });
          let r;
          try {
            r = { ok: true, data_b64: b64(await new sdk.Sandbox(req.sbx, c).files.read(req.path)) };
          } catch (e) {
            r = { ok: false, error: errorDoc(e) };
          }
          c.close();
          r.trace = trace(evs);
          return r;
        }),
      );
      return { results };
    }
    case "seed": {
      const c = conn(req);
      c.cache.seed(c.cacheScope, req.sbx, req.route);
      return {};
    }
    case "cache": {
      const c = conn(req);
      const e = c.cache.get(c.cacheScope, req.sbx);
      return { entry: e ? { identity: e.route.identity, capability: e.route.capability, entry_expires_at: e.entryExpiresAt } : null };
    }
    case "watch_start": {
      const st = { events: [], cuts: [] };
      const h = await sbx(req).files.watch(req.path, (ev) => st.events.push({ type: ev.type, path: ev.path, path2: ev.path2 ?? null }), {
        onReopen: (_id, reason, was) => was && st.cuts.push(reason),
      });
      st.handle = h;
      streams.set(req.name, st);
      return {};
    }
    case "term_start": {
      const st = { out: [], cuts: [] };
      st.handle = await sbx(req).pty.create({ onData: (d) => st.out.push(Buffer.from(d)), onReopen: (_id, reason, was) => was && st.cuts.push(reason) });
      streams.set(req.name, st);
      st.ended = false;
      st.handle.wait().then(
        () => (st.ended = true),
        () => (st.ended = true),
      );
      return {};
    }
    case "watch_state":
    case "term_state": {
      const st = streams.get(req.name);
      const h = st.handle;
      const out = { admissions: h.admissions, cuts: [...st.cuts], running: !st.ended && !h.error, error: h.error ? String(h.error.message) : null };
      if (req.op === "watch_state") out.events = [...st.events];
      else out.output_b64 = b64(Buffer.concat(st.out));
      return out;
    }
    case "term_input":
      streams.get(req.name).handle.sendInput(req.data);
      return {};
    case "term_wait": {
      const st = streams.get(req.name);
      streams.delete(req.name);
      return { exit_code: await st.handle.wait() };
    }
    case "watch_stop": {
      const st = streams.get(req.name);
      streams.delete(req.name);
      await st.handle.stop();
      return {};
    }
    default:
      throw new Error(`unknown op ${req.op}`);
  }
}

function errorDoc(e) {
  if (e instanceof sdk.RefusedError) return { kind: e.outcome, reason: e.reason, message: e.message };
  if (e instanceof sdk.TransportError) return { kind: "TRANSPORT", reason: e.reason, message: e.message };
  if (e instanceof sdk.OperationError) return { kind: "OPERATION", code: e.code, status: e.status, message: e.message };
  if (e instanceof sdk.StreamError) return { kind: "STREAM", message: e.message };
  return { kind: "OTHER", message: `${e && e.name}: ${e && e.message}` };
}

async function main() {
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line.trim()) continue;
    const req = JSON.parse(line);
    if (req.op === "quit") break;
    const start = events.length;
    let ans;
    try {
      ans = await handle(req);
      ans.ok = true;
    } catch (e) {
      ans = { ok: false, error: errorDoc(e) };
    }
    ans.trace = trace(events.slice(start));
    ans.seq = req.seq;
    process.stdout.write(JSON.stringify(ans) + "\n");
  }
  for (const st of streams.values()) {
    try {
      if (st.handle.stop) await st.handle.stop();
      else await st.handle.kill();
    } catch {
      /* ending anyway */
    }
  }
  for (const c of conns.values()) c.close();
  process.exit(0);
}

main();
