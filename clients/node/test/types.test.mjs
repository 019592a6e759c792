// index.d.ts type-checks against the documented uses (TypeScript, strict).
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

test('index.d.ts: types-check.ts compiles under tsc --strict', () => {
  const tsc = path.join(here, '..', 'node_modules', 'typescript', 'bin', 'tsc');
  execFileSync(process.execPath, [tsc, '--noEmit', '--strict', '--module', 'nodenext',
    '--moduleResolution', 'nodenext', '--target', 'es2022', '--skipLibCheck', 'false',
    path.join(here, 'types-check.ts')], { stdio: 'inherit' });
});
