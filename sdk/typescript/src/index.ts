/**
 * @spaced/sdk — the TypeScript SDK of the spaced sandbox platform.
 *
 *     import { Sandbox } from "@spaced/sdk";
 *     const sbx = await Sandbox.create();
 *     await sbx.files.write("/workspace/a.txt", "hello");
 *     console.log((await sbx.commands.run("cat /workspace/a.txt")).stdout);
 *     await sbx.kill();
 *
 * The control plane comes from $SPACED_CP_URL and $SPACED_API_KEY unless
 * given. Operations reach the one execution their route names, or nothing: a
 * stale route is repaired by one retry (REFRESH_ROUTE), a DENY is never
 * retried, an answer that does not name the route's execution is refused
 * (DESIGN V1–V5).
 */
export {
  Sandbox,
  SandboxInfo,
  Files,
  Commands,
  Pty,
  Terminal,
  WatchHandle,
  CommandHandle,
  RunningCommand,
  parseSize,
} from "./sandbox";
export type { CommandResult, EntryInfo, FilesystemEvent, RunOpts, CreateOpts, ConnectOpts, Data, StdinSource } from "./sandbox";
export { Connection, classify } from "./client";
export type { ConnectionOptions, SpacedEvent, CallAnswer, Request, Outcome } from "./client";
export { Route, RouteCache, DEFAULT_CACHE, identityText, SESSION_TTL, CAP_MARGIN, RESOLVE_WAIT } from "./routes";
export type { RouteDoc, IdentityDoc, CacheVerdict, CacheEntry } from "./routes";
export {
  SpacedError,
  ConfigError,
  ControlPlaneError,
  NotFoundError,
  NotSupportedError,
  RefusedError,
  DenyError,
  RefreshRouteError,
  UnverifiedAnswerError,
  TransportError,
  OperationError,
  FileNotFoundInSandbox,
  StreamError,
} from "./errors";
