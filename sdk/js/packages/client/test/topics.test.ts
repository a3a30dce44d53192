// Topics through the client against real replicas: the user's topics page
// by name, joining an open topic keeps the first subscription, a closed
// topic is not found, and leaving twice is no error.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { SpoolcastClient, InvalidRequestError, NotFoundError } from "@spoolcast/client";
import { env, mint, needsServer, setTopic, user } from "./harness.ts";

test("a user lists their topics, joins and leaves the open ones", needsServer, async (t) => {
  const u = user("topics");
  const client = new SpoolcastClient({ baseUrl: env.base, token: () => mint(u), transport: "sse" });
  t.after(() => client.close());
  const tag = randomUUID().slice(0, 8);
  const open = `releases.${tag}`, staff = `staff.${tag}`;
  await setTopic(open, true);
  await setTopic(staff, false, [u]);

  const joined = await client.topics.subscribe(open);
  assert.equal(joined.topic, open);
  assert.equal(joined.open, true);
  assert.match(joined.subscribedAt, /^\d{4}-\d\d-\d\dT/);
  const again = await client.topics.subscribe(open);
  assert.equal(again.subscribedAt, joined.subscribedAt, "joining again keeps the first subscription");

  await assert.rejects(client.topics.subscribe(`closed-or-missing.${tag}`), (e: unknown) => e instanceof NotFoundError && e.status === 404);
  await assert.rejects(client.topics.unsubscribe(staff), (e: unknown) => e instanceof NotFoundError, "a closed topic's members are a service's to manage");
  await assert.rejects(client.topics.subscribe("Not A Topic"), (e: unknown) => e instanceof InvalidRequestError && e.status === 400);

  const first = await client.topics.list({ limit: 1 });
  assert.deepEqual(first.data.map((s) => [s.topic, s.open]), [[open, true]]);
  assert.equal(first.nextAfter, open);
  const second = await client.topics.list({ limit: 1, after: first.nextAfter! });
  assert.deepEqual(second.data.map((s) => [s.topic, s.open]), [[staff, false]]);
  assert.equal(second.nextAfter, null);

  await client.topics.unsubscribe(open);
  await client.topics.unsubscribe(open);
  assert.deepEqual((await client.topics.list()).data.map((s) => s.topic), [staff]);
});
