// The token source on a clock of the test's own: renewed ahead of exp, once
// for any number of callers waiting, again after a refusal, and never in a
// loop for a token that looks expired already.
import assert from "node:assert/strict";
import { test } from "node:test";
import { expiresAt, Tokens } from "../src/tokens.ts";
import { TokenError } from "../src/errors.ts";

const jwt = (claims: object) => `eyJhbGciOiJFUzI1NiJ9.${Buffer.from(JSON.stringify(claims)).toString("base64url")}.sig`;

test("exp is read from a JWT, and nothing from what is not one", () => {
  assert.equal(expiresAt(jwt({ sub: "u", exp: 1700000000 })), 1700000000_000);
  assert.equal(expiresAt(jwt({ sub: "u" })), undefined);
  assert.equal(expiresAt("opaque-token"), undefined);
  assert.equal(expiresAt("a.%%%.c"), undefined);
});

test("callers waiting together share one call of the token function", async () => {
  let calls = 0;
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const tokens = new Tokens(async () => {
    calls++;
    await gate;
    return jwt({ exp: 2e9 });
  });
  const waiting = Promise.all(Array.from({ length: 10 }, () => tokens.get()));
  release();
  const got = await waiting;
  assert.equal(calls, 1);
  assert.equal(new Set(got).size, 1);
  await tokens.get();
  assert.equal(calls, 1, "a token far from its exp is kept");
});

test("a token is renewed ahead of its exp: 30 s before, or half its life when that is shorter", async () => {
  let now = 1_000_000_000_000;
  let calls = 0;
  const tokens = new Tokens(() => jwt({ n: ++calls, exp: (now + (calls === 1 ? 3600_000 : 20_000)) / 1000 }), () => now);
  await tokens.get();
  now += 3600_000 - 30_001;
  await tokens.get();
  assert.equal(calls, 1, "kept until 30 s before exp");
  now += 2;
  await tokens.get();
  assert.equal(calls, 2, "renewed 30 s before exp");
  now += 9_999; // the second lives 20 s: renewed after 10
  await tokens.get();
  assert.equal(calls, 2);
  now += 2;
  await tokens.get();
  assert.equal(calls, 3);
});

test("a refused token is replaced once, however many callers saw it refused", async () => {
  let calls = 0;
  const tokens = new Tokens(() => `opaque-${++calls}`);
  const first = await tokens.get();
  tokens.refused(first);
  tokens.refused(first);
  const [a, b] = await Promise.all([tokens.get(), tokens.get()]);
  assert.equal(a, "opaque-2");
  assert.equal(b, "opaque-2");
  tokens.refused(first); // a late report about the old token changes nothing
  assert.equal(await tokens.get(), "opaque-2");
  assert.equal(calls, 2);
});

test("a token that looks expired is used until refused, not asked for again and again", async () => {
  let calls = 0;
  const tokens = new Tokens(() => (calls++, jwt({ exp: 1 })));
  await tokens.get();
  await tokens.get();
  assert.equal(calls, 1);
});

test("a failing token function is a TokenError, and the next call asks again", async () => {
  let calls = 0;
  const tokens = new Tokens(() => {
    if (++calls === 1) throw "signed out"; // a bare string, thrown by the app
    return "opaque";
  });
  await assert.rejects(tokens.get(), (err: unknown) => err instanceof TokenError && err.cause === "signed out" && err.code === "token");
  assert.equal(await tokens.get(), "opaque");
  const empty = new Tokens(() => "");
  await assert.rejects(empty.get(), TokenError);
});
