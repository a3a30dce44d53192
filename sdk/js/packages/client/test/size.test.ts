// The core stays small: its minified and gzipped bundle is under 8 KB
// (benchmarks/README.md records the size and how it is measured).
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { build } from "esbuild";

test("the core minified and gzipped is at most 8 KB", async () => {
  const out = await build({
    entryPoints: [fileURLToPath(new URL("../src/index.ts", import.meta.url))],
    bundle: true,
    minify: true,
    format: "esm",
    target: "es2020",
    write: false,
  });
  const code = out.outputFiles[0]!.contents;
  const gz = gzipSync(code, { level: 9 }).length;
  console.log(`@spoolcast/client: ${code.length} bytes minified, ${gz} bytes gzipped`);
  assert.ok(gz <= 8192, `${gz} bytes gzipped`);
});
