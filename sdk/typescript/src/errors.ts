/**
 * Errors of the spaced SDK. Every failure is one of these, so a caller can tell
 * a refusal by the platform's identity rules (DENY, REFRESH_ROUTE after its one
 * retry, an answer that does not name the route's execution) from a transport
 * failure, from an operation that was admitted and failed, from a feature the
 * platform does not have.
 */

/** Base of every error thrown by the SDK. */
export class SpacedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** No control plane URL or API key. */
export class ConfigError extends SpacedError {}

/** The control plane answered with an error status. */
export class ControlPlaneError extends SpacedError {
  constructor(
    message: string,
    /** HTTP status */
    readonly status: number,
    /** the control plane's error code (`not-found`, `busy`, `quota-exceeded`, …) */
    readonly code: string,
    /** the decoded answer */
    readonly body: Record<string, unknown>,
  ) {
    super(message);
  }
}

/** No such sandbox (also: another tenant's sandbox). */
export class NotFoundError extends ControlPlaneError {}

/**
 * The platform does not have this feature (yet), or refused it: thrown instead
 * of pretending (a template the control plane cannot apply, a create-time
 * setting it does not take, a ServicePort without a gateway URL).
 */
export class NotSupportedError extends SpacedError {}

/** A worker refused the operation (R6) and the recovery rules end there. */
export class RefusedError extends SpacedError {
  /** `DENY`, `REFRESH_ROUTE` or `UNVERIFIED` */
  readonly outcome: string = "";
  constructor(
    message: string,
    /** the worker's reason (`bad-signature`, `deactivated`, …) */
    readonly reason: string,
    /** requests sent */
    readonly attempts = 1,
    /** whether the route was resolved again (V2) */
    readonly refreshed = false,
  ) {
    super(message);
  }
}

/** DENY: never retried (V1, C5). */
export class DenyError extends RefusedError {
  override readonly outcome = "DENY";
}

/** REFRESH_ROUTE after the one rebuilt retry (V2), or with retries off. */
export class RefreshRouteError extends RefusedError {
  override readonly outcome = "REFRESH_ROUTE";
}

/**
 * An answer that does not carry the identity of the route's execution (no
 * X-Spaced-Identity, or another one): refused, its body dropped (I2, I3).
 */
export class UnverifiedAnswerError extends RefusedError {
  override readonly outcome = "UNVERIFIED";
}

/**
 * No usable answer: no connection, a connection cut, a malformed answer. Reads
 * are sent once more on a fresh connection; writes and commands never.
 */
export class TransportError extends SpacedError {
  constructor(
    message: string,
    readonly reason: string,
    readonly attempts = 1,
    /** whether it was sent twice */
    readonly retried = false,
  ) {
    super(message);
  }
}

/** The route's execution admitted the operation and it failed. */
export class OperationError extends SpacedError {
  constructor(
    message: string,
    /** HTTP status (404, 422, …) */
    readonly status: number,
    /** spaced error name (`SPACED_ENOENT`, …) */
    readonly code: string,
    /** the execution that answered */
    readonly identity = "",
  ) {
    super(message);
  }
}

/** `SPACED_ENOENT`: no such file or directory in the sandbox. */
export class FileNotFoundInSandbox extends OperationError {}

/**
 * A stream (command, terminal, watch) ended otherwise than by its end: cut while
 * a command ran (never run again), a protocol error, a backend failure.
 */
export class StreamError extends SpacedError {
  constructor(
    message: string,
    readonly closeCode = 0,
    readonly closeReason = "",
  ) {
    super(message);
  }
}
