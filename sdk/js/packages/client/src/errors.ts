// Every error the SDK throws or reports is a SpoolcastError: one class per
// kind of answer the server gives (keyed by the problem+json `type` it
// sends, docs/api.md "problem types"), one for a network that failed, one
// for a token function that failed. None is ever a bare string.

/** An RFC 9457 problem document as central sends it (`application/problem+json`). */
export interface Problem {
  /** `urn:spoolcast:problem:<slug>` */
  type: string;
  title?: string;
  status?: number;
  detail?: string;
  instance?: string;
  /** The request field at fault, when one is. */
  field?: string;
  [extension: string]: unknown;
}

const PREFIX = "urn:spoolcast:problem:";

/** The base class of every error the SDK throws or reports. */
export class SpoolcastError extends Error {
  // Names are written out: a minifier renames classes.
  override name = "SpoolcastError";
  /** The problem's slug (`rate-limited`, `invalid-cursor`, …), or the SDK's own code (`network`, `token`, `closed`, …). */
  readonly code: string;
  /** The HTTP status; 0 when there was no answer. */
  readonly status: number;
  /** The problem document the server sent, when it sent one. */
  readonly problem?: Problem;
  /** The request field at fault (`problem.field`). */
  readonly field?: string;
  /** Seconds the server asked to wait (`Retry-After`), when it did. */
  readonly retryAfter?: number;

  constructor(message: string, init: { code: string; status?: number; problem?: Problem; retryAfter?: number; cause?: unknown }) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.code = init.code;
    this.status = init.status ?? 0;
    this.problem = init.problem;
    this.field = init.problem?.field;
    this.retryAfter = init.retryAfter;
  }
}

/** 429 `rate-limited`: past the user's (or the address's) request rate; `retryAfter` says for how long. */
export class RateLimitedError extends SpoolcastError {
  override name = "RateLimitedError";
}
/** 429 `too-many-sockets`: the user holds the most streams one replica serves one user. */
export class TooManySocketsError extends SpoolcastError {
  override name = "TooManySocketsError";
}
/** 401 `unauthorized`: the token was refused even after the token function was asked for a new one. */
export class UnauthorizedError extends SpoolcastError {
  override name = "UnauthorizedError";
}
/** 403 `forbidden` or `origin-not-allowed`. */
export class ForbiddenError extends SpoolcastError {
  override name = "ForbiddenError";
}
/** 404 `not-found` (another user's id is not found too), `stream-disabled`, `preferences-external`. */
export class NotFoundError extends SpoolcastError {
  override name = "NotFoundError";
}
/** 400 `invalid-cursor`: a cursor that does not decode, or one from another history of the database: start again from the top. */
export class InvalidCursorError extends SpoolcastError {
  override name = "InvalidCursorError";
}
/** 400 `invalid-request`, `invalid-query`, `invalid-token`, …: the request breaks a rule; `field` names it. */
export class InvalidRequestError extends SpoolcastError {
  override name = "InvalidRequestError";
}
/** 503 (`database-unavailable`, `stream-unavailable`, `starting`, …): retry after `retryAfter`. */
export class UnavailableError extends SpoolcastError {
  override name = "UnavailableError";
}
/** 426 `app-update-required`: the app's version (the `appVersion` option) is below the server's floor. */
export class AppUpdateRequiredError extends SpoolcastError {
  override name = "AppUpdateRequiredError";
}
/** No answer: the connection failed or broke (`cause` holds what the platform threw), or the answer was unreadable. */
export class NetworkError extends SpoolcastError {
  override name = "NetworkError";
}
/** The `token` function threw or returned something that is not a token (`cause` holds what it threw). */
export class TokenError extends SpoolcastError {
  override name = "TokenError";
}
/** The client was closed: nothing more is sent. */
export class ClientClosedError extends SpoolcastError {
  override name = "ClientClosedError";
}

type ErrorClass = new (message: string, init: ConstructorParameters<typeof SpoolcastError>[1]) => SpoolcastError;

const bySlug: Record<string, ErrorClass> = {
  "rate-limited": RateLimitedError,
  "too-many-sockets": TooManySocketsError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  "origin-not-allowed": ForbiddenError,
  "not-found": NotFoundError,
  "stream-disabled": NotFoundError,
  "preferences-external": NotFoundError,
  "invalid-cursor": InvalidCursorError,
  "invalid-request": InvalidRequestError,
  "invalid-query": InvalidRequestError,
  "invalid-token": InvalidRequestError,
  "app-update-required": AppUpdateRequiredError,
};

const byStatus: Record<number, ErrorClass> = {
  400: InvalidRequestError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  426: AppUpdateRequiredError,
  429: RateLimitedError,
  503: UnavailableError,
};

/** retryAfter reads `Retry-After`: seconds, or an HTTP date. */
function retryAfter(value: string | null): number | undefined {
  if (!value) return undefined;
  const n = /^\d+$/.test(value.trim()) ? Number(value) : (Date.parse(value) - Date.now()) / 1000;
  return Number.isNaN(n) ? undefined : Math.max(0, n);
}

/** errorFromResponse makes the typed error of a refusal, from its problem document when it has one. */
export async function errorFromResponse(res: Response): Promise<SpoolcastError> {
  let problem: Problem | undefined;
  try {
    const body = (await res.json()) as Problem;
    if (body && typeof body.type === "string") problem = body;
  } catch {
    // Not a problem document (a proxy's page, say): the status alone says what.
  }
  const slug = problem?.type.startsWith(PREFIX) ? problem.type.slice(PREFIX.length) : "";
  const Class = bySlug[slug] ?? byStatus[res.status] ?? SpoolcastError;
  const message = problem ? `${problem.title ?? slug}${problem.detail ? `: ${problem.detail}` : ""}` : `HTTP ${res.status}`;
  return new Class(message, { code: slug || `http-${res.status}`, status: res.status, problem, retryAfter: retryAfter(res.headers.get("Retry-After")) });
}
