// Verifies webhook deliveries with the Standard Webhooks reference library.
// stdin: [{"secret": "whsec_…", "id", "timestamp", "signature", "body", "now"}],
// now (optional, Unix seconds) being the clock the timestamp is checked against.
// stdout: one entry per delivery: {"ok": true, "payload": …} or {"ok": false, "error": "…"}.
const { Webhook } = require("standardwebhooks");
const realNow = Date.now;

let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map((d) => {
    Date.now = d.now ? () => d.now * 1000 : realNow;
    try {
      const payload = new Webhook(d.secret).verify(d.body, {
        "webhook-id": d.id,
        "webhook-timestamp": d.timestamp,
        "webhook-signature": d.signature,
      });
      return { ok: true, payload };
    } catch (e) {
      return { ok: false, error: String(e && e.message ? e.message : e) };
    }
  });
  process.stdout.write(JSON.stringify(out));
});
