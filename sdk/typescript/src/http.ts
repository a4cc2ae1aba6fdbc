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
 *
 * `https://` URLs speak TLS (1.2 or 1.3): the server's chain is verified
 * against the CA given (`SPACED_CA_FILE` by default; else Node's trust store)
 * and its certificate must name the host dialled (an IP address as an IP
 * SAN). Verification is never turned off.
 */
import * as fs from "node:fs";
import * as http from "node:http";
import * as https from "node:https";
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
  /** https:// (TLS) */
  tls: boolean;
}

/** `https://HOST:PORT/prefix` or `http://…` → its parts. */
export function splitUrl(url: string): Peer {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new ExchangeError(`bad URL ${JSON.stringify(url)} (https://HOST:PORT expected)`);
  }
  if ((u.protocol !== "http:" && u.protocol !== "https:") || !u.hostname) {
    throw new ExchangeError(`bad URL ${JSON.stringify(url)} (https://HOST:PORT expected)`);
  }
  const tls = u.protocol === "https:";
  const host = u.hostname.startsWith("[") ? u.hostname.slice(1, -1) : u.hostname;
  return { host, port: u.port ? Number(u.port) : tls ? 443 : 80, prefix: u.pathname.replace(/\/+$/, ""), tls };
}

/** The CA certificates of caFile (default: $SPACED_CA_FILE), or undefined: Node's trust store. */
export function loadCa(caFile?: string): Buffer | undefined {
  const f = caFile || process.env.SPACED_CA_FILE;
  if (!f) return undefined;
  try {
    return fs.readFileSync(f);
  } catch (e) {
    throw new ExchangeError(`cannot read the CA file ${f}: ${(e as Error).message}`);
  }
}

/** A readable reason for a TLS failure of Node's. */
export function tlsReason(e: NodeJS.ErrnoException): string | undefined {
  const code = e.code ?? "";
  if (code === "SELF_SIGNED_CERT_IN_CHAIN" || code === "UNABLE_TO_GET_ISSUER_CERT_LOCALLY" || code === "DEPTH_ZERO_SELF_SIGNED_CERT") {
    return `TLS: the server's certificate is refused (${e.message}) (is SPACED_CA_FILE the CA that signed it?)`;
  }
  if (code === "ERR_TLS_CERT_ALTNAME_INVALID" || code.startsWith("CERT_") || code.startsWith("ERR_SSL") || code.startsWith("ERR_TLS")) {
    return `TLS: ${e.message}`;
  }
  return undefined;
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

/** The kept-alive agent of worker connections (undefined: a connection per request); https with ca. */
export function workerAgent(keepAlive: boolean, tls = false, ca?: Buffer): http.Agent | undefined {
  if (!keepAlive) return undefined;
  const o = { keepAlive: true, maxFreeSockets: 8, timeout: IDLE_REUSE_MS, scheduling: "lifo" as const };
  return tls ? new https.Agent({ ...o, ca, minVersion: "TLSv1.2", rejectUnauthorized: true }) : new http.Agent(o);
}

/**
 * Sends one request to the peer at base URL url and reads its whole answer.
 * `path` is the target after the URL's own prefix; `body` a Buffer, a
 * BodySource or undefined; `agent` a kept-alive agent (workerAgent, of the
 * URL's scheme) or undefined for a connection of its own; `ca` the CA an
 * https:// peer is verified against (undefined: Node's trust store).
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
  ca?: Buffer,
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
    const opts: https.RequestOptions = {
      host: peer.host,
      port: peer.port,
      method,
      path: peer.prefix + path,
      headers: hdrs,
      agent: agent ?? false,
      setHost: true,
    };
    if (peer.tls) {
      opts.ca = ca;
      opts.minVersion = "TLSv1.2";
      opts.rejectUnauthorized = true;
    }
    const req = (peer.tls ? https : http).request(
      opts,
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
    req.on("error", (e: NodeJS.ErrnoException) =>
      fail(e.code === "ECONNREFUSED" ? "connection refused" : tlsReason(e) ?? (e.message || String(e.code))),
    );
    if (isBodySource(body)) {
      src = body.open();
      src.on("error", (e) => fail(`cannot read the body: ${e.message}`));
      src.pipe(req);
    } else {
      req.end(body ?? undefined);
    }
  });
}
