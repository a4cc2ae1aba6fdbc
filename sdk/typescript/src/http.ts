/**
 * HTTP/1.1 exchanges with the control plane and with workers (Node's own http).
 *
 * One request is one exchange: the request written whole, the answer read whole
 * (its Content-Length or chunked framing). Any failure before the answer is
 * whole — no connection, a connection cut, an answer cut short or malformed —
 * rejects with an ExchangeError: the request may or may not have reached the
 * peer, and the caller's recovery rules decide whether it is sent again
 * (docs/client.md). Node's http client never sends a request twice by itself.
 *
 * Worker connections are kept for the next request only while idle less than
 * IDLE_REUSE_MS (the agent closes free sockets after that), as spacectl's.
 */
import * as http from "node:http";
import { Readable } from "node:stream";

/** A kept connection is reused only while idle less than this (node-api keeps them 30 s). */
export const IDLE_REUSE_MS = 2000;
/** Largest answer body read into memory. */
export const ANSWER_MAX = 1 << 30;

/** A transport failure (the request may or may not have been delivered). */
export class ExchangeError extends Error {}

export interface Peer {
  host: string;
  port: number;
  prefix: string;
}

/** `http://HOST:PORT/prefix` → its parts (only http:// for now: no TLS yet). */
export function splitUrl(url: string): Peer {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new ExchangeError(`bad URL ${JSON.stringify(url)} (http://HOST:PORT expected)`);
  }
  if (u.protocol !== "http:" || !u.hostname) {
    throw new ExchangeError(`bad URL ${JSON.stringify(url)} (http://HOST:PORT expected)`);
  }
  const host = u.hostname.startsWith("[") ? u.hostname.slice(1, -1) : u.hostname;
  return { host, port: u.port ? Number(u.port) : 80, prefix: u.pathname.replace(/\/+$/, "") };
}

/** Percent-encodes a query value as spacectl does ('/' kept). */
export function quote(s: string): string {
  return encodeURIComponent(s)
    .replace(/%2F/gi, "/")
    .replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
}

/** A whole answer. */
export interface Answer {
  status: number;
  /** every header line as given: [name, value] */
  headers: [string, string][];
  body: Buffer;
}

export function headerAll(a: Answer, name: string): string[] {
  const n = name.toLowerCase();
  return a.headers.filter(([k]) => k.toLowerCase() === n).map(([, v]) => v);
}

/**
 * A request body read as it is sent. `length` is its size when known
 * (Content-Length), else undefined (chunked). `rewind()` gives the body again
 * for a retry, or undefined when it cannot.
 */
export interface BodySource {
  length?: number;
  open(): Readable;
  rewind(): boolean;
}

/** A body source over a Readable: read once, not replayable. */
export function readableSource(r: Readable, length?: number): BodySource {
  let used = false;
  return {
    length,
    open() {
      used = true;
      return r;
    },
    rewind() {
      return !used;
    },
  };
}

export function isBodySource(b: unknown): b is BodySource {
  return !!b && typeof b === "object" && typeof (b as BodySource).open === "function";
}

/** The kept-alive agent of worker connections (undefined: a connection per request). */
export function workerAgent(keepAlive: boolean): http.Agent | undefined {
  return keepAlive ? new http.Agent({ keepAlive: true, maxFreeSockets: 8, timeout: IDLE_REUSE_MS, scheduling: "lifo" }) : undefined;
}

/**
 * Sends one request to the peer at base URL url and reads its whole answer.
 * `path` is the target after the URL's own prefix; `body` a Buffer, a
 * BodySource or undefined; `agent` a kept-alive agent (workerAgent) or
 * undefined for a connection of its own.
 */
export function exchange(
  agent: http.Agent | undefined,
  url: string,
  method: string,
  path: string,
  headers: Record<string, string>,
  body: Buffer | BodySource | undefined,
  timeoutMs: number,
  answerMax = ANSWER_MAX,
): Promise<Answer> {
  return new Promise<Answer>((resolve, reject) => {
    let peer: Peer;
    try {
      peer = splitUrl(url);
    } catch (e) {
      reject(e);
      return;
    }
    const hdrs: Record<string, string> = { ...headers };
    if (!agent) hdrs["Connection"] = "close";
    let src: Readable | undefined;
    if (isBodySource(body)) {
      if (body.length !== undefined) hdrs["Content-Length"] = String(body.length);
      else hdrs["Transfer-Encoding"] = "chunked";
    } else {
      hdrs["Content-Length"] = String(body ? body.length : 0);
    }
    let settled = false;
    const fail = (msg: string) => {
      if (settled) return;
      settled = true;
      req.destroy();
      reject(new ExchangeError(msg));
    };
    const req = http.request(
      {
        host: peer.host,
        port: peer.port,
        method,
        path: peer.prefix + path,
        headers: hdrs,
        agent: agent ?? false,
        setHost: true,
      },
      (res) => {
        const chunks: Buffer[] = [];
        let total = 0;
        res.on("data", (c: Buffer) => {
          total += c.length;
          if (total > answerMax) {
            fail(`answer larger than ${answerMax} bytes`);
            return;
          }
          chunks.push(c);
        });
        res.on("aborted", () => fail("answer cut short"));
        res.on("error", (e) => fail(`answer cut short (${e.message})`));
        res.on("end", () => {
          if (settled) return;
          if (!res.complete) {
            fail("answer cut short");
            return;
          }
          settled = true;
          const h: [string, string][] = [];
          for (let i = 0; i + 1 < res.rawHeaders.length; i += 2) h.push([res.rawHeaders[i], res.rawHeaders[i + 1]]);
          resolve({ status: res.statusCode ?? 0, headers: h, body: Buffer.concat(chunks) });
        });
      },
    );
    req.setNoDelay(true);
    req.setTimeout(timeoutMs, () => fail("timed out"));
    req.on("error", (e: NodeJS.ErrnoException) => fail(e.code === "ECONNREFUSED" ? "connection refused" : e.message || String(e.code)));
    if (isBodySource(body)) {
      src = body.open();
      src.on("error", (e) => fail(`cannot read the body: ${e.message}`));
      src.pipe(req);
    } else {
      req.end(body ?? undefined);
    }
  });
}
