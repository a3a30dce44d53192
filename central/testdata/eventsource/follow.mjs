// Follows a user's live stream with the eventsource package (an SSE client
// spoolcast did not write) and prints one JSON line per thing that happens:
// {"event":"open"}, {"event":"message","id":…,"data":…} for every message,
// {"event":"error","code":…,"state":…}, {"event":"reopen"}, {"event":"done"}.
//
// SPOOLCAST_BASE is central (or a proxy in front of replicas); SPOOLCAST_TOKEN
// the user's token; SPOOLCAST_AUTH is "header" (Authorization on every
// request, through the package's fetch option: its own reconnects resume
// with Last-Event-ID) or "ticket" (a browser's way: ?ticket= from POST
// /v1/stream/tickets; the package's reconnect repeats the used ticket and is
// refused, so a new EventSource opens with a new ticket and
// ?after=<its last event id>, as docs/api.md says). It exits once
// SPOOLCAST_NOTIFICATIONS notifications have come. Nothing is deduplicated:
// the Go test asserts what the server sent.
import { EventSource } from "eventsource";

const base = process.env.SPOOLCAST_BASE;
const token = process.env.SPOOLCAST_TOKEN;
const mode = process.env.SPOOLCAST_AUTH;
const want = Number(process.env.SPOOLCAST_NOTIFICATIONS);

const print = (o) => process.stdout.write(JSON.stringify(o) + "\n");
let notifications = 0;
let lastId = "";

async function ticket() {
  const res = await fetch(`${base}/v1/stream/tickets`, { method: "POST", headers: { Authorization: `Bearer ${token}` } });
  if (res.status !== 201) throw new Error(`POST /v1/stream/tickets: ${res.status} ${await res.text()}`);
  return (await res.json()).ticket;
}

async function open(after) {
  let url = `${base}/v1/stream`;
  let init = {};
  if (mode === "ticket") {
    const q = new URLSearchParams({ ticket: await ticket() });
    if (after) q.set("after", after);
    url += `?${q}`;
  } else {
    init = { fetch: (input, opts) => fetch(input, { ...opts, headers: { ...opts.headers, Authorization: `Bearer ${token}` } }) };
  }
  const es = new EventSource(url, init);
  es.onopen = () => print({ event: "open" });
  es.onmessage = (e) => {
    // This package gives a message its own id (empty for read and close
    // events, which carry none), not the stream's last one as browsers
    // do; it keeps the stream's for its reconnects.
    if (e.lastEventId) lastId = e.lastEventId;
    const data = JSON.parse(e.data);
    print({ event: "message", id: e.lastEventId, data });
    if (data.type === "notification" && ++notifications === want) {
      print({ event: "done" });
      es.close();
      process.exit(0);
    }
  };
  es.onerror = (e) => {
    print({ event: "error", code: e.code ?? null, state: es.readyState });
    if (es.readyState === EventSource.CLOSED) {
      // Refused (a used ticket): the package gives up; the app opens anew.
      print({ event: "reopen" });
      open(lastId).catch(fail);
    }
  };
}

function fail(err) {
  print({ event: "fatal", message: String(err) });
  process.exit(1);
}

open("").catch(fail);
