#!/usr/bin/python3
"""Self-test of test/fuzz/logcheck.py: small server logs with a known
verdict each (a crash, internal errors in pgqueue's code and in
PostgreSQL's, reached with or without pgqueue's objects in the
statement).  Exits non-zero if logcheck judges one of them wrongly.
Run by test/fuzz/run.sh before the fuzzing."""
import contextlib
import io
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import logcheck  # noqa: E402

T = '2026-11-24 16:59:26.342 UTC'


def entry(pid, db, state, level, msg, location=None, statement=None, more=()):
    lines = [f'{T} [{pid}] client backend {db} {state} {level}:  {state}: {msg}']
    lines += list(more)
    if location:
        lines.append(f'{T} [{pid}] client backend {db} {state} LOCATION:  {location}')
    if statement:
        lines += [f'{T} [{pid}] client backend {db} {state} STATEMENT:  ' + statement.split('\n')[0]]
        lines += statement.split('\n')[1:]
    return lines


START = [f'{T} [1] postmaster  00000 LOG:  00000: database system is ready to accept connections']
CASES = [
    # (name, expected exit code, log lines)
    ('ordinary errors only', 0,
     entry(10, 'smith', '42883', 'ERROR', 'function f() does not exist', 'x.c:1', 'select f()')),
    ('reviewed PostgreSQL-internal error (PG_INTERNAL), even with pgqueue in the statement', 0,
     entry(11, 'smith', 'XX000', 'ERROR', 'could not stat file "select 1', 'pg_stat_file, genfile.c:411',
           'select pg_stat_file(query) from pgqueue.queue', more=['   from pg_stat_activity"'])),
    ('reviewed PostgreSQL-internal error of jsonb_to_tsvector\'s flags, with a fz_ wrapper', 0,
     entry(20, 'smith', 'XX000', 'ERROR', 'unexpected end of flag array',
           'parse_jsonb_index_flags, jsonfuncs.c:5257',
           'select\n  pg_catalog.jsonb_to_tsvector(\n    cast(public.fz_stats_3() as jsonb),\n'
           '    cast(public.fz_stats_1() as jsonb))')),
    ('reviewed PostgreSQL-internal error of lo_import() of a random text, with a fz_ view', 0,
     entry(21, 'smith', 'XX000', 'ERROR', 'could not open server file "select  ',
           'lo_import_internal, be-fsstubs.c:422',
           'select\n  ref_0.acked as c2\nfrom\n  public.fz_counters as ref_0\n'
           'where pg_catalog.lo_import(cast(ref_0.queue as text)) is null')),
    ('reviewed PostgreSQL-internal error of a catalog function given a random sub-id, with a fz_ view', 0,
     entry(22, 'smith', 'XX000', 'ERROR', 'invalid non-zero objectSubId for object class 0',
           'getObjectClass, dependency.c:3040',
           'select\n  pg_catalog.pg_describe_object(0, 0, ref_0.batch_order)\nfrom\n  public.fz_held as ref_0')),
    ('the same message raised in pgqueue\'s code (fails)', 1,
     entry(23, 'smith', 'XX000', 'ERROR', 'invalid non-zero objectSubId for object class 0',
           'pgq_claim, claim.c:700', 'select * from pgq_claim(\'w\', 1)')),
    ('unreviewed PostgreSQL-internal error, statement without pgqueue: REVIEW, not a failure', 0,
     entry(12, 'smith', 'XX000', 'ERROR', 'some new elog', 'foo, bar.c:12',
           'select\n  pg_catalog.baz(1)\nfrom pg_class')),
    ('unreviewed PostgreSQL-internal error, statement with a fz_ wrapper', 1,
     entry(13, 'smith', 'XX000', 'ERROR', 'some new elog', 'foo, bar.c:12',
           'select\n  fz_push_3(null, null, null, 1, null)')),
    ('unreviewed PostgreSQL-internal error, CONTEXT in a pgq_ function', 1,
     entry(14, 'smith', 'XX000', 'ERROR', 'some new elog', 'foo, bar.c:12', 'select 1',
           more=[f'{T} [14] client backend smith XX000 CONTEXT:  SQL function "pgq_stats"'])),
    ('internal error raised in pgqueue\'s code', 1,
     entry(15, 'smith', 'XX000', 'ERROR', 'cache lookup failed for relation 1', 'pgq_claim, claim.c:300',
           'select 1')),
    ('internal error without a LOCATION line', 1,
     entry(16, 'smith', 'XX000', 'ERROR', 'some new elog')),
    ('internal error in the API fuzzer\'s database', 1,
     entry(17, 'fuzz', 'XX000', 'ERROR', 'cache lookup failed for type 0', 'foo, bar.c:1', 'select 1')),
    ('data corrupted (XX001) in sqlsmith\'s database', 1,
     entry(18, 'smith', 'XX001', 'ERROR', 'invalid page in block 0', 'ReadBuffer, bufmgr.c:1', 'select 1')),
    ('a crash', 1,
     [f'{T} [1] postmaster  00000 LOG:  00000: server process (PID 19) was terminated by signal 11: Segmentation fault']),
]


def main():
    failed = 0
    with tempfile.TemporaryDirectory() as d:
        for name, want, body in CASES:
            path = os.path.join(d, 'server.log')
            with open(path, 'w') as f:
                f.write('\n'.join(START + body) + '\n')
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                got = logcheck.main(path)
            if got != want:
                failed += 1
                print(f'WRONG: {name}: logcheck exited {got}, expected {want}')
                print(out.getvalue())
            else:
                print(f'right: {name} ({"fails" if want else "passes"})')
    print(f'{len(CASES) - failed} of {len(CASES)} judged right')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
