// Builds static/inbox.js, the page's one script, from src/inbox.ts, the
// SDK's client and the store under its React hooks (their sources in
// sdk/js/packages, so no build of the SDK comes first; the store uses no
// React), with the esbuild of the SDK's npm workspace, and checks its types
// under strict first. `make inbox` runs it; the Go test
// TestTheCommittedBundleIsWhatItsSourcesBuild runs it with an output of its
// own (node build.mjs OUT) and compares. Go embeds the result, so building
// spoolcast never needs Node.
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const require = createRequire(here("../sdk/js/package.json"));
const esbuild = require("esbuild");

execFileSync(process.execPath, [here("../sdk/js/node_modules/typescript/bin/tsc"), "-p", here("tsconfig.json")], { stdio: "inherit" });
await esbuild.build({
  absWorkingDir: here(".."),
  entryPoints: ["inbox/src/inbox.ts"],
  alias: {
    "@spoolcast/client": "./sdk/js/packages/client/src/index.ts",
    "@spoolcast/react/store": "./sdk/js/packages/react/src/store.ts",
  },
  bundle: true,
  minify: true,
  format: "iife",
  target: "es2022",
  legalComments: "none",
  banner: { js: "// spoolcast inbox: built from inbox/src and the SDK (sdk/js: @spoolcast/client, @spoolcast/react's store) by `make inbox`; edit those, not this." },
  outfile: process.argv[2] ?? here("static/inbox.js"),
  logLevel: "warning",
});
