/**
 * Sandboxes, their files, commands and terminals (DESIGN.md section 6, "SDKs").
 *
 *     import { Sandbox } from "@spaced/sdk";
 *     const sbx = await Sandbox.create();
 *     await sbx.files.write("/workspace/hello.txt", "hi");
 *     const r = await sbx.commands.run("cat /workspace/hello.txt");
 *     console.log(r.stdout, r.exitCode);
 *     await sbx.kill();
 *
 * Every operation on a sandbox goes to the worker that serves it through the
 * route cache and the recovery rules of spacectl (V1–V5, see client.ts and
 * stream.ts).
 */
import { Readable } from "node:stream";
import { StringDecoder } from "node:string_decoder";

import { Connection, ConnectionOptions, Request, isNoEndpoint } from "./client";
import { ControlPlaneError, FileNotFoundInSandbox, NotSupportedError, SpacedError, TransportError } from "./errors";
import { BodySource, quote, readableSource } from "./http";
import { Route } from "./routes";
import { StreamRunner, TARGET_MAX, commandQuery } from "./stream";

/** Bytes from a number or a string such as '512M', '2G' (powers of 1024). */
export function parseSize(v: number | string): number {
  if (typeof v === "number") {
    if (!Number.isSafeInteger(v) || v < 0) throw new Error(`not a size: ${v}`);
    return v;
  }
  const m = /^\s*(\d+)\s*([KMGT]?)(i?B?)?\s*$/i.exec(v);
  if (!m) throw new Error(`not a size: ${JSON.stringify(v)}`);
  const mult: Record<string, number> = { "": 1, K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40 };
  return Number(m[1]) * mult[m[2].toUpperCase()];
}

/** Options every static method takes: an existing Connection, or how to make one. */
export interface ConnectOpts extends ConnectionOptions {
  connection?: Connection;
}

function connectionOf(o: ConnectOpts = {}): Connection {
  return o.connection ?? new Connection(o);
}

/** A sandbox as the control plane describes it (`raw` holds the whole document). */
export class SandboxInfo {
  readonly id: string;
  readonly state: string;
  readonly generation: number;
  readonly route: Record<string, unknown> | null;
  readonly worker: string | null;
  readonly substrate: string;
  readonly resources?: Record<string, number>;
  readonly template?: string | null;
  readonly metadata?: Record<string, string>;
  readonly network?: Record<string, unknown>;
  readonly idleTimeout?: number;
  readonly maxLifetime?: number;
  readonly created?: string;

  constructor(readonly raw: Record<string, any>) {
    this.id = raw.id;
    this.state = raw.state;
    this.generation = raw.generation;
    this.route = raw.route ?? null;
    this.worker = raw.worker ?? null;
    this.substrate = raw.substrate;
    this.resources = raw.resources;
    this.template = raw.template !== undefined ? raw.template : raw.spec?.template;
    this.metadata = raw.metadata;
    this.network = raw.network;
    this.idleTimeout = raw.idle_timeout;
    this.maxLifetime = raw.max_lifetime;
    this.created = raw.created;
  }
}

/** A file or directory. */
export interface EntryInfo {
  /** absolute path */
  path: string;
  /** its path under the directory listed, or its last component */
  name: string;
  type: "file" | "dir" | "symlink" | "other" | string;
  size: number;
  mode: number;
  /** Unix seconds */
  mtime: number;
}

function entry(doc: Record<string, any>, path?: string, under?: string): EntryInfo {
  const p: string = doc.path ?? path ?? "";
  const full = under !== undefined ? `${under.replace(/\/+$/, "")}/${p}` : p;
  const name = under !== undefined ? p : p.replace(/\/+$/, "").split("/").pop() ?? "";
  return { path: full, name, type: doc.type, size: doc.size, mode: doc.mode, mtime: doc.mtime };
}

/** A file event. */
export interface FilesystemEvent {
  type: "create" | "modify" | "delete" | "move" | "overflow" | string;
  path: string;
  /** for a move: the new name */
  path2?: string;
}

/** A finished command. */
export interface CommandResult {
  /** text (invalid UTF-8 replaced) */
  stdout: string;
  stderr: string;
  /** exactly the bytes */
  stdoutBytes: Buffer;
  stderrBytes: Buffer;
  /** its status, 128+N when signal N ended it; null when it was killed from here */
  exitCode: number | null;
  /** 0 or N */
  signal: number;
  timedOut: boolean;
  /** the execution that ran it */
  identity: string;
}

const exitCodeOf = (code: number, sig: number) => (sig ? 128 + (sig & 127) : code);

function argvOf(cmd: string | string[]): string[] {
  if (typeof cmd === "string") return ["/bin/sh", "-c", cmd];
  if (!Array.isArray(cmd) || cmd.length === 0 || !cmd.every((a) => typeof a === "string")) {
    throw new TypeError("cmd: a shell command line or a non-empty array of strings");
  }
  return [...cmd];
}

export type Data = string | Uint8Array | ArrayBuffer;
export type StdinSource = Data | Readable | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>;

function toBuffer(d: Data): Buffer {
  if (typeof d === "string") return Buffer.from(d);
  if (d instanceof ArrayBuffer) return Buffer.from(new Uint8Array(d));
  return Buffer.from(d.buffer, d.byteOffset, d.byteLength);
}

async function* chunksOf(src: StdinSource): AsyncGenerator<Buffer> {
  if (typeof src === "string" || src instanceof Uint8Array || src instanceof ArrayBuffer) {
    const b = toBuffer(src);
    for (let i = 0; i < b.length; i += 1 << 16) yield b.subarray(i, i + (1 << 16));
    return;
  }
  for await (const c of src as AsyncIterable<Uint8Array | string>) yield typeof c === "string" ? Buffer.from(c) : Buffer.from(c);
}

class TextSink {
  readonly parts: Buffer[] = [];
  private dec = new StringDecoder("utf8");
  constructor(private cb?: (s: string) => void) {}
  feed(d: Buffer): void {
    this.parts.push(Buffer.from(d));
    if (this.cb) {
      const t = this.dec.write(d);
      if (t) this.cb(t);
    }
  }
  end(): void {
    if (this.cb) {
      const t = this.dec.end();
      if (t) this.cb(t);
    }
  }
  bytes(): Buffer {
    return Buffer.concat(this.parts);
  }
}

/** `sbx.files`: files of the sandbox (docs/node-api.md "Requests"). */
export class Files {
  constructor(private readonly s: Sandbox) {}

  private call(req: Request, what: string) {
    return this.s.connection.callOk(this.s.id, req, what);
  }

  /** The file's bytes. A read cut in transport is sent once more on a fresh connection. */
  async read(path: string): Promise<Buffer> {
    const a = await this.call({ method: "GET", op: `files?path=${quote(path)}`, idempotent: true }, "files.read");
    return a.body;
  }

  /** The file as UTF-8 text. */
  async readText(path: string): Promise<string> {
    return (await this.read(path)).toString("utf8");
  }

  /**
   * Writes data (a string, bytes, or a Readable of any size) to path, replacing
   * it atomically; parent directories are made unless mkdirs is false. Never
   * sent twice after a transport failure. A Readable cannot be sent again, so
   * a REFRESH_ROUTE answer to it is reported, not retried.
   */
  async write(path: string, data: Data | Readable, opts: { mkdirs?: boolean; mode?: number; length?: number } = {}): Promise<EntryInfo> {
    let q = `files?path=${quote(path)}${opts.mkdirs === false ? "" : "&mkdirs=1"}`;
    if (opts.mode !== undefined) q += `&mode=${opts.mode.toString(8)}`;
    const body: Buffer | BodySource = data instanceof Readable ? readableSource(data, opts.length) : toBuffer(data);
    await this.call({ method: "PUT", op: q, body, contentType: "application/octet-stream" }, "files.write");
    return { path, name: path.split("/").pop() ?? "", type: "file", size: Buffer.isBuffer(body) ? body.length : opts.length ?? -1, mode: opts.mode ?? 0o644, mtime: 0 };
  }

  /** The entries under path (`depth` levels, 1–64). */
  async list(path: string, opts: { depth?: number } = {}): Promise<EntryInfo[]> {
    const a = await this.call({ method: "GET", op: `list?path=${quote(path)}&depth=${opts.depth ?? 1}`, idempotent: true }, "files.list");
    const doc = JSON.parse(a.body.toString("utf8"));
    return (doc.entries ?? []).map((e: Record<string, any>) => entry(e, undefined, path));
  }

  async stat(path: string): Promise<EntryInfo> {
    const a = await this.call({ method: "GET", op: `stat?path=${quote(path)}`, idempotent: true }, "files.stat");
    return entry(JSON.parse(a.body.toString("utf8")), path);
  }

  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof FileNotFoundInSandbox) return false;
      throw e;
    }
  }

  /** Makes a directory and its parents. */
  async mkdir(path: string, opts: { mode?: number } = {}): Promise<boolean> {
    const q = `mkdir?path=${quote(path)}${opts.mode !== undefined ? `&mode=${opts.mode.toString(8)}` : ""}`;
    await this.call({ method: "POST", op: q }, "files.mkdir");
    return true;
  }

  async move(src: string, dst: string): Promise<void> {
    await this.call({ method: "POST", op: `move?from=${quote(src)}&to=${quote(dst)}` }, "files.move");
  }

  /** alias of move */
  rename(src: string, dst: string): Promise<void> {
    return this.move(src, dst);
  }

  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.call({ method: "DELETE", op: `files?path=${quote(path)}${opts.recursive ? "&recursive=1" : ""}` }, "files.remove");
  }

  /**
   * Watches path (recursively); onEvent is called for each file event. When the
   * sandbox's execution is replaced (a move, a resume elsewhere) the watch opens
   * again at the new one (V5); events in between are not seen. Resolves once
   * the watch is admitted (or rejects with what refused it).
   */
  async watch(
    path: string,
    onEvent: (e: FilesystemEvent) => void,
    opts: { onReopen?: (identity: string, reason: string, wasAdmitted: boolean) => void; onError?: (e: Error) => void } = {},
  ): Promise<WatchHandle> {
    const r = new StreamRunner(this.s.connection, this.s.id, "watch", `/v1/sandboxes/${this.s.id}/watch?path=${quote(path)}`, "files.watch");
    r.onWatchEvent = (d) => onEvent({ type: d.event as string, path: d.path as string, ...(typeof d.path2 === "string" ? { path2: d.path2 } : {}) });
    r.onReopen = opts.onReopen;
    const h = new WatchHandle(r, opts.onError);
    await h.admitted();
    return h;
  }
}

/** A stream run in the background, its end (or error) kept. */
class Background {
  error?: Error;
  protected readonly done: Promise<void>;
  private admittedP: Promise<boolean>;

  constructor(protected readonly r: StreamRunner, onError?: (e: Error) => void) {
    let admit!: (v: boolean) => void;
    this.admittedP = new Promise<boolean>((res) => (admit = res));
    const prev = r.onAdmit;
    r.onAdmit = (id) => {
      admit(true);
      prev?.(id);
    };
    this.done = r.run().then(
      () => admit(r.admissions.length > 0),
      (e: Error) => {
        this.error = e;
        admit(false);
        onError?.(e);
      },
    );
  }

  /** The identities that admitted the stream, in order (one more per reopen). */
  get admissions(): string[] {
    return [...this.r.admissions];
  }

  /** Resolves once first admitted; rejects with what ended the stream before. */
  async admitted(): Promise<void> {
    if (!(await this.admittedP)) {
      await this.done;
      throw this.error ?? new SpacedError("the stream ended before it was admitted");
    }
  }
}

export class WatchHandle extends Background {
  /** Ends the watch. */
  async stop(): Promise<void> {
    this.r.stop();
    await this.done;
  }
  close(): Promise<void> {
    return this.stop();
  }
}

/**
 * A terminal (PTY) in the sandbox. Output goes to onData; input with
 * sendInput(); it survives a replacement of the execution by opening a new
 * terminal at the new one (the old shell's state is gone with its execution).
 */
export class Terminal extends Background {
  sendInput(data: string | Uint8Array): void {
    this.r.postInput(data);
  }
  resize(size: { rows: number; cols: number }): void {
    this.r.resize(size.rows, size.cols);
  }
  sendEof(): void {
    this.r.sendEof();
  }
  /** Closes the terminal (its process group is killed). */
  async kill(): Promise<void> {
    this.r.stop();
    await this.done;
  }
  /** Its command's exit status (128+N for signal N); rejects with what ended it otherwise. */
  async wait(): Promise<number | null> {
    await this.done;
    if (this.error) throw this.error;
    return this.r.exited ? exitCodeOf(this.r.exitCode ?? -1, this.r.exitSignal) : null;
  }
}

function b64url(s: string): Buffer {
  return Buffer.from(s.replace(/-/g, "+").replace(/_/g, "/"), "base64");
}

function resultFromJson(doc: Record<string, any>, identity: string): CommandResult {
  const stream = (k: string) =>
    typeof doc[k] === "string" ? Buffer.from(doc[k], "utf8") : typeof doc[`${k}_b64url`] === "string" ? b64url(doc[`${k}_b64url`]) : Buffer.alloc(0);
  const out = stream("stdout");
  const err = stream("stderr");
  const sig = typeof doc.signal === "number" ? doc.signal : 0;
  const code = typeof doc.exit_code === "number" ? doc.exit_code : -1;
  return { stdout: out.toString("utf8"), stderr: err.toString("utf8"), stdoutBytes: out, stderrBytes: err, exitCode: exitCodeOf(code, sig), signal: sig, timedOut: !!doc.timed_out, identity };
}

/** A command started in the background. */
export class CommandHandle {
  constructor(
    private readonly s: Sandbox,
    /** its id in the sandbox (`proc`) */
    readonly pid: number,
    /** its process ID there */
    readonly osPid: number | null,
    private readonly onStdout?: (s: string) => void,
    private readonly onStderr?: (s: string) => void,
  ) {}

  /**
   * Waits for the command's end: its CommandResult (with the last 64 KiB of
   * each output the sandbox kept). The callbacks get that output now.
   */
  async wait(): Promise<CommandResult> {
    const a = await this.s.connection.callOk(this.s.id, { method: "GET", op: `procs/${this.pid}/output`, idempotent: true, timeoutMs: 24 * 3600_000 }, "commands.wait");
    const r = resultFromJson(JSON.parse(a.body.toString("utf8")), a.identity);
    if (this.onStdout && r.stdout) this.onStdout(r.stdout);
    if (this.onStderr && r.stderr) this.onStderr(r.stderr);
    return r;
  }

  kill(): Promise<boolean> {
    return this.s.commands.kill(this.pid);
  }

  sendSignal(sig: number): Promise<void> {
    return this.s.commands.sendSignal(this.pid, sig);
  }
}

export interface RunOpts {
  envs?: Record<string, string>;
  cwd?: string;
  onStdout?: (s: string) => void;
  onStderr?: (s: string) => void;
  /** a string, bytes, a Readable or an (async) iterable of chunks; passed through with its end */
  stdin?: StdinSource;
  /** seconds: the sandbox kills the command then (`timedOut`) */
  timeout?: number;
}

function finish(r: StreamRunner, out: TextSink, err: TextSink, timeout: number | undefined, started: number): CommandResult {
  out.end();
  err.end();
  const ob = out.bytes();
  const eb = err.bytes();
  const identity = r.admissions[r.admissions.length - 1] ?? "";
  if (!r.exited) {
    // killed from here: the sandbox killed its process group, no status came
    return { stdout: ob.toString("utf8"), stderr: eb.toString("utf8"), stdoutBytes: ob, stderrBytes: eb, exitCode: null, signal: 0, timedOut: false, identity };
  }
  const timedOut = !!timeout && r.exitSignal === 9 && Date.now() - started >= timeout * 1000;
  return { stdout: ob.toString("utf8"), stderr: eb.toString("utf8"), stdoutBytes: ob, stderrBytes: eb, exitCode: exitCodeOf(r.exitCode ?? -1, r.exitSignal), signal: r.exitSignal, timedOut, identity };
}

/** A command running in the foreground of its stream (Commands.start). */
export class RunningCommand extends Background {
  private readonly started = Date.now();
  constructor(
    r: StreamRunner,
    private readonly out: TextSink,
    private readonly err: TextSink,
    private readonly timeout?: number,
  ) {
    super(r);
  }
  /** Input for the command. */
  sendStdin(data: string | Uint8Array): void {
    this.r.postInput(data);
  }
  closeStdin(): void {
    this.r.sendEof();
  }
  /** Sends signal sig (1–64) to the command's process group. */
  sendSignal(sig: number): void {
    this.r.sendSignal(sig);
  }
  /** Closes the stream: the sandbox kills the command's process group; wait() then gives exitCode null. */
  async kill(): Promise<void> {
    this.r.stop();
    await this.done;
  }
  /** The CommandResult once the command ended; rejects with what ended its stream otherwise. */
  async wait(): Promise<CommandResult> {
    await this.done;
    if (this.error) throw this.error;
    return finish(this.r, this.out, this.err, this.timeout, this.started);
  }
}

/** `sbx.commands`: commands in the sandbox. */
export class Commands {
  constructor(private readonly s: Sandbox) {}

  /**
   * Runs cmd (a shell command line, or an argv array) and resolves to its
   * CommandResult; a non-zero exit is not an error. Output streams to
   * onStdout/onStderr as it comes.
   *
   * A command is never sent twice: a refused open is repaired once (V2), but
   * a command cut after it started rejects with StreamError, not run again.
   *
   * With `background: true` it starts detached and resolves to a CommandHandle
   * at once (its output is kept by the sandbox and handed over by wait()).
   */
  run(cmd: string | string[], opts: RunOpts & { background: true }): Promise<CommandHandle>;
  run(cmd: string | string[], opts?: RunOpts & { background?: false }): Promise<CommandResult>;
  async run(cmd: string | string[], opts: RunOpts & { background?: boolean } = {}): Promise<CommandResult | CommandHandle> {
    const argv = argvOf(cmd);
    if (opts.background) {
      if (opts.stdin !== undefined) throw new NotSupportedError("commands.run: a background command takes no stdin");
      const body: Record<string, unknown> = { argv, background: true };
      if (opts.envs) body.env = { ...opts.envs };
      if (opts.cwd !== undefined) body.cwd = opts.cwd;
      if (opts.timeout) body.timeout_ms = Math.round(opts.timeout * 1000);
      const a = await this.s.connection.callOk(this.s.id, { method: "POST", op: "exec", body: Buffer.from(JSON.stringify(body)), contentType: "application/json" }, "commands.run");
      const doc = JSON.parse(a.body.toString("utf8"));
      return new CommandHandle(this.s, doc.proc, doc.pid ?? null, opts.onStdout, opts.onStderr);
    }
    const { r, out, err } = this.runner(argv, opts);
    if (opts.stdin !== undefined) r.stdin = chunksOf(opts.stdin);
    r.stdinEof = opts.stdin === undefined;
    const started = Date.now();
    await r.run();
    return finish(r, out, err, opts.timeout, started);
  }

  /**
   * Starts cmd as run() does and resolves to a RunningCommand once it is
   * admitted: output goes to the callbacks, input is sent with sendStdin() and
   * ended with closeStdin() (unless `stdin` was given), sendSignal() and kill()
   * stop it, wait() gives its result.
   */
  async start(cmd: string | string[], opts: RunOpts = {}): Promise<RunningCommand> {
    const { r, out, err } = this.runner(argvOf(cmd), opts);
    if (opts.stdin !== undefined) r.stdin = chunksOf(opts.stdin);
    const h = new RunningCommand(r, out, err, opts.timeout);
    await h.admitted();
    return h;
  }

  private runner(argv: string[], opts: RunOpts): { r: StreamRunner; out: TextSink; err: TextSink } {
    const tmo = opts.timeout ? Math.round(opts.timeout * 1000) : undefined;
    const target = `/v1/sandboxes/${this.s.id}/exec?${commandQuery(argv, opts.envs, opts.cwd, undefined, tmo)}`;
    if (target.length > TARGET_MAX) {
      throw new RangeError(
        `commands.run: the command line is too long for a streamed command (at most ${TARGET_MAX} bytes encoded); pass a long script on stdin: run(["sh", "-s"], { stdin: script })`,
      );
    }
    const out = new TextSink(opts.onStdout);
    const err = new TextSink(opts.onStderr);
    const r = new StreamRunner(this.s.connection, this.s.id, "exec", target, "commands.run");
    r.onOutput = (k, d) => (k === "o" ? out : err).feed(d);
    return { r, out, err };
  }

  /** The background commands. */
  async list(): Promise<Array<{ proc: number; pid: number; running: boolean; exit_code: number; signal: number; argv0: string }>> {
    const a = await this.s.connection.callOk(this.s.id, { method: "GET", op: "procs", idempotent: true }, "commands.list");
    return JSON.parse(a.body.toString("utf8")).procs ?? [];
  }

  /** A handle on a background command already started. */
  connect(pid: number, opts: { onStdout?: (s: string) => void; onStderr?: (s: string) => void } = {}): CommandHandle {
    return new CommandHandle(this.s, pid, null, opts.onStdout, opts.onStderr);
  }

  /** Kills a background command's process group and forgets it. */
  async kill(pid: number): Promise<boolean> {
    await this.s.connection.callOk(this.s.id, { method: "DELETE", op: `procs/${Math.trunc(pid)}` }, "commands.kill");
    return true;
  }

  async sendSignal(pid: number, sig = 15): Promise<void> {
    await this.s.connection.callOk(this.s.id, { method: "POST", op: `procs/${Math.trunc(pid)}/signal?signal=${Math.trunc(sig)}` }, "commands.sendSignal");
  }
}

/** `sbx.pty`: terminals in the sandbox. */
export class Pty {
  constructor(private readonly s: Sandbox) {}

  /**
   * Opens a terminal running cmd (default /bin/sh) on a PTY of rows × cols.
   * Resolves once it is admitted.
   */
  async create(
    opts: {
      cmd?: string | string[];
      rows?: number;
      cols?: number;
      envs?: Record<string, string>;
      cwd?: string;
      onData?: (data: Buffer) => void;
      onReopen?: (identity: string, reason: string, wasAdmitted: boolean) => void;
      onError?: (e: Error) => void;
    } = {},
  ): Promise<Terminal> {
    const argv = opts.cmd !== undefined ? argvOf(opts.cmd) : ["/bin/sh"];
    const target = `/v1/sandboxes/${this.s.id}/term?${commandQuery(argv, opts.envs, opts.cwd, { rows: opts.rows ?? 24, cols: opts.cols ?? 80 })}`;
    if (target.length > TARGET_MAX) throw new RangeError("pty.create: the command line is too long");
    const r = new StreamRunner(this.s.connection, this.s.id, "term", target, "pty");
    if (opts.onData) {
      const cb = opts.onData;
      r.onOutput = (_k, d) => cb(d);
    }
    r.onReopen = opts.onReopen;
    const t = new Terminal(r, opts.onError);
    await t.admitted();
    return t;
  }
}

export interface CreateOpts extends ConnectOpts {
  template?: string;
  envs?: Record<string, string>;
  metadata?: Record<string, string>;
  cpus?: number;
  /** bytes or a size ('512M') */
  memory?: number | string;
  pids?: number;
  disk?: number | string;
  network?: "allow" | "deny";
  allowOut?: string[];
  denyOut?: string[];
  worker?: string;
  substrate?: string;
  /** lifetime in seconds (deleted after) */
  timeout?: number;
  /** seconds without activity before it is paused */
  idleTimeout?: number;
  /** "on-failure": when its execution ends, the control plane resumes it (a new generation), at most 5 times in 10 minutes */
  restart?: "never" | "on-failure";
  /**
   * 1-64 of [A-Za-z0-9._:-]: names this create. The control plane answers a create with a key it has
   * seen with the sandbox that one made, so a create whose answer was lost (TransportError) is sent
   * once more with the same key and makes no second sandbox.
   */
  idempotencyKey?: string;
}

/** A sandbox. Make one with Sandbox.create() or Sandbox.connect(id). */
export class Sandbox {
  readonly files: Files;
  readonly commands: Commands;
  readonly pty: Pty;

  constructor(
    readonly id: string,
    readonly connection: Connection,
    private info?: SandboxInfo,
  ) {
    this.files = new Files(this);
    this.commands = new Commands(this);
    this.pty = new Pty(this);
  }

  /** sandboxId (as in the Python SDK's `sbx.id`) */
  get sandboxId(): string {
    return this.id;
  }

  /**
   * Creates a sandbox and resolves to it running. template, envs, metadata and
   * the network policy are sent to the control plane; one that does not take
   * them rejects with NotSupportedError (nothing is left created then).
   */
  static async create(opts: CreateOpts = {}): Promise<Sandbox> {
    const conn = connectionOf(opts);
    const body: Record<string, unknown> = {};
    if (opts.template !== undefined) {
      await checkTemplate(conn, opts.template);
      body.template = opts.template;
    }
    const plain: [string, unknown][] = [
      ["cpus", opts.cpus],
      ["pids", opts.pids],
      ["worker", opts.worker],
      ["substrate", opts.substrate],
      ["idle_timeout", opts.idleTimeout],
      ["max_lifetime", opts.timeout],
    ];
    for (const [k, v] of plain) if (v !== undefined) body[k] = v;
    if (opts.memory !== undefined) body.memory_bytes = parseSize(opts.memory);
    if (opts.disk !== undefined) body.disk_bytes = parseSize(opts.disk);
    const extras: string[] = [];
    if (opts.envs && Object.keys(opts.envs).length) {
      body.env = { ...opts.envs };
      extras.push("env");
    }
    if (opts.metadata && Object.keys(opts.metadata).length) {
      body.metadata = { ...opts.metadata };
      extras.push("metadata");
    }
    if (opts.network !== undefined || opts.allowOut?.length || opts.denyOut?.length) {
      body.network = { mode: opts.network ?? "deny", allow_out: opts.allowOut ?? [], deny_out: opts.denyOut ?? [] };
      extras.push("network");
    }
    if (opts.restart !== undefined) {
      body.restart = opts.restart;
      extras.push("restart");
    }
    let doc: Record<string, any>;
    const headers: Record<string, string> =
      opts.idempotencyKey !== undefined ? { "Idempotency-Key": opts.idempotencyKey } : {};
    try {
      try {
        [, doc] = await conn.cp("POST", "/v1/sandboxes", body, undefined, headers);
      } catch (e) {
        if (!(e instanceof TransportError) || opts.idempotencyKey === undefined) throw e;
        [, doc] = await conn.cp("POST", "/v1/sandboxes", body, undefined, headers); // the same key: no second one
      }
    } catch (e) {
      if (e instanceof ControlPlaneError && e.status === 400 && extras.some((k) => e.message.includes(`'${k}'`))) {
        throw new NotSupportedError(`Sandbox.create(${extras.join(", ")}): the control plane does not support it (${e.message})`);
      }
      throw e;
    }
    const info = new SandboxInfo(doc);
    const missing: string[] = [];
    if (body.metadata && (typeof info.metadata !== "object" || info.metadata === null)) missing.push("metadata");
    if (body.network && (typeof info.network !== "object" || info.network === null)) missing.push("network");
    if (missing.length) {
      await conn.cp("DELETE", `/v1/sandboxes/${info.id}`); // not left behind half-made
      throw new NotSupportedError(`Sandbox.create: the control plane accepted ${missing.join(", ")} but does not show it on sandbox ${info.id}`);
    }
    return new Sandbox(info.id, conn, info);
  }

  /**
   * The sandbox sandboxId (it must exist: NotFoundError otherwise). `route`: a
   * saved route (a `spacectl route --json` document) to start from, as a stale
   * cache would.
   */
  static async connect(sandboxId: string, opts: ConnectOpts & { route?: unknown } = {}): Promise<Sandbox> {
    const conn = connectionOf(opts);
    const [, doc] = await conn.cp("GET", `/v1/sandboxes/${sandboxId}`);
    if (opts.route !== undefined) conn.cache.seed(conn.cacheScope, sandboxId, opts.route);
    return new Sandbox(sandboxId, conn, new SandboxInfo(doc));
  }

  /** The tenant's sandboxes, those whose metadata holds every pair of `metadata` when given. */
  static async list(opts: ConnectOpts & { metadata?: Record<string, string> } = {}): Promise<SandboxInfo[]> {
    const conn = connectionOf(opts);
    const meta = opts.metadata && Object.keys(opts.metadata).length ? opts.metadata : undefined;
    const q = meta ? "?" + Object.entries(meta).map(([k, v]) => `meta=${quote(`${k}=${v}`)}`).join("&") : "";
    const [, doc] = await conn.cp("GET", `/v1/sandboxes${q}`);
    let out: SandboxInfo[] = (doc.sandboxes ?? []).map((d: Record<string, any>) => new SandboxInfo(d));
    if (meta) {
      for (const i of out) {
        if (typeof i.metadata !== "object" || i.metadata === null) {
          throw new NotSupportedError(`Sandbox.list({metadata}): the control plane keeps no metadata (sandbox ${i.id} has none in its description)`);
        }
      }
      out = out.filter((i) => Object.entries(meta).every(([k, v]) => i.metadata![k] === v));
    }
    return out;
  }

  async getInfo(): Promise<SandboxInfo> {
    const [, doc] = await this.connection.cp("GET", `/v1/sandboxes/${this.id}`);
    this.info = new SandboxInfo(doc);
    return this.info;
  }

  /** alias of getInfo */
  inspect(): Promise<SandboxInfo> {
    return this.getInfo();
  }

  private async lifecycle(op: string, body: Record<string, unknown> = {}): Promise<SandboxInfo> {
    const [, doc] = await this.connection.cp("POST", `/v1/sandboxes/${this.id}/${op}`, body);
    this.info = new SandboxInfo(doc);
    return this.info;
  }

  /** Freezes the running execution (the generation stays). */
  pause(): Promise<SandboxInfo> {
    return this.lifecycle("pause");
  }

  /** Resumes it (on worker: a new execution there). */
  resume(worker?: string): Promise<SandboxInfo> {
    return this.lifecycle("resume", worker ? { worker } : {});
  }

  /**
   * Moves it to worker: a new execution (generation) there. Operations through
   * the old route are refused and repaired (V2); streams reopen at the new
   * execution (V5).
   */
  move(worker: string): Promise<SandboxInfo> {
    return this.lifecycle("move", { to: worker });
  }

  snapshot(): Promise<SandboxInfo> {
    return this.lifecycle("snapshot");
  }

  /** Deletes the sandbox. */
  async kill(): Promise<boolean> {
    await this.connection.cp("DELETE", `/v1/sandboxes/${this.id}`);
    const e = this.connection.cache.get(this.connection.cacheScope, this.id);
    if (e) this.connection.cache.forgetIf(this.connection.cacheScope, this.id, e.route);
    return true;
  }

  /** Changes when the sandbox is reaped (seconds from now). */
  async setTimeout(seconds: number): Promise<void> {
    try {
      await this.connection.cp("POST", `/v1/sandboxes/${this.id}/timeout`, { timeout: Math.trunc(seconds) });
    } catch (e) {
      if (isNoEndpoint(e)) throw new NotSupportedError(`setTimeout: the control plane does not support it (${(e as Error).message})`);
      throw e;
    }
  }

  /** The route operations use now (from the cache, or resolved). */
  route(): Promise<Route> {
    return this.connection.routeGet(this.id);
  }

  /** CPU, memory, pids and disk used, and the limits (`spacectl top`). */
  async usage(): Promise<Record<string, unknown>> {
    const a = await this.connection.callOk(this.id, { method: "GET", op: "usage", idempotent: true }, "usage");
    const doc = JSON.parse(a.body.toString("utf8"));
    delete doc.ok;
    return doc;
  }

  /** The URL of the sandbox's port through spaced-netgtw (a ServicePort). */
  async expose(port: number, protocol = "http"): Promise<string> {
    return (await this.exposeInfo(port, protocol)).url;
  }

  /** The ServicePort: `{url, capability, expiresAt, identity}`. */
  async exposeInfo(port: number, protocol = "http"): Promise<{ url: string; capability: string; expiresAt: string; identity: unknown }> {
    const [, doc] = await this.connection.cp("POST", `/v1/sandboxes/${this.id}/route`, { purposes: ["serviceport"], port: Math.trunc(port), protocol });
    if (typeof doc.url !== "string" || !doc.url) {
      throw new NotSupportedError(
        `expose(${port}): the control plane issued a ServicePort capability but names no URL for it (no ServicePort gateway, spaced-netgtw, serves this sandbox)`,
      );
    }
    return { url: doc.url, capability: doc.capability, expiresAt: doc.expires_at, identity: doc.identity };
  }
}

/**
 * A template is only sent where the control plane knows templates: without its
 * template list the sandbox would start from the worker's default root and the
 * template would be silently ignored.
 */
async function checkTemplate(conn: Connection, name: string): Promise<void> {
  let doc: Record<string, any>;
  try {
    [, doc] = await conn.cp("GET", "/v1/templates");
  } catch (e) {
    if (isNoEndpoint(e)) {
      throw new NotSupportedError(`template ${JSON.stringify(name)}: the control plane has no templates (GET /v1/templates: ${(e as Error).message}); a sandbox would not start from it`);
    }
    throw e;
  }
  const names = (doc.templates ?? []).map((t: unknown) => (t && typeof t === "object" ? (t as Record<string, unknown>).name : t));
  if (!names.includes(name)) throw new SpacedError(`template ${JSON.stringify(name)}: no such template (the control plane has: ${names.join(", ") || "none"})`);
}
