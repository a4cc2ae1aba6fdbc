/**
 * WebSocket streams to a sandbox — a command, a terminal, a file watch — with
 * the recovery rules of spacectl's streams (V1–V5, S1, S2), in one place:
 *
 * - The first message must be ALLOW naming the route's own execution; anything
 *   else ends the session before a byte of output is handed on (an ALLOW
 *   without the identity, or with another one, is refused: UNVERIFIED).
 * - A refused open (close 4409 before ALLOW) gets one repair: the route is
 *   resolved again and the stream opened once more (V2).
 * - A watch or terminal cut by a replacement (4409 after ALLOW, S1) resolves the
 *   route and opens again, passing admission at the new execution (V5, S2).
 * - A command cut after it was admitted is never run again (it may have run).
 * - 4401/4403: DENY, never retried; the cache entry is dropped when it holds
 *   the refused route.
 * - An open that fails in transport is tried once more on a fresh connection
 *   for a watch or a terminal (an open is a read); never for a command.
 */
import WebSocket from "ws";

import type { Connection } from "./client";
import {
  DenyError,
  FileNotFoundInSandbox,
  OperationError,
  RefreshRouteError,
  StreamError,
  TransportError,
  UnverifiedAnswerError,
} from "./errors";
import { quote, splitUrl, tlsReason } from "./http";
import type { Route } from "./routes";

/** A request target at most: node-api refuses longer ones (414). */
export const TARGET_MAX = 8192;
/** Largest input message ('i' + bytes) node-api takes. */
export const INPUT_CHUNK = 65535;
/** Input is taken from its source only while less than this waits to be sent. */
export const TX_HIGH = 256 << 10;
/** The connection and the WebSocket handshake (ms). */
export const OPEN_TIMEOUT_MS = 30_000;

export type StreamKind = "exec" | "term" | "watch";

interface Session {
  allowed: boolean;
  closeCode: number;
  closeReason: string;
  transport: boolean;
  protocol: boolean;
  unverified: boolean;
  error: string;
  sentEof: boolean;
  done: boolean;
}

function newSession(): Session {
  return { allowed: false, closeCode: 0, closeReason: "", transport: false, protocol: false, unverified: false, error: "", sentEof: false, done: false };
}

/**
 * Runs one stream (its sessions and their recovery). Callbacks: onAdmit after
 * each admission; onOutput(kind 'o'|'e', data) for commands and terminals;
 * onWatchEvent(doc) for watches; onReopen(identity, reason, wasAdmitted)
 * before each reopen. `stdin` is a command's input (an async iterable of
 * chunks), undefined for none.
 */
export class StreamRunner {
  onAdmit?: (identity: string) => void;
  onOutput?: (kind: "o" | "e", data: Buffer) => void;
  onWatchEvent?: (doc: Record<string, unknown>) => void;
  onReopen?: (identity: string, reason: string, wasAdmitted: boolean) => void;
  stdin?: AsyncIterator<Buffer>;
  stdinEof: boolean;
  stopped = false;
  exited = false;
  exitCode: number | null = null;
  exitSignal = 0;
  readonly admissions: string[] = [];
  readonly cuts: string[] = [];

  private outq: Buffer[] = [];
  private ws?: WebSocket;
  private session?: Session;
  private inflight = 0;
  private pumping = false;
  private wake?: () => void;

  constructor(
    readonly conn: Connection,
    readonly sandbox: string,
    readonly kind: StreamKind,
    readonly target: string,
    readonly what: string,
  ) {
    this.stdinEof = kind === "watch";
  }

  // ---- from the caller ----

  /** Queues input (sent once admitted; typed while it reopens, it goes to the new one). */
  postInput(data: string | Uint8Array): void {
    const b = typeof data === "string" ? Buffer.from(data) : Buffer.from(data);
    for (let i = 0; i < b.length; i += INPUT_CHUNK) this.outq.push(Buffer.concat([Buffer.from("i"), b.subarray(i, i + INPUT_CHUNK)]));
    this.kick();
  }

  resize(rows: number, cols: number): void {
    this.outq.push(Buffer.from(`r${rows} ${cols}`));
    this.kick();
  }

  sendSignal(sig: number): void {
    this.outq.push(Buffer.from(`s${Math.trunc(sig)}`));
    this.kick();
  }

  sendEof(): void {
    this.stdinEof = true;
    this.kick();
  }

  stop(): void {
    this.stopped = true;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000, "");
    this.wake?.();
  }

  // ---- the loop ----

  /**
   * Opens the stream and serves it until the command exits, the stream is
   * stopped, or the recovery rules end it (rejected with the error).
   */
  async run(): Promise<void> {
    let rt = await this.conn.routeGet(this.sandbox);
    const st = { refusedOnce: false, transportRetry: false };
    for (;;) {
      const s = await this.runSession(rt);
      if (this.exited || this.stopped) return;
      rt = await this.recover(s, rt, st);
    }
  }

  private async recover(s: Session, rt: Route, st: { refusedOnce: boolean; transportRetry: boolean }): Promise<Route> {
    const conn = this.conn;
    const what = this.what;
    const i = s.closeReason.indexOf(":");
    const tail = i >= 0 ? s.closeReason.slice(i + 1) : s.closeReason;
    if (s.unverified) {
      conn.routeForget(this.sandbox, rt);
      throw new UnverifiedAnswerError(`${what}: refused: ${s.error}`, s.error);
    }
    if (s.closeCode === 4409) {
      conn.emit({ event: s.allowed ? "cut" : "refused", kind: this.kind, sandbox: this.sandbox, outcome: "REFRESH_ROUTE", reason: tail, workerUrl: rt.workerUrl, route: rt.identity });
      if (conn.noRetry) throw new RefreshRouteError(`${what}: REFRESH_ROUTE (${tail}) (retries off)`, tail);
      if (s.allowed && this.kind === "exec") {
        throw new StreamError(`${what}: the execution was replaced while the command ran (${s.closeReason}): not run again`, s.closeCode, s.closeReason);
      }
      if (!s.allowed && st.refusedOnce) throw new RefreshRouteError(`${what}: REFRESH_ROUTE (${tail}) after one retry`, tail, 2, true);
      if (s.allowed) this.cuts.push(s.closeReason);
      // a refused open gets one repair (V2); a stream cut after it was admitted
      // reopens through admission again (V5, S2)
      st.refusedOnce = !s.allowed;
      const [fresh, verdict] = await conn.routeRepair(this.sandbox, rt);
      conn.emit({ event: "reopen", kind: this.kind, sandbox: this.sandbox, cut: s.allowed, reason: s.closeReason, identity: fresh.identity, workerUrl: fresh.workerUrl, cache: verdict });
      this.onReopen?.(fresh.identity, s.closeReason, s.allowed);
      return fresh;
    }
    if (s.closeCode === 4401 || s.closeCode === 4403) {
      conn.emit({ event: "refused", kind: this.kind, sandbox: this.sandbox, outcome: "DENY", reason: tail, workerUrl: rt.workerUrl, route: rt.identity });
      conn.routeForget(this.sandbox, rt);
      throw new DenyError(`${what}: DENY (${tail}): not retried`, tail);
    }
    if (s.transport && !s.allowed) {
      // a watch or terminal open is a read: once more on a fresh connection; a
      // command may have started: never sent again
      if (this.kind !== "exec" && !conn.noRetry && !st.transportRetry && !this.stopped) {
        st.transportRetry = true;
        conn.emit({ event: "transport", kind: this.kind, sandbox: this.sandbox, workerUrl: rt.workerUrl, reason: s.error });
        return rt;
      }
      const retried = this.kind !== "exec" && st.transportRetry;
      throw new TransportError(`${what}: transport failure: ${s.error}${retried ? " (after one retry on a fresh connection)" : " (not retried)"}`, s.error, retried ? 2 : 1, retried);
    }
    if (s.transport || s.protocol) {
      throw new StreamError(`${what}: ${s.error}${this.kind === "exec" && s.allowed ? " (the command is not run again)" : ""}`, s.closeCode, s.closeReason);
    }
    if (s.closeCode === 1011 && s.closeReason.startsWith("error:")) {
      const code = s.closeReason.slice(6);
      const C = code === "SPACED_ENOENT" ? FileNotFoundInSandbox : OperationError;
      if (this.kind === "exec" && s.allowed && (code === "SPACED_ENOENT" || code === "SPACED_EPERM")) {
        throw new C(`${what}: the command could not be run: ${code}`, 0, code);
      }
      if (this.kind === "exec" && s.allowed) throw new C(`${what}: the command's stream failed: ${code} (the command is not run again)`, 0, code);
      throw new C(`${what}: the worker failed: ${code}`, 0, code);
    }
    if (s.closeCode >= 4000 && s.closeCode < 5000) {
      throw new OperationError(`${what}: refused by the worker: ${s.closeCode} ${s.closeReason}`, s.closeCode - 4000, s.closeReason);
    }
    throw new StreamError(`${what}: the stream ended (${s.closeCode} ${s.closeReason})`, s.closeCode, s.closeReason);
  }

  private runSession(rt: Route): Promise<Session> {
    const s = newSession();
    this.session = s;
    this.inflight = 0;
    return new Promise<Session>((resolve) => {
      let peer;
      try {
        peer = splitUrl(rt.workerUrl);
      } catch (e) {
        s.transport = true;
        s.error = (e as Error).message;
        resolve(s);
        return;
      }
      const host = peer.host.includes(":") ? `[${peer.host}]` : peer.host;
      const ws = new WebSocket(`${peer.tls ? "wss" : "ws"}://${host}:${peer.port}${peer.prefix}${this.target}`, {
        headers: { Authorization: `Bearer ${rt.capability}` },
        // wss://: the chain against the connection's CA and the host's name, always
        ...(peer.tls ? { ca: this.conn.ca, minVersion: "TLSv1.2" as const, rejectUnauthorized: true } : {}),
        perMessageDeflate: false,
        handshakeTimeout: OPEN_TIMEOUT_MS,
        maxPayload: 16 << 20,
        followRedirects: false,
      });
      this.ws = ws;
      let opened = false;
      const finish = () => {
        if (s.done && ws.readyState === WebSocket.CLOSED) return;
        s.done = true;
      };
      const fail = (flag: "transport" | "protocol" | "unverified", msg: string) => {
        if (s.done) return;
        s[flag] = true;
        s.error = msg;
        s.done = true;
        if (ws.readyState === WebSocket.OPEN) ws.close(1000, "");
        else ws.terminate();
      };
      this.wake = () => {
        if (this.stopped && !s.done) {
          s.done = true;
          if (ws.readyState === WebSocket.OPEN) ws.close(1000, "");
          else ws.terminate();
        }
      };
      ws.on("unexpected-response", (_req, res) => {
        fail("transport", `the WebSocket handshake was answered ${res.statusCode}`);
        res.resume();
      });
      ws.on("open", () => {
        opened = true;
        if (this.stopped) this.wake?.();
      });
      ws.on("message", (data: WebSocket.RawData, isBinary: boolean) => {
        if (s.done) return;
        const buf = Array.isArray(data) ? Buffer.concat(data) : Buffer.isBuffer(data) ? data : Buffer.from(data as ArrayBuffer);
        this.onMessage(ws, s, rt, buf, isBinary, fail);
      });
      ws.on("error", (e: Error & { code?: string }) => {
        if (s.done) return;
        if (opened && typeof e.code === "string" && e.code.startsWith("WS_ERR_")) fail("protocol", e.message);
        else fail("transport", tlsReason(e) ?? (e.message || String(e.code)));
      });
      ws.on("close", (code: number, reason: Buffer) => {
        if (!s.done) {
          if (code === 1006 || code === 1005) {
            s.transport = true;
            s.error = opened ? "the connection ended without a close" : "no connection";
          } else {
            s.closeCode = code;
            s.closeReason = reason.toString("utf8");
          }
        }
        finish();
        this.ws = undefined;
        resolve(s);
      });
    });
  }

  private onMessage(
    ws: WebSocket,
    s: Session,
    rt: Route,
    buf: Buffer,
    isBinary: boolean,
    fail: (flag: "transport" | "protocol" | "unverified", msg: string) => void,
  ): void {
    if (!s.allowed) {
      const doc = isBinary ? undefined : parse(buf);
      const oc = doc?.outcome;
      const ident = doc?.identity;
      if (oc !== "ALLOW") fail("protocol", "the stream's first message is not its admission (ALLOW)");
      else if (typeof ident !== "string" || !ident) fail("unverified", "ALLOW without the serving identity (not an execution's answer)");
      else if (ident !== rt.identity) fail("unverified", `ALLOW from ${ident}, not from the route's execution ${rt.identity}`);
      else {
        s.allowed = true;
        this.admissions.push(ident);
        this.conn.emit({ event: "admitted", kind: this.kind, sandbox: this.sandbox, identity: ident, workerUrl: rt.workerUrl });
        this.onAdmit?.(ident);
        this.kick();
      }
      return;
    }
    if (this.kind === "watch") {
      const doc = parse(buf);
      if (!doc || typeof doc.event !== "string") {
        fail("protocol", "a watch message that is not an event");
        return;
      }
      this.onWatchEvent?.(doc);
      return;
    }
    if (isBinary && buf.length >= 1 && (buf[0] === 0x6f || buf[0] === 0x65)) {
      this.onOutput?.(buf[0] === 0x6f ? "o" : "e", buf.subarray(1));
      return;
    }
    if (!isBinary) {
      const doc = parse(buf);
      if (doc === undefined) {
        fail("protocol", "a text message that is not JSON");
        return;
      }
      const ex = doc.exit as Record<string, unknown> | undefined;
      if (ex && typeof ex === "object") {
        this.exited = true;
        this.exitCode = typeof ex.code === "number" ? ex.code : -1;
        this.exitSignal = typeof ex.signal === "number" ? ex.signal : 0;
      }
      // other documents: room for additions, ignored
    }
    // other binary kinds: room for additions, ignored
    void ws;
  }

  private send(ws: WebSocket, b: Buffer): void {
    this.inflight += b.length;
    ws.send(b, { binary: true }, () => {
      this.inflight -= b.length;
      if (this.inflight < TX_HIGH) this.kick();
    });
  }

  /** Sends what waits: queued input, a command's stdin, the end of input. */
  private kick(): void {
    const ws = this.ws;
    const s = this.session;
    if (!ws || !s || !s.allowed || s.done || ws.readyState !== WebSocket.OPEN) return;
    while (this.outq.length && this.inflight < TX_HIGH) this.send(ws, this.outq.shift()!);
    if (this.kind === "exec" && this.stdin && !this.stdinEof) {
      if (!this.pumping && this.inflight < TX_HIGH) void this.pump(ws, s);
      return;
    }
    if (this.stdinEof && !s.sentEof && this.kind !== "watch" && this.outq.length === 0) {
      s.sentEof = true;
      this.send(ws, Buffer.from("d"));
    }
  }

  private async pump(ws: WebSocket, s: Session): Promise<void> {
    this.pumping = true;
    try {
      while (!s.done && this.inflight < TX_HIGH && this.stdin && !this.stdinEof) {
        let r: IteratorResult<Buffer>;
        try {
          r = await this.stdin.next();
        } catch (e) {
          this.stdinEof = true;
          break;
        }
        if (r.done) {
          this.stdinEof = true;
          break;
        }
        const chunk = r.value;
        if (s.done || ws.readyState !== WebSocket.OPEN) break;
        for (let i = 0; i < chunk.length; i += INPUT_CHUNK) {
          this.send(ws, Buffer.concat([Buffer.from("i"), chunk.subarray(i, i + INPUT_CHUNK)]));
        }
      }
    } finally {
      this.pumping = false;
    }
    if (this.stdinEof) this.kick();
  }
}

function parse(b: Buffer): Record<string, any> | undefined {
  try {
    const d = JSON.parse(b.toString("utf8"));
    return d && typeof d === "object" && !Array.isArray(d) ? d : undefined;
  } catch {
    return undefined;
  }
}

/** argv, env, cwd (and a terminal's size, a command's timeout) as a query. */
export function commandQuery(
  argv: string[],
  envs?: Record<string, string>,
  cwd?: string,
  size?: { rows: number; cols: number },
  timeoutMs?: number,
): string {
  const q = argv.map((a) => `argv=${quote(a)}`);
  for (const [k, v] of Object.entries(envs ?? {})) q.push(`env=${quote(`${k}=${v}`)}`);
  if (cwd !== undefined) q.push(`cwd=${quote(cwd)}`);
  if (size) q.push(`rows=${size.rows}&cols=${size.cols}`);
  if (timeoutMs) q.push(`timeout_ms=${timeoutMs}`);
  return q.join("&");
}
