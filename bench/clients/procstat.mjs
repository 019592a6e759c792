// CPU time of this process from /proc/self/stat: utime + stime in clock
// ticks (all its threads), as bench/clients/procstat.py reads it.
import { readFileSync } from 'node:fs';

export function ownTicks() {
  const s = readFileSync('/proc/self/stat', 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' '); // f[0] is field 3 (state)
  return Number(f[11]) + Number(f[12]);
}
