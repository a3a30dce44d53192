import { SpoolcastError, TokenError } from "./errors.js";

/** Gives the user's bearer token (an OIDC JWT); called again on a 401 and ahead of the token's `exp`. */
export type TokenFunction = () => string | Promise<string>;

/** How long before its `exp` a token is replaced, at most: half its lifetime when that is shorter. */
const AHEAD_MS = 30_000;

/**
 * expiresAt reads a JWT's `exp` (ms since the epoch) without verifying it:
 * only to ask for a new token before the server refuses this one.
 * @internal
 */
export function expiresAt(token: string): number | undefined {
  try {
    const part = token.split(".")[1]!.replace(/-/g, "+").replace(/_/g, "/");
    const exp = (JSON.parse(atob(part)) as { exp?: unknown }).exp;
    return typeof exp === "number" ? exp * 1000 : undefined;
  } catch {
    return undefined; // not a JWT, or no atob: a 401 will tell
  }
}

/**
 * Tokens keeps the current token and asks the token function for a new one
 * ahead of its expiry or after a 401, one call at a time: concurrent callers
 * share the call in flight.
 * @internal
 */
export class Tokens {
  current?: string;
  private renewAt = 0;
  private pending?: Promise<string>;

  constructor(
    private readonly fn: TokenFunction,
    private readonly now: () => number = Date.now,
  ) {}

  /** get returns the current token, or a new one once it is due for renewal. */
  get(): Promise<string> {
    return this.current !== undefined && this.now() < this.renewAt ? Promise.resolve(this.current) : this.renew();
  }

  /** refused says the server refused token: the next get asks for a new one, unless one came meanwhile. */
  refused(token: string): void {
    if (this.current === token) this.current = undefined;
  }

  private renew(): Promise<string> {
    if (this.pending) return this.pending;
    const p = Promise.resolve()
      .then(this.fn)
      .then(
        (token) => {
          if (typeof token !== "string" || !token) throw new TokenError("the token function returned no token", { code: "token" });
          const now = this.now();
          const exp = expiresAt(token);
          const life = exp === undefined ? 0 : exp - now;
          // A token that looks expired already (a clock off, say) is used
          // until the server refuses it, never asked for in a loop.
          this.renewAt = life > 0 ? now + life - Math.min(AHEAD_MS, life / 2) : Infinity;
          this.current = token;
          return token;
        },
        (err: unknown) => {
          throw err instanceof SpoolcastError ? err : new TokenError("the token function failed", { code: "token", cause: err });
        },
      );
    this.pending = p;
    const done = () => {
      if (this.pending === p) this.pending = undefined;
    };
    p.then(done, done);
    return p;
  }
}
