// Each problem type central sends becomes its own class, carrying its
// fields; an answer that is not a problem is typed by its status.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  errorFromResponse,
  InvalidCursorError,
  NotFoundError,
  RateLimitedError,
  SpoolcastError,
  TooManySocketsError,
  UnavailableError,
} from "../src/errors.ts";

const problem = (status: number, slug: string, headers: Record<string, string> = {}, extra: object = {}) =>
  new Response(JSON.stringify({ type: `urn:spoolcast:problem:${slug}`, title: "T", status, detail: "why", ...extra }), {
    status,
    headers: { "Content-Type": "application/problem+json", ...headers },
  });

test("a problem's type picks the class and its fields come along", async () => {
  const rate = await errorFromResponse(problem(429, "rate-limited", { "Retry-After": "3" }));
  assert.ok(rate instanceof RateLimitedError && rate instanceof SpoolcastError && rate instanceof Error);
  assert.equal(rate.name, "RateLimitedError");
  assert.equal(rate.code, "rate-limited");
  assert.equal(rate.status, 429);
  assert.equal(rate.retryAfter, 3);
  assert.equal(rate.message, "T: why");
  assert.equal(rate.problem?.detail, "why");

  const sockets = await errorFromResponse(problem(429, "too-many-sockets", { "Retry-After": "10" }));
  assert.ok(sockets instanceof TooManySocketsError);
  assert.equal(sockets.retryAfter, 10);

  const cursor = await errorFromResponse(problem(400, "invalid-cursor", {}, { field: "after" }));
  assert.ok(cursor instanceof InvalidCursorError);
  assert.equal(cursor.field, "after");

  const disabled = await errorFromResponse(problem(404, "stream-disabled"));
  assert.ok(disabled instanceof NotFoundError);
  assert.equal(disabled.code, "stream-disabled");
});

test("an answer without a problem is typed by its status, and Retry-After may be a date", async () => {
  const at = new Date(Date.now() + 5000).toUTCString();
  const e = await errorFromResponse(new Response("<html>bad gateway</html>", { status: 503, headers: { "Retry-After": at } }));
  assert.ok(e instanceof UnavailableError);
  assert.equal(e.code, "http-503");
  assert.ok(e.retryAfter! > 3 && e.retryAfter! <= 5, `retryAfter ${e.retryAfter}`);
  const other = await errorFromResponse(new Response("", { status: 418 }));
  assert.equal(other.constructor, SpoolcastError);
  assert.equal(other.message, "HTTP 418");
});
