#!/usr/bin/python3
"""Read the reports of AddressSanitizer/UBSan (log_path files) or of
valgrind (--log-file files) in a directory, split them into reports, and
say whose each is: pgqueue's when any frame of its stack is in pgqueue.so
(or one of pgqueue's source files), PostgreSQL's (or another program's)
otherwise.  Prints a summary and every report with pgqueue frames in full;
exits 1 when there is one, or (--fail-any) when there is any report.

  scan.py asan DIR      # asan.PID / ubsan.PID files of scripts/sanitize.sh
  scan.py valgrind DIR  # vg.PID.log files of scripts/valgrind.sh
"""
import collections
import glob
import os
import re
import sys

OURS = re.compile(r'pgqueue\.so|\bpgq_\w+|/src/(pgqueue|api|admin|archive|claim|jobs|schedule|worker|shmem|publish|bounds|tables|uuid7)\.[ch]:')


def split_asan(text):
    # ASan: "==PID==ERROR: AddressSanitizer: ..." up to "==PID==ABORTING" or
    # the next report; UBSan: "file:line:col: runtime error: ..." then an
    # indented stack when print_stacktrace=1
    reports, cur = [], []
    for ln in text.splitlines():
        if re.search(r'==\d+==ERROR: |runtime error: |==\d+==WARNING: AddressSanitizer', ln):
            if cur:
                reports.append(cur)
            cur = [ln]
        elif cur:
            cur.append(ln)
    if cur:
        reports.append(cur)
    return reports


def split_valgrind(text):
    # a report: "==PID== <headline>" followed by "==PID==    at/by ..." lines
    reports, cur = [], []
    for ln in text.splitlines():
        m = re.match(r'==\d+== (.*)$', ln)
        if not m:
            continue
        body = m.group(1)
        if re.match(r'\s+(at|by) 0x', body) or re.match(r'\s+Address 0x|\s+Uninitialised value|\s+Block was', body):
            if cur:
                cur.append(body)
            continue
        if body.strip() == '':
            if cur:
                reports.append(cur)
                cur = []
            continue
        if re.match(r'(Invalid |Conditional jump|Use of uninitialised|Syscall param|Source and destination overlap|'
                    r'Mismatched free|Argument .* of function|.*uninitialised byte)', body):
            if cur:
                reports.append(cur)
            cur = [body]
    if cur:
        reports.append(cur)
    return reports


def frames(rep):
    return [ln.strip() for ln in rep if re.match(r'\s*(#\d+|at 0x|by 0x)', ln.strip())]


def main():
    kind, d = sys.argv[1], sys.argv[2]
    fail_any = '--fail-any' in sys.argv
    pattern = {'asan': ['asan.*', 'ubsan.*'], 'valgrind': ['vg.*.log']}[kind]
    files = sorted(f for p in pattern for f in glob.glob(os.path.join(d, p)))
    ours, theirs = [], collections.Counter()
    examples = {}
    n = 0
    for f in files:
        text = open(f, errors='replace').read()
        reps = split_asan(text) if kind == 'asan' else split_valgrind(text)
        for r in reps:
            n += 1
            head = re.sub(r'0x[0-9a-f]+|==\d+==|\d+ bytes', '', r[0]).strip()[:120]
            fr = frames(r)
            if any(OURS.search(x) for x in r):
                ours.append((f, r))
            else:
                top = ' < '.join(re.sub(r'^(#\d+|at|by) 0x[0-9a-f]+:?\s*(in )?', '', x)[:60] for x in fr[:4])
                key = head + ' | ' + top
                theirs[key] += 1
                examples.setdefault(key, f)
    print(f'{len(files)} report files, {n} reports: {len(ours)} with pgqueue frames, '
          f'{sum(theirs.values())} entirely outside pgqueue')
    for k, v in theirs.most_common(40):
        print(f'  not ours {v:5d}  {k}   (e.g. {os.path.basename(examples[k])})')
    for f, r in ours[:20]:
        print(f'--- pgqueue report in {f}:')
        print('\n'.join('    ' + x for x in r[:40]))
    if ours or (fail_any and n):
        sys.exit(1)


if __name__ == '__main__':
    main()
