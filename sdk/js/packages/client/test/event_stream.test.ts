// The event-stream parser against streams generated at random and cut into
// chunks at random bytes: every line ending (CRLF, LF, CR, a CRLF cut in
// two), comments, multi-line and empty data, ids kept across events, a
// leading BOM, multi-byte characters cut between chunks.
import assert from "node:assert/strict";
import { test } from "node:test";
import { EventStreamParser, type ServerSentEvent } from "../src/event_stream.ts";

/** mulberry32: a small seeded generator, so that a failure can be replayed. */
function rng(seed: number) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PIECES = ["a", "b", "{", "}", '"', ":", " ", "é", "€", "😀", "data", "id", "\t", "x:y", "0"];

function generate(r: () => number) {
  const pick = <T>(xs: T[]) => xs[Math.floor(r() * xs.length)]!;
  const value = () => Array.from({ length: Math.floor(r() * 6) }, () => pick(PIECES)).join("");
  // A CR then an LF would be one line end, CRLF: after a CR, never LF alone.
  let last = "";
  const eol = () => (last = pick(last === "\r" ? ["\r\n", "\r"] : ["\n", "\r\n", "\r"]));
  let text = r() < 0.3 ? "\ufeff" : "";
  const want: ServerSentEvent[] = [];
  let lastEventId = "";
  const events = 1 + Math.floor(r() * 8);
  for (let e = 0; e < events; e++) {
    const lines: string[] = [];
    const data: string[] = [];
    let type = "";
    for (let l = Math.floor(r() * 6); l > 0; l--) {
      const kind = r();
      if (kind < 0.45) {
        const v = value();
        data.push(v);
        // "data:" + v unless v starts with a space, which one space before it keeps.
        lines.push(v.startsWith(" ") || r() < 0.5 ? "data: " + v : "data:" + v);
      } else if (kind < 0.6) {
        lastEventId = value().replace(/\0/g, "");
        lines.push("id: " + lastEventId);
      } else if (kind < 0.7) {
        type = value().replace(/^ /, "x");
        lines.push("event: " + type);
      } else if (kind < 0.85) {
        lines.push(":" + pick(["", " ping", "comment: with colon"]));
      } else if (kind < 0.9) {
        lines.push("retry: 1000");
      } else {
        lines.push(pick(["unknown: field", "dataX: no", "data"]));
        if (lines[lines.length - 1] === "data") data.push("");
      }
    }
    text += lines.map((l) => l + eol()).join("") + eol();
    if (data.length) want.push({ type: type || "message", data: data.join("\n"), lastEventId });
  }
  // An event the stream ends in the middle of is never dispatched.
  if (r() < 0.5) text += "data: cut off" + (r() < 0.5 ? "\r" : "");
  return { text, want };
}

function parse(bytes: Uint8Array, cuts: number[]): ServerSentEvent[] {
  const got: ServerSentEvent[] = [];
  const parser = new EventStreamParser((e) => got.push(e));
  const decoder = new TextDecoder();
  let from = 0;
  for (const to of [...cuts, bytes.length]) {
    parser.push(decoder.decode(bytes.subarray(from, to), { stream: true }));
    from = to;
  }
  parser.push(decoder.decode());
  return got;
}

test("random streams cut at random bytes parse to the events written", () => {
  const seed = Number(process.env.SSE_FUZZ_SEED ?? Date.now() % 1e9);
  const r = rng(seed);
  for (let i = 0; i < 3000; i++) {
    const { text, want } = generate(r);
    const bytes = new TextEncoder().encode(text);
    const cuts = [...new Set(Array.from({ length: Math.floor(r() * 12) }, () => Math.floor(r() * (bytes.length + 1))))].sort((a, b) => a - b);
    assert.deepEqual(parse(bytes, cuts), want, `seed ${seed}, case ${i}: ${JSON.stringify(text)} cut at ${cuts}`);
  }
});

test("every cut of one stream parses the same, byte by byte included", () => {
  const text = '\ufeff: ping\r\nid: AQ1\r\ndata: {"type":"ready","cursor":"AQ1"}\r\n\r\nid: AQ2\rdata: {"a":\rdata: "é😀"}\r\rdata:x\n\n: ping\n\n';
  const want = [
    { type: "message", data: '{"type":"ready","cursor":"AQ1"}', lastEventId: "AQ1" },
    { type: "message", data: '{"a":\n"é😀"}', lastEventId: "AQ2" },
    { type: "message", data: "x", lastEventId: "AQ2" },
  ];
  const bytes = new TextEncoder().encode(text);
  for (let i = 0; i <= bytes.length; i++) assert.deepEqual(parse(bytes, [i]), want, `cut at ${i}`);
  assert.deepEqual(parse(bytes, Array.from({ length: bytes.length }, (_, i) => i)), want, "one byte at a time");
});

test("comments reach onComment and set nothing", () => {
  const comments: string[] = [];
  const events: ServerSentEvent[] = [];
  const p = new EventStreamParser((e) => events.push(e), (c) => comments.push(c));
  p.push(": ping\n:\n:  two spaces\n\n");
  assert.deepEqual(comments, ["ping", "", " two spaces"]);
  assert.deepEqual(events, []);
  p.push("retry: 2500\nretry: soon\nid: a\0b\ndata\n\n");
  assert.equal(p.retry, 2500);
  assert.deepEqual(events, [{ type: "message", data: "", lastEventId: "" }], "an id holding NUL is ignored");
});
