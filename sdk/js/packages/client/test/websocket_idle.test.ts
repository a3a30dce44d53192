// A WebSocket the server no longer reaches (half-open: a laptop that slept)
// looks open to a browser for many minutes; the client asks for a pong when
// the socket is quiet and ends it as a drop when nothing comes.
import assert from "node:assert/strict";
import { test } from "node:test";
import { openWebSocket, type End, type Frame, type WebSocketLike } from "../src/transports.ts";

class FakeSocket implements WebSocketLike {
  static last: FakeSocket;
  readyState = 0;
  sent: string[] = [];
  closed = false;
  onopen: ((e: any) => void) | null = null;
  onmessage: ((e: any) => void) | null = null;
  onclose: ((e: any) => void) | null = null;
  onerror: ((e: any) => void) | null = null;
  constructor(_url: string, _protocols: string[]) {
    FakeSocket.last = this;
  }
  send(data: string) {
    this.sent.push(data);
  }
  close() {
    this.closed = true;
  }
  open() {
    this.readyState = 1;
    this.onopen?.({});
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("a quiet socket asks for a pong, and one that stays silent ends as a drop", async () => {
  const ends: End[] = [];
  const frames: Frame[] = [];
  const conn = openWebSocket(FakeSocket, "ws://x/v1/stream", "t", { frame: (f) => frames.push(f), end: (e) => ends.push(e) }, 300);
  const ws = FakeSocket.last;
  ws.open();
  await sleep(150);
  assert.deepEqual(ws.sent, ['{"type":"ping"}'], "a ping after a third of the idle timeout");
  ws.onmessage?.({ data: '{"type":"pong"}' });
  await sleep(200);
  assert.equal(ends.length, 0, "an answer keeps it open");
  await sleep(250);
  assert.equal(ends.length, 1, "no frame for the whole timeout ends it");
  assert.equal(ends[0]?.code, 1006);
  assert.equal(ends[0]?.opened, true);
  assert.ok(ws.closed);
  conn.close();
});

test("frames keep a socket open without pings, and closing it stops the timers", async () => {
  const ends: End[] = [];
  const conn = openWebSocket(FakeSocket, "ws://x/v1/stream", "t", { frame: () => {}, end: (e) => ends.push(e) }, 300);
  const ws = FakeSocket.last;
  ws.open();
  for (let i = 0; i < 6; i++) {
    await sleep(60);
    ws.onmessage?.({ data: '{"type":"read","id":"x"}' });
  }
  assert.deepEqual(ws.sent, [], "no ping while frames come");
  conn.close();
  await sleep(400);
  assert.equal(ends.length, 0, "a socket the app closed reports no drop");
});
