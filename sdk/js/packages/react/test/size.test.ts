// The hooks stay a thin layer: their bundle without React and the client,
// minified and gzipped, is small (benchmarks/README.md section 15), and
// names no DOM global, so React Native runs it (the build's type check,
// with the ES library alone, is the stronger proof).
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { build } from "esbuild";

test("the hooks minified and gzipped are at most 4 KB, and use no DOM global", async () => {
  const out = await build({
    entryPoints: [fileURLToPath(new URL("../src/index.ts", import.meta.url))],
    bundle: true,
    minify: true,
    format: "esm",
    target: "es2020",
    external: ["react", "@spoolcast/client"],
    write: false,
  });
  const code = out.outputFiles[0]!.text;
  const gz = gzipSync(code, { level: 9 }).length;
  console.log(`@spoolcast/react: ${code.length} bytes minified, ${gz} bytes gzipped`);
  assert.ok(gz <= 4096, `${gz} bytes gzipped`);
  assert.deepEqual(code.match(/\b(window|document|localStorage|sessionStorage|navigator)\b/g), null);
  assert.deepEqual([...code.matchAll(/from\s*"([^"]+)"/g)].map((m) => m[1]), ["react"], "React alone is imported at run time");
});
