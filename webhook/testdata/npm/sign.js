// Signs webhook deliveries with the Standard Webhooks reference library.
// stdin: [{"secret": "whsec_…", "id", "timestamp", "body"}]; stdout: the signatures.
const { Webhook } = require("standardwebhooks");

let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map((d) =>
    new Webhook(d.secret).sign(d.id, new Date(Number(d.timestamp) * 1000), d.body));
  process.stdout.write(JSON.stringify(out));
});
