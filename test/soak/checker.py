#!/usr/bin/python3
"""
The invariant checker of the soak.  Reads the JSONL history that
soak.py wrote (the events of the run and, at its end, the final state of the
database) and checks, from it alone:

 1. history: complete (start .. end), no error inside the harness.
 2. one holder per claim: no two claims of one job returned the same
    version; claims of a job, in time order, have growing versions and tries.
 3. no live lease stolen: a claim takes a job only after the previous
    claim's lease (as extended) ran out, unless that holder nacked the job
    or its lock_key was released (pgq_release) in between.
 4. acked at most once: at most one pgq_ack/pgq_ack_batch accepted (with a
    COMMIT that returned) per job.
 5. no ack from a holder that lost its lease: an accepted ack's holder made
    the job's latest claim (the highest version anyone got).
5b. no ack, nack or extend is accepted from a holder whose lock_key was
    released (pgq_release committed) after its claim of the job committed
    and before the call began.
 6. an ack, nack or extend is refused only to a holder that lost the job:
    a refused call whose holder still made the latest claim and was not
    released, and whose job did not fail, is a defect (a lease that ran out
    but was not taken by another claim still belongs to its holder).
 7. every job pushed (COMMIT returned) is, at the end, either acked exactly
    once (one 'acked' row in pgqueue.archive, nothing left in the queue
    tables, and an accepted ack in the history) or failed (state 'failed',
    tries = the queue's max_tries, last_error set, never acked).
7b. the work commits with its ack: each consumer writes a row into table
    soak_done in the transaction of its ack (and rolls it back when the
    ack is refused, or when an ack_batch did not ack every job): at the
    end, exactly one row for every acked job, by its accepted acker, and
    none for any other job.
 8. pushes whose COMMIT's outcome is unknown: either they never existed
    (not in the tables, the archive or any claim) or as in 7; and as the
    producer found them when it looked them up after reconnecting (all of
    a batch or none; there at the end if found then, never if not).
 9. nothing unknown: every job in the tables, the archive and the claims
    was pushed; a push whose COMMIT failed left nothing.
10. no duplicates: no id in the archive twice; ids of pushes without a
    dedup_key are never returned twice; an id is only ever returned for one
    (queue, dedup_key).
11. dedup: a push with a dedup_key never made a new job while a job with
    that key was live throughout the push (pushed before it began, acked
    after it ended).
12. max_in_flight: the scheduler never moves a job into work_queue of a
    queue at or above its cap.  Checked on the sampler's counts of
    work_queue rows per queue: between two consecutive samples taken at
    t1 and t2 with counts n1 and n2, n2 <= max(n1, C), where C is the
    largest cap that may have been in effect during [t1 - 1 s, t2] (a cap
    whose pgq_configure committed in that window, or the one in effect
    before; 0 = no cap; the second before t1 covers a pass that read the
    cap just before it changed).  So lowering a cap below the rows in
    flight is legitimate and their number may only fall until under it.
12c. groups (1.2): no sample showed more jobs of one group of a grouped
    queue in flight (scheduled, running or in retry) than its
    group_max_in_flight (the soak never changes it).  Each sample counts
    in one snapshot, so a count over the limit is a committed state.
13. not stuck (work_queue): no sample showed a work_queue row claimable (never claimed,
    released, or its lease run out) since time s while a claim that could
    take it (its queues filter included the job's queue) started at
    s + 1 s or later and came back empty before the sample (no server crash
    around it, which could have rolled back a claim holding the row).
13b. not stuck (queue): no sample showed a job of a queue without a cap
    that had waited, since it was due, for over 5 s outside the times its
    queue was paused (from the pause to 1 s after the resume) and the
    scheduler was down (from a fault that stops it, terminated, killed or
    server restarted, to 3 s after it).  A child of a flow is due from the
    ack of its last parent (its run_after is its push's).
14. drained: at the end, nothing in work_queue and only failed jobs in
    pgqueue.queue.
15. bounded: pgqueue.queue + work_queue (with indexes and TOAST) under
    8 MB + 8 kB per live row (the most seen so far: a table keeps
    the pages of rows gone), the archive under 4 MB + 2 kB per row.
16. server log: no PANIC, no assertion, no process ended by a signal other
    than the SIGKILLs injected (at most one "terminated by signal 9" per
    SIGKILL fault), no ERROR or WARNING, no FATAL but those the faults
    cause (connections refused while the server restarts, the scheduler
    terminated).
17. coverage: every kind of fault was injected, jobs were acked, failed,
    stolen and stale acks refused.

12d. flows (1.2): no child of a flow (the flow producer's: a parent,
    children after it, a fan-in after them) claimed before an ack of each
    of its parents was sent; at the end a child of a never-acked parent
    still waiting (7 and 14 accept it), one of acked parents not.

The ring mode (ring.py; the start event says mode "ring") adds:
R1. the ring turned: in both rings, turns (a slot made current: new
    values of pgqueue.slots.since), slots made, truncated (a slot's
    relfilenode changed), dropped, and rows moved (the scheduler's DEBUG1
    lines in the server log), each more than 0: a soak whose ring never
    turns proves nothing.
R3. snapshots on the primary: a REPEATABLE READ reader reads every job
    of pgqueue.jobs twice, seconds apart, after taking its snapshot: none
    vanished, appeared or changed (the clock-made 'running' read as
    'scheduled'), and ring_paused has as many jobs as soak_paused_pushed
    rows (one per push, in the push's transaction).
R4. acks, nacks and extends inside multi-statement transactions and
    under REPEATABLE READ are refused only to a holder that lost the job
    (as 6); a 40001 is a clean answer under REPEATABLE READ (made again),
    never under READ COMMITTED; filtered blocking claims ran,
    transactions committed and rolled back, REPEATABLE READ calls were
    answered.  (Jobs such calls lose fail 7 and 14, as any lost job.)
R5. pg_dump: every run succeeded (one whose connection was lost to an
    injected crash is counted apart).
R6. the restore of a dump into a database with a running scheduler: no
    error from pg_restore.
R7. after the restore and at the end: every job and archive row of the
    dump is in the restored database, every queue setting as dumped, and
    no pending job of a queue paused in the dump scheduled.
R8. standby: a REPEATABLE READ reader that took its snapshot counts
    ring_paused's jobs twice, seconds apart: both counts equal, and equal
    to the soak_paused_pushed rows it sees; queries cancelled by a
    replay conflict (or stalled 90 s behind one) are counted apart; no
    crash in the standby's log.

    /usr/bin/python3 checker.py history.jsonl [--verbose] [--partial]

--partial checks a run still going (or cut short): only what needs no final
state (2, 3, 4, 5, 5b, 10, 12, 13, 13b, 15, R3, R5).

Prints one "ok N - ..." or "not ok N - ..." line per check, the figures,
and "soak: N passed, N failed"; exits non-zero when a check failed.
"""
import collections
import json
import re
import sys

EXAMPLES = 8


# --- the ring mode's checks (ring.py) --------------------------------------------
R_RATE = 'rate limits: never more releases in a window of rate_period than rate_limit'
R_FLOW = ('flows: no child released before all its parents were acked; a child of an unacked '
          'parent left waiting, of acked ones not')
R1 = 'the ring turned: turns, slots made, truncated, dropped, rows moved, in both rings'
R3 = 'snapshots on the primary: no job vanished, appeared or changed; a paused queue\'s jobs as its pushes'
R4 = ('waiting claims, calls in multi-statement and REPEATABLE READ transactions: refused only to '
      'holders that lost the job, 40001 only under REPEATABLE READ')
R5 = 'pg_dump: every run succeeded'
R6 = 'restore: pg_restore into a database with a running scheduler, without an error'
R7 = ('restore: every job, archive row and queue setting of the dump in the restored database, '
      'a paused queue\'s jobs not scheduled (at once and at the end)')
R8 = ('standby: a REPEATABLE READ snapshot counts a paused queue\'s jobs as its pushes, twice '
      'the same; no crash in its log')
# a connection lost to a crash restart or an immediate stop: not pg_dump's answer
LOST = re.compile(r'server closed the connection|terminating connection because of crash|'
                  r'the database system is (in recovery mode|starting up|shutting down|'
                  r'not yet accepting)|could not connect|connection to server .* failed|'
                  r'no connection to the server|consuming input failed|'
                  r'could not receive data from server|lost synchronization|'
                  r'connection to database .* failed')


def period_seconds(text):
    """Seconds of a rate_period as the soak writes it ('1 second',
    '500 milliseconds')."""
    m = re.fullmatch(r'\s*([0-9.]+)\s*(ms|milliseconds?|s|secs?|seconds?|min|minutes?)\s*', text)
    if not m:
        raise ValueError('rate_period %r' % text)
    unit = m.group(2)
    scale = 0.001 if unit.startswith('m') and unit not in ('min', 'minute', 'minutes') else \
        60.0 if unit in ('min', 'minute', 'minutes') else 1.0
    return float(m.group(1)) * scale


def ring_checks(by, check, crashes, claims, p_refused):
    """R1-R8 (the ring mode): checks the history's ring-mode events; returns
    the figures."""
    fig = {}

    # --- R1. the ring turned ------------------------------------------------------
    p = []
    rings = sorted(by['ring'], key=lambda e: e['t'])
    turns, made, truncated, dropped, most = {}, {}, {}, {}, {}
    for tbl in ('queue', 'work_queue'):
        first = {(s[1], s[3]) for s in rings[0]['slots'] if s[0] == tbl} if rings else set()
        seen = set()
        oids_first = {x[2] for x in rings[0]['parts'] if x[0] == tbl} if rings else set()
        oids = set()
        node = {}
        trunc = 0
        for e in rings:
            seen |= {(s[1], s[3]) for s in e['slots'] if s[0] == tbl}
            parts = [x for x in e['parts'] if x[0] == tbl]
            most[tbl] = max(most.get(tbl, 0), len(parts))
            for _, name, oid, fnode in parts:
                oids.add(oid)
                if oid in node and node[oid] != fnode:
                    trunc += 1
                node[oid] = fnode
        last = {x[2] for x in rings[-1]['parts'] if x[0] == tbl} if rings else set()
        turns[tbl] = len(seen - first)
        made[tbl] = len(oids - oids_first)
        truncated[tbl] = trunc
        dropped[tbl] = len(oids - last)
    log = by['ring_log'][0] if by['ring_log'] else {}
    moved = log.get('moved', {})
    for tbl in ('queue', 'work_queue'):
        for what, d in (('turns', turns), ('slots made', made), ('truncates', truncated),
                        ('slots dropped', dropped), ('rows moved', moved)):
            if not d.get(tbl):
                p.append('pgqueue.%s: no %s' % (tbl, what))
    if not by['ring_log']:
        p.append('no count of the server log\'s moves and drops')
    fig.update(turns=turns, slots_made=made, truncates=truncated, drops=dropped,
               rows_moved=moved, move_statements=log.get('moves', {}),
               drops_logged=log.get('dropped', {}), most_slots=most,
               upkeep_tried_again=log.get('upkeep', {}), ring_samples=len(rings),
               other_schedulers_moves_drops=log.get('other', {}))
    check(R1, p, 'turns %s, made %s, truncated %s, dropped %s, rows moved %s' % (
        turns, made, truncated, dropped, moved))

    # --- R3. snapshots on the primary ------------------------------------------
    p = []
    snaps = [e for e in by['snap'] if e['where'] == 'primary']
    ok = [e for e in snaps if e['status'] == 'ok']
    for e in ok:
        at = 'snapshot of %.3f..%.3f' % (e['t0'], e['t1'])
        if len(set(e['ref'])) > 1:
            p.append('%s: soak_paused_pushed counted %s' % (at, e['ref']))
        for i, c in enumerate(e['paused']):
            if i + 1 < len(e['ref']) and c != e['ref'][i + 1]:
                p.append('%s: read %d: %d jobs of ring_paused, %d pushes' % (at, i + 1, c, e['ref'][i + 1]))
        for k in ('vanished', 'appeared'):
            if e.get(k):
                p.append('%s: %d jobs %s between the reads: %s' % (at, len(e[k]), k, e[k][:4]))
        for i, a, b in e.get('changed', [])[:4]:
            p.append('%s: job %s changed: %s -> %s' % (at, i, a, b))
    if not ok:
        p.append('no snapshot read twice on the primary')
    fig['primary_snapshots'] = dict(ok=len(ok), errors=len(snaps) - len(ok),
                                    rows_compared=sum(e.get('rows', 0) for e in ok))
    check(R3, p, '%d snapshots read twice (%d jobs compared), %d ended by an error' % (
        len(ok), sum(e.get('rows', 0) for e in ok), len(snaps) - len(ok)))

    # --- R4. waiting claims, multi-statement and REPEATABLE READ calls -----------
    p = list(p_refused)
    calls = by['ack'] + by['nack'] + by['extend']
    for e in calls + by['call_error']:
        if e.get('sqlstate') == '40001' and e.get('ctx') != 'rr':
            p.append('%s by %s (%s): 40001 under READ COMMITTED: %s' % (
                e.get('call', e['ev']), e['holder'], e.get('ctx'), e.get('error', '')))
    for e in by['tx']:
        if e.get('sqlstate') == '40001':
            p.append('a multi-statement transaction of %s (READ COMMITTED) ended by 40001 at %.3f' % (
                e['holder'], e['t1']))
    rr = [e for e in calls if e.get('ctx') == 'rr']
    rr_ok = [e for e in rr if e['status'] == 'ok']
    rr_40001 = sum(e.get('attempts', 0) for e in rr)
    rr_gave_up = [e for e in rr if e['status'] == 'error' and e.get('sqlstate') == '40001']
    for e in rr_gave_up:
        p.append('%s of %s by %s: 40001 %d times in a row' % (e['ev'], e['id'], e['holder'],
                                                            e.get('attempts', 0) + 1))
    waits = [e for e in by['claim'] + by['idle'] if e.get('ctx') == 'wait']
    waited = sum(1 for e in by['idle'] if e.get('ctx') == 'wait')
    outcomes = collections.Counter(e['outcome'] for e in by['tx'])
    tx_calls = [e for e in calls if e.get('ctx') == 'tx']
    if not waits:
        p.append('no filtered blocking claim')
    if not outcomes.get('ok'):
        p.append('no multi-statement transaction committed')
    if not outcomes.get('rollback'):
        p.append('no multi-statement transaction rolled back')
    if not rr_ok:
        p.append('no call under REPEATABLE READ answered')
    fig['waiting_claims'] = dict(claims=sum(1 for e in by['claim'] if e.get('ctx') == 'wait'),
                                 empty=waited)
    fig['transactions'] = dict(outcomes, calls=len(tx_calls),
                               claims=sum(1 for e in by['claim'] if e.get('ctx') == 'tx'))
    fig['repeatable_read'] = dict(calls=len(rr), answered=len(rr_ok), serialization_failures=rr_40001,
                                  refused=sum(1 for e in rr_ok if e['result'] in (None, False)),
                                  most_attempts=max([e.get('attempts', 0) for e in rr] or [0]) + 1)
    check(R4, p, 'waiting claims %s; transactions %s; REPEATABLE READ %s' % (
        fig['waiting_claims'], fig['transactions'], fig['repeatable_read']))

    # --- R5. pg_dump ---------------------------------------------------------------
    p = []
    dumps = by['dump']
    cut = 0
    for e in dumps:
        if e['rc'] == 0:
            continue
        text = ' '.join(e['err'])
        if LOST.search(text) and any(c0 - 1 < e['t1'] and c1 + 10 > e['t0'] for c0, c1 in crashes):
            cut += 1
            continue
        p.append('pg_dump %d at %.3f..%.3f: exit %s: %s' % (e['n'], e['t0'], e['t1'], e['rc'],
                                                           ' | '.join(e['err'][:3])))
    if not dumps:
        p.append('no pg_dump ran')
    fig['pg_dump'] = dict(runs=len(dumps), failed=len(p) if dumps else 0, cut_by_a_crash=cut)
    check(R5, p, '%d runs, %d failed, %d cut by an injected crash' % (
        len(dumps), len(p) if dumps else 0, cut))

    # --- R6, R7. the restore --------------------------------------------------------
    p6, p7 = [], []
    rs = by['restore'][0] if by['restore'] else None
    if rs is None:
        p6.append('no restore')
    elif rs.get('dump') is None:
        p6.append('no restore: %s' % rs.get('errors'))
    else:
        if rs['rc'] != 0 or rs.get('n_errors'):
            p6.append('pg_restore of dump %d exited with %s, %d errors' % (
                rs['dump'], rs['rc'], rs.get('n_errors', 0)))
            p6.extend([l for l in rs['errors'] if 'error' in l][:EXAMPLES])
        if rs.get('parse_rc'):
            p7.append('the dump could not be read back (pg_restore -a: %s)' % rs['parse_rc'])
        djobs = {j[0]: j for j in rs['dump_jobs']}
        darch = set(rs['dump_archive'])
        dq = rs['dump_queues']
        paused_q = {q for q, v in dq.items() if v[3]}
        checks = {e['when']: e for e in by['restore_check']}
        for when in ('after', 'final'):
            e = checks.get(when)
            if e is None:
                p7.append('no look at the restored database (%s)' % when)
                continue
            if e.get('error'):
                p7.append('%s: %s' % (when, e['error']))
                continue
            rjobs = {j[0]: j for j in e['jobs']}
            rwork = set(e['work'])
            rarch = set(e['archive'])
            missing = [i for i in djobs if i not in rjobs]
            if missing:
                p7.append('%s the restore: %d of the dump\'s %d jobs missing: %s' % (
                    when, len(missing), len(djobs), missing[:4]))
            amiss = [i for i in darch if i not in rarch]
            if amiss:
                p7.append('%s the restore: %d of the dump\'s %d archive rows missing: %s' % (
                    when, len(amiss), len(darch), amiss[:4]))
            for q, v in dq.items():
                got = e['queues'].get(q)
                if got != v:
                    p7.append('%s the restore: queue %s: %s, dumped %s (weight, max_in_flight, '
                              'max_tries, paused)' % (when, q, got, v))
            sched = [i for i, j in djobs.items() if j[1] in paused_q and j[2] in ('pending', 'retry')
                     and (i in rwork or rjobs.get(i, [None, None, None])[2] == 'scheduled')]
            if sched:
                p7.append('%s the restore: %d pending jobs of paused queues scheduled: %s' % (
                    when, len(sched), sched[:4]))
        fig['restore'] = dict(dump=rs['dump'], rc=rs['rc'], errors=rs.get('n_errors'),
                              jobs=len(djobs), archive_rows=len(darch), queues=len(dq),
                              seconds=round(rs['t1'] - rs['t0'], 1))
    check(R6, p6, 'dump %s, %s jobs' % (rs and rs.get('dump'), rs and len(rs.get('dump_jobs', []))))
    check(R7, p7)

    # --- R8. the standby ------------------------------------------------------------
    p = []
    snaps = [e for e in by['snap'] if e['where'] == 'standby']
    if by['start'] and not by['start'][0].get('standby', True):
        snaps = None
    if snaps is not None:
        ok = [e for e in snaps if e['status'] == 'ok' and len(e['paused']) == 2]
        cancelled = [e for e in snaps if e['status'] == 'cancelled']
        # a query that waited 90 s (the replay of a TRUNCATE or DROP of a
        # slot waits for the readers of the slot): counted apart, as the
        # cancellations
        stalled = [e for e in snaps if e['status'] == 'stalled']
        errors = [e for e in snaps if e['status'] == 'error']
        for e in ok:
            at = 'standby snapshot of %.3f..%.3f' % (e['t0'], e['t1'])
            if len(set(e['ref'])) > 1:
                p.append('%s: soak_paused_pushed counted %s' % (at, e['ref']))
            if e['paused'][0] != e['ref'][1]:
                p.append('%s: %d jobs of ring_paused, %d pushes' % (at, e['paused'][0], e['ref'][1]))
            if e['paused'][1] != e['paused'][0]:
                p.append('%s: %d jobs of ring_paused, then %d' % (at, e['paused'][0], e['paused'][1]))
        if not ok:
            p.append('no snapshot counted twice on the standby')
        log = by['standby_log'][0] if by['standby_log'] else None
        if log:
            for k, n in log['counts'].items():
                if k.startswith('signal') or k in ('PANIC', 'TRAP:', 'was'):
                    p.append('standby log: %d lines "%s"' % (n, k))
        lags = [e['lag'] for e in snaps if e.get('lag') is not None]
        fig['standby'] = dict(checks=len(ok), cancelled=len(cancelled), stalled=len(stalled),
                              errors=len(errors),
                              log=log['counts'] if log else None,
                              max_replay_lag=round(max(lags), 1) if lags else None)
        check(R8, p, '%d snapshots counted twice, %d cancelled by a replay conflict, %d stalled '
              'over 90 s, %d other errors' % (len(ok), len(cancelled), len(stalled), len(errors)))
    return fig


def print_ring_figures(f):
    print('ring figures:')
    for tbl in ('queue', 'work_queue'):
        print('    pgqueue.%s: %d turns, %d slots made (at most %d at once), %d truncates, '
              '%d slots dropped, %d rows moved (%d moves)' % (
                  tbl, f['turns'].get(tbl, 0), f['slots_made'].get(tbl, 0), f['most_slots'].get(tbl, 0),
                  f['truncates'].get(tbl, 0), f['drops'].get(tbl, 0), f['rows_moved'].get(tbl, 0),
                  f['move_statements'].get(tbl, 0)))
    for k in ('waiting_claims', 'transactions', 'repeatable_read', 'primary_snapshots', 'pg_dump',
              'restore', 'standby'):
        if k in f:
            print('    %s: %s' % (k.replace('_', ' '), json.dumps(f[k], sort_keys=True)))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('-')]
    verbose = '--verbose' in sys.argv
    if len(args) != 1:
        print(__doc__)
        sys.exit(2)
    path = args[0]

    results = []
    partial = '--partial' in sys.argv
    # what needs the final state (or the end of the run): skipped by --partial
    final_only = ('acks, nacks, extends refused only to holders that lost the job',
                  'every pushed job acked exactly once or failed after max_tries',
                  'pushes with a lost COMMIT: absent, or acked once or failed',
                  'no job that was not pushed', 'dedup: no second live job for a key',
                  'drained: work_queue empty, only failed jobs left',
                  'server log: no crash but the ones injected',
                  'coverage: every fault kind, acks, failures, steals, stale acks',
                  R1, R4, R6, R7, R8)

    def check(name, problems, info=''):
        problems = list(problems)
        if partial and name in final_only:
            return
        results.append((name, problems, info))

    events = []
    malformed = 0
    with open(path) as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except ValueError:
                malformed += 1

    by = collections.defaultdict(list)
    for e in events:
        by[e['ev']].append(e)

    start = by['start'][0] if by['start'] else {}
    end = by['end'][0] if by['end'] else None
    t_run = next((e['t'] for e in by['phase'] if e['name'] == 'run'), None)
    t_drain = next((e['t'] for e in by['phase'] if e['name'] == 'drain'), None)

    # --- 1. history ----------------------------------------------------------
    p = []
    if not start:
        p.append('no start event')
    if end is None and not partial:
        p.append('no end event: the run did not finish')
    elif end is not None and end.get('harness_errors'):
        p.append('harness errors: %s' % end['harness_errors'])
    for e in by['harness_error']:
        p.append('harness error in %s: %s' % (e['thread'], e['error']))
    if malformed and not (partial and malformed == 1):   # a line being written
        p.append('%d malformed lines' % malformed)
    check('history complete', p, '%d events' % len(events))

    # --- the pieces ----------------------------------------------------------
    queues_start = start.get('queues', {})
    pushed = {}           # id -> dict(status, q, dedup, t0, t1)
    push_ids_error = set()
    id_keys = collections.defaultdict(set)
    nodedup_count = collections.Counter()
    for e in by['push']:
        for i in e['ids']:
            if e['status'] == 'error':
                push_ids_error.add(i)
                continue
            id_keys[i].add((e['q'], e['dedup']))
            if e['dedup'] is None:
                nodedup_count[i] += 1
            cur = pushed.get(i)
            if cur is None:
                pushed[i] = dict(status=e['status'], q=e['q'], dedup=e['dedup'],
                                 t0=e['t0'], t1=e['t1'])
            elif e['status'] == 'ok':
                if cur['status'] != 'ok':
                    cur.update(status='ok', t0=e['t0'], t1=e['t1'])
    parents_of = {}       # child id -> [parent ids] (flows, 1.2)
    for e in by['push']:
        if e['status'] != 'error':
            parents_of.update(e.get('parents', {}))
    claims = collections.defaultdict(list)
    for e in by['claim']:
        claims[e['id']].append(e)
    for l in claims.values():
        l.sort(key=lambda e: e['version'])
    acks_ok = collections.defaultdict(list)      # accepted, COMMIT returned
    acks_maybe = collections.defaultdict(list)   # accepted, COMMIT unknown
    acks_refused = []
    for e in by['ack']:
        if e['result'] is True and e['status'] == 'ok':
            acks_ok[e['id']].append(e)
        elif e['result'] is True and e['status'] == 'uncertain':
            acks_maybe[e['id']].append(e)
        elif e['result'] is False and e['status'] == 'ok':
            acks_refused.append(e)
    batch_partial = 0
    for e in by['ack_batch']:
        n = len(e['ids'])
        for i in e['ids']:
            one = dict(id=i, holder=e['holder'], t0=e['t0'], t1=e['t1'], batch=True)
            if e['status'] == 'ok' and e['count'] == n:
                acks_ok[i].append(one)
            elif e['status'] == 'ok' and e['count'] == 0:
                pass
            elif e['status'] in ('ok', 'uncertain') and e['count']:
                acks_maybe[i].append(one)
        if e['status'] == 'ok' and 0 < (e['count'] or 0) < n:
            batch_partial += 1
    nacks = collections.defaultdict(list)
    for e in by['nack']:
        if e['status'] in ('ok', 'uncertain') and e['result'] is not None:
            nacks[e['id']].append(e)
    extends = collections.defaultdict(list)
    for e in by['extend']:
        if e['status'] in ('ok', 'uncertain') and e['result'] is not None:
            extends[(e['id'], e['holder'])].append(e)
    releases = collections.defaultdict(list)    # key -> [fault]
    for e in by['fault'] + by['fault_error']:
        if e['kind'] == 'release' and e.get('key'):
            releases[e['key']].append(e)
    crashes = [(e['t0'], e['t1']) for e in by['fault'] + by['fault_error']
               if e['kind'] in ('sigkill', 'restart')]
    uncertain_claims = by['claim_uncertain']

    final_job = {e['id']: e for e in by['final_job']}
    final_work = {e['id']: e for e in by['final_work']}
    archive = collections.defaultdict(list)
    for e in by['final_archive']:
        archive[e['id']].append(e)
    final_queue = {e['q']: e for e in by['final_queue']}

    def max_tries(q):
        if q in final_queue:
            return final_queue[q]['max_tries']
        return queues_start.get(q, {}).get('max_tries', 5)

    def released_between(key, a, b):
        return any(r['t1'] > a and r['t0'] < b for r in releases.get(key, []))

    def nacked_between(jid, holder, a, b):
        return any(n['holder'] == holder and n['t1'] > a and n['t0'] < b
                   for n in nacks.get(jid, []))

    # --- 2. one holder per claim ----------------------------------------------
    p = []
    for jid, l in claims.items():
        seen = collections.Counter(c['version'] for c in l)
        for v, k in seen.items():
            if k > 1:
                p.append('%s: version %d claimed %d times (%s)' % (
                    jid, v, k, ', '.join(c['holder'] for c in l if c['version'] == v)))
        byt = sorted(l, key=lambda c: c['t0'])
        for a, b in zip(byt, byt[1:]):
            if a['t1'] < b['t0'] and not (a['version'] < b['version'] and a['tries'] < b['tries']):
                p.append('%s: claim by %s (v%d, try %d) after %s (v%d, try %d)' % (
                    jid, b['holder'], b['version'], b['tries'], a['holder'], a['version'], a['tries']))
    check('one holder per claim (versions and tries grow)', p,
          '%d claims of %d jobs' % (sum(len(l) for l in claims.values()), len(claims)))

    # --- 3. no live lease stolen ----------------------------------------------
    p = []
    steals = 0
    for jid, l in claims.items():
        for a, b in zip(l, l[1:]):
            b_at = b['lock_timeout'] - b['lease']          # server time of b's claim
            end_a = a['lock_timeout']
            for x in extends.get((jid, a['holder']), []):
                if x['t0'] > a['t0'] and x['t1'] < b['t1']:
                    end_a = max(end_a, x['result'])
            if b_at >= end_a - 0.05:
                if a['holder'] != b['holder']:
                    steals += 1
                continue
            if nacked_between(jid, a['holder'], a['t0'], b['t1']):
                continue
            if released_between(a['holder'], a['t0'], b['t1']):
                continue
            p.append('%s: claimed by %s at %.3f while %s held it until %.3f' % (
                jid, b['holder'], b_at, a['holder'], end_a))
    check('no live lease stolen', p, '%d leases taken over after they ran out' % steals)

    # --- 4. acked at most once -----------------------------------------------
    p = []
    for jid, l in acks_ok.items():
        if len(l) > 1:
            p.append('%s: %d accepted acks (%s)' % (jid, len(l), ', '.join(a['holder'] for a in l)))
    check('at most one accepted ack per job', p,
          '%d accepted acks, %d with a COMMIT lost' % (
              sum(len(l) for l in acks_ok.values()), sum(len(l) for l in acks_maybe.values())))

    # --- 5. no ack from a holder that lost its lease --------------------------
    p = []
    for jid, l in acks_ok.items():
        cl = claims.get(jid, [])
        if not cl:
            p.append('%s: acked by %s with no claim recorded' % (jid, l[0]['holder']))
            continue
        latest = cl[-1]
        for a in l:
            if a['holder'] != latest['holder']:
                p.append('%s: ack by %s accepted, but %s made the latest claim (v%d)' % (
                    jid, a['holder'], latest['holder'], latest['version']))
    # an ack whose COMMIT was lost: if the job ended acked and no other ack
    # was accepted, one of those must come from the latest claimant
    for jid, l in acks_maybe.items():
        cl = claims.get(jid, [])
        if jid in archive and not acks_ok.get(jid) and cl and \
                not any(a['holder'] == cl[-1]['holder'] for a in l):
            p.append('%s: acked (COMMIT lost) by %s, but %s made the latest claim (v%d)' % (
                jid, ', '.join(a['holder'] for a in l), cl[-1]['holder'], cl[-1]['version']))
    check('accepted acks come from the latest claimant', p,
          '%d stale acks refused' % len(acks_refused))

    # --- 5b. nothing accepted from a holder released meanwhile ----------------
    p = []
    refused_all = acks_refused + \
        [e for e in by['nack'] if e['status'] == 'ok' and e['result'] is None] + \
        [e for e in by['extend'] if e['status'] == 'ok' and e['result'] is None]
    accepted = [dict(a, call='ack') for l in acks_ok.values() for a in l] + \
        [dict(e, call='nack') for e in by['nack'] if e['status'] == 'ok' and e['result'] is not None] + \
        [dict(e, call='extend') for e in by['extend'] if e['status'] == 'ok' and e['result'] is not None]
    n_after_release = 0
    for a in accepted:
        cl = [c for c in claims.get(a['id'], []) if c['t1'] < a['t0']]
        if not cl or cl[-1]['holder'] != a['holder']:
            continue        # check 5 (acks); nacks and extends need no more
        c = cl[-1]
        # a claim inside a longer transaction (ring mode) holds the job for
        # others from its COMMIT on
        c_at = c.get('commit', c['t1'])
        for r in releases.get(a['holder'], []):
            if r['ev'] == 'fault' and r['t0'] > c_at and r['t1'] < a['t0']:
                p.append('%s: %s by %s accepted after pgq_release(%s) at %.3f..%.3f '
                         '(claimed v%d at %.3f)' % (a['id'], a['call'], a['holder'], a['holder'],
                                                    r['t0'], r['t1'], c['version'], c['t1']))
                break
    for a in refused_all:
        cl = [c for c in claims.get(a['id'], []) if c['t1'] < a['t0']]
        if cl and cl[-1]['holder'] == a['holder'] and any(
                r['ev'] == 'fault' and r['t0'] > cl[-1].get('commit', cl[-1]['t1']) and r['t1'] < a['t0']
                for r in releases.get(a['holder'], [])):
            n_after_release += 1
    check('no ack, nack or extend accepted from a holder released meanwhile', p,
          '%d refused after a release' % n_after_release)

    # --- 6. refused only to a holder that lost the job ------------------------
    # (in the ring mode, the calls inside multi-statement and REPEATABLE
    # READ transactions are check R4's)
    p = []
    p_ring = []
    refused = acks_refused + \
        [dict(e, call='nack') for e in by['nack'] if e['status'] == 'ok' and e['result'] is None] + \
        [dict(e, call='extend') for e in by['extend'] if e['status'] == 'ok' and e['result'] is None]
    for a in refused:
        jid = a['id']
        cl = [c for c in claims.get(jid, []) if c['t1'] <= a['t0']]
        if not cl or cl[-1]['holder'] != a['holder']:
            continue
        c = cl[-1]
        # another holder's claim that began before this call ended may have
        # taken the job first (a steal racing the call): a refusal is right
        if any(x['version'] > c['version'] and x['holder'] != a['holder'] and x['t0'] < a['t1']
               for x in claims[jid]):
            continue
        if released_between(a['holder'], c['t0'], a['t1']):
            continue
        if final_job.get(jid, {}).get('state') == 'failed':
            continue        # a claim failed it: its lease ran out on its last try
        if any(u['holder'] != a['holder'] and u['t1'] > c['t0'] and u['t0'] < a['t1']
               for u in uncertain_claims):
            continue        # a claim we cannot see may have taken it
        if archive.get(jid) and any(x['holder'] == a['holder'] for x in acks_maybe.get(jid, [])):
            continue
        line = '%s: %s by %s refused though it made the latest claim (v%d) and was not released' % (
            jid, a.get('call', 'ack'), a['holder'], c['version'])
        if a.get('ctx') in ('tx', 'rr'):
            p_ring.append('%s (%s)' % (line, {'tx': 'in a multi-statement transaction',
                                              'rr': 'REPEATABLE READ'}[a['ctx']]))
        else:
            p.append(line)
    ring = start.get('mode') == 'ring'
    check('acks, nacks, extends refused only to holders that lost the job',
          p + ([] if ring else p_ring), '%d refused' % len(refused))

    # children that may rightly be left waiting: some parent (or its
    # ancestor) was never acked
    def was_acked(jid):
        return bool(acks_ok.get(jid) or acks_maybe.get(jid)) or \
            any(x['outcome'] == 'acked' for x in archive.get(jid, []))
    held = set()

    def is_held(jid, depth=0):
        if jid in held:
            return True
        if depth > 50:
            return False
        if any(not was_acked(p) or is_held(p, depth + 1) for p in parents_of.get(jid, [])):
            held.add(jid)
            return True
        return False

    # --- 7/8. every pushed job acked once or failed ---------------------------
    p7, p8 = [], []
    n_acked = n_failed = n_unc_yes = n_unc_no = 0
    for jid, ps in pushed.items():
        fj = final_job.get(jid)
        arc = archive.get(jid, [])
        exists = fj is not None or arc or jid in claims or jid in final_work
        if ps['status'] != 'ok':
            if not exists:
                n_unc_no += 1
                continue
            n_unc_yes += 1
            out = p8
        else:
            out = p7
        if arc and fj is None:
            if len(arc) != 1 or arc[0]['outcome'] != 'acked':
                out.append('%s: archive rows %s' % (jid, [x['outcome'] for x in arc]))
            elif not acks_ok.get(jid) and not acks_maybe.get(jid):
                out.append('%s: acked in the archive, but no accepted ack in the history' % jid)
            else:
                n_acked += 1
        elif fj is not None and not arc:
            if fj['state'] == 'waiting' and is_held(jid):
                continue        # check R_FLOW's
            if fj['state'] != 'failed':
                out.append('%s: left in state %s' % (jid, fj['state']))
            elif fj['tries'] != max_tries(fj['q']) or not fj['last_error']:
                out.append('%s: failed with tries %s (max_tries %s), last_error %r' % (
                    jid, fj['tries'], max_tries(fj['q']), fj['last_error']))
            elif acks_ok.get(jid):
                out.append('%s: failed, but an ack by %s was accepted' % (jid, acks_ok[jid][0]['holder']))
            else:
                n_failed += 1
        elif fj is not None and arc:
            out.append('%s: both in pgqueue.queue (%s) and the archive' % (jid, fj['state']))
        else:
            out.append('%s: lost (pushed by producer %s into %s, %d claims)' % (
                jid, ps.get('by'), ps['q'], len(claims.get(jid, []))))
        if acks_ok.get(jid) and not arc:
            out.append('%s: ack accepted by %s but no archive row' % (jid, acks_ok[jid][0]['holder']))
    # uncertain pushes that the producer looked up after reconnecting
    for e in by['push_resolved']:
        ids = e['ids']
        if 0 < e['found'] < len(ids):
            p8.append('%s: %d of the %d jobs of one push found: half a COMMIT' % (
                ids[0], e['found'], len(ids)))
            continue
        for jid in ids:
            if pushed.get(jid, {}).get('status') == 'ok':
                continue        # a dedup push that returned a committed job
            there = final_job.get(jid) or archive.get(jid) or jid in claims
            if e['found'] and not there:
                p8.append('%s: found after its COMMIT was lost, gone at the end' % jid)
            elif not e['found'] and there:
                p8.append('%s: not found after its COMMIT was lost, but there later' % jid)
    n_certain = sum(1 for x in pushed.values() if x['status'] == 'ok')
    check('every pushed job acked exactly once or failed after max_tries', p7,
          '%d jobs: %d acked, %d failed' % (n_certain + n_unc_yes, n_acked, n_failed))
    check('pushes with a lost COMMIT: absent, or acked once or failed', p8,
          '%d committed, %d not' % (n_unc_yes, n_unc_no))

    # --- 7b. the work committed with its ack -----------------------------------
    p = []
    done = collections.defaultdict(list)
    for e in by['final_done']:
        done[e['id']].append(e['holder'])
    for jid in set(done) | set(archive):
        d = done.get(jid, [])
        acked = any(x['outcome'] == 'acked' for x in archive.get(jid, []))
        if acked and len(d) != 1:
            p.append('%s: acked, with %d rows of work (%s)' % (jid, len(d), d))
        elif not acked and d:
            p.append('%s: not acked, but work done by %s committed' % (jid, d))
        elif acked:
            ok = [a['holder'] for a in acks_ok.get(jid, [])]
            if ok and ok[0] != d[0]:
                p.append('%s: acked by %s, work committed by %s' % (jid, ok[0], d[0]))
    check('the work commits with its ack: one row per acked job, none else', p,
          '%d rows of work' % sum(len(x) for x in done.values()))

    # --- 9. nothing unknown ---------------------------------------------------
    p = []
    for jid in set(final_job) | set(archive) | set(claims) | set(final_work):
        if jid not in pushed:
            p.append('%s: in the %s but never pushed%s' % (
                jid, 'tables' if jid in final_job else 'archive' if jid in archive else 'claims',
                ' (its push failed at COMMIT)' if jid in push_ids_error else ''))
    for jid in final_work:
        if jid not in final_job:
            p.append('%s: in work_queue without its job row' % jid)
    check('no job that was not pushed', p)

    # --- 10. no duplicates ----------------------------------------------------
    p = []
    for jid, l in archive.items():
        if len(l) > 1:
            p.append('%s: %d archive rows' % (jid, len(l)))
    for jid, k in nodedup_count.items():
        if k > 1:
            p.append('%s: returned by %d pushes without a dedup_key' % (jid, k))
    for jid, keys in id_keys.items():
        if len(keys) > 1:
            p.append('%s: returned for %s' % (jid, sorted(keys, key=str)))
    check('no duplicate ids or archive rows', p)

    # --- 11. dedup ------------------------------------------------------------
    p = []
    key_pushes = collections.defaultdict(list)
    for e in by['push']:
        if e['dedup'] is not None and e['status'] == 'ok':
            key_pushes[(e['q'], e['dedup'])].append(e)
    dedup_hits = 0
    for k, l in key_pushes.items():
        first = {}
        for e in l:
            first.setdefault(e['ids'][0], e)
        for e in l:
            y = e['ids'][0]
            if first[y] is not e:
                dedup_hits += 1
                continue
            for x, ex in first.items():
                if x == y or ex['t1'] >= e['t0']:
                    continue
                acc = acks_ok.get(x)
                if not acc or x not in archive:
                    continue
                if min(a['t0'] for a in acc) > e['t1']:
                    p.append('%s %s: push made %s while %s was live' % (k[0], k[1], y, x))
    check('dedup: no second live job for a key', p,
          '%d pushes returned the live job of their key' % dedup_hits)

    # --- 12. max_in_flight ----------------------------------------------------
    p = []
    cfg = collections.defaultdict(list)      # q -> [(t0, t1, cap, certain)]
    for e in by['config']:
        if 'max_in_flight' in e:
            cfg[e['q']].append((e['t0'], e['t1'], e['max_in_flight'], True))
    for e in by['fault_error']:
        if e['kind'] == 'cap' and 'max_in_flight' in e:
            cfg[e['q']].append((e['t0'], float('inf'), e['max_in_flight'], False))

    def maxcap(q, a, b):
        l = sorted(cfg.get(q, []))
        before = [c for c in l if c[3] and c[1] < a]
        caps = []
        if before:
            caps.append(before[-1][2])
            since = before[-1][1]
        else:
            caps.append(0)
            since = float('-inf')
        for c in l:
            if c[0] <= b and c[1] >= a:
                caps.append(c[2])
            elif not c[3] and c[0] <= b and c[0] > since:
                caps.append(c[2])
        if any(c == 0 for c in caps):
            return float('inf')
        return max(caps)

    samples = sorted(by['sample'], key=lambda e: e['t0'])
    peak = collections.Counter()
    capped = [q for q in queues_start if queues_start[q].get('max_in_flight')]
    at_cap = 0
    for q in capped:
        prev_n, prev_t = 0, (t_run or 0)
        for s in samples:
            n = s['wq'].get(q, 0)
            c = maxcap(q, prev_t - 1.0, s['t1'])
            if c != float('inf'):
                if n > prev_n:
                    peak[q] = max(peak[q], n)
                if n >= c:
                    at_cap += 1
            if n > max(prev_n, c):
                p.append('%s: %d rows in work_queue at %.3f, was %d at %.3f, cap at most %s' % (
                    q, n, s['t0'], prev_n, prev_t, c))
            prev_n, prev_t = n, s['t0']
    check('max_in_flight never exceeded by a pass', p,
          '%d samples; %d with a capped queue at its cap; largest count grown to while capped %s' % (
              len(samples), at_cap, dict(peak)))

    # --- 12c. groups (1.2) ----------------------------------------------------
    p = []
    grouped = {q: s['group_max_in_flight'] for q, s in queues_start.items()
               if s.get('group_max_in_flight')}
    peak = collections.Counter()
    seen = 0
    for s in samples:
        for q, limit in sorted(grouped.items()):
            n = (s.get('grp') or {}).get(q)
            if n is None:
                continue
            seen += 1
            peak[q] = max(peak[q], n)
            if n > limit:
                p.append('%s: %d jobs of one group in flight at %.3f, group_max_in_flight %d' % (
                    q, n, s['t0'], limit))
    check('group_max_in_flight never exceeded', p,
          '%d samples of a grouped queue with a job in flight; most of one group seen %s' % (
              seen, dict(peak)))

    # --- 12b. rate limits (1.2) ------------------------------------------------
    # The releases of a rate-limited queue: the created time of each work
    # row seen (claims and the final state say it), one per (job, row); in
    # no window of rate_period more than rate_limit.  Releases never seen
    # (none here: every job is claimed by the end) would only make this
    # weaker.
    p = []
    info = []
    for q, st in sorted(queues_start.items()):
        limit = st.get('rate_limit') or 0
        if limit <= 0:
            continue
        per = round(period_seconds(st.get('rate_period', '1 second')) * 1e6)
        rel = set()
        for e in by['claim'] + by['final_work']:
            if e['q'] == q and e.get('released') is not None:
                rel.add((e['id'], round(e['released'] * 1e6)))
        times = sorted(t for _, t in rel)
        j = worst = full = 0
        for i, t in enumerate(times):
            while times[j] <= t - per:
                j += 1
            n = i - j + 1
            worst = max(worst, n)
            if n == limit:
                full += 1
            elif n > limit:
                p.append('%s: %d releases in the %g s up to %.6f, limit %d' % (
                    q, n, per / 1e6, t / 1e6, limit))
        if not times:
            p.append('%s: no release seen' % q)
        elif full == 0 and not partial:
            p.append('%s: the limit never engaged (%d releases, at most %d in a window of %d)'
                     % (q, len(times), worst, limit))
        info.append('%s: %d releases, at most %d in any %g s (limit %d), %d windows full' % (
            q, len(times), worst, per / 1e6, limit, full))
    check(R_RATE, p, '; '.join(info))

    # --- 12d. flows (1.2) ------------------------------------------------------
    # A child is released only after the ack of each of its parents
    # committed: each of its claims returned after an accepted ack of every
    # parent was sent (an ack sent after the claim returned cannot have
    # made it claimable).  At the end, a child some of whose parents were
    # never acked is still waiting; one whose parents were all acked is not
    # (check 7 has it acked or failed).
    p = []
    n_children = n_released = n_fanin = n_held = 0
    for child, ps in sorted(parents_of.items()):
        if child not in pushed or (pushed[child]['status'] != 'ok' and child not in claims
                                   and child not in final_job and not archive.get(child)):
            continue
        n_children += 1
        for c in claims.get(child, []):
            for par in ps:
                ack_t0 = [a['t0'] for a in acks_ok.get(par, []) + acks_maybe.get(par, [])]
                if not ack_t0 or min(ack_t0) >= c['t1']:
                    p.append('%s: claimed by %s at %.3f, before an ack of its parent %s%s' % (
                        child, c['holder'], c['t1'], par,
                        ' (sent at %.3f)' % min(ack_t0) if ack_t0 else ' (never acked)'))
        if claims.get(child):
            n_released += 1
            if len(ps) > 1:
                n_fanin += 1
        fj = final_job.get(child)
        if not partial and end is not None:
            if is_held(child):
                n_held += 1
                if fj is None or fj['state'] != 'waiting':
                    p.append('%s: a parent was never acked, but it is %s' % (
                        child, 'gone' if fj is None else fj['state']))
            elif fj is not None and fj['state'] == 'waiting':
                p.append('%s: left waiting though its parents %s were acked' % (child, ps))
    if n_released == 0 and not partial:
        p.append('no child of a flow was claimed: the flows never ran')
    check(R_FLOW, p, '%d children pushed, %d claimed (%d fan-ins), %d held by unacked parents' % (
        n_children, n_released, n_fanin, n_held))

    # --- 13. not stuck --------------------------------------------------------
    p = []
    idle = sorted(by['idle'], key=lambda e: e['t0'])
    rolled_back = collections.defaultdict(list)     # id -> [claim_rb]
    for e in by['claim_rb']:
        rolled_back[e['id']].append(e)
    idle_t0 = [e['t0'] for e in idle]
    import bisect
    probes = 0
    for s in samples:
        for jid, q, since in s['claimable']:
            # a row made claimable by pgq_release keeps its old `created`:
            # it was claimable only from the release on
            # a claim rolled back (ring mode) held the row until its ROLLBACK
            for rb in rolled_back.get(jid, []):
                if rb['t0'] < s['t0']:
                    since = max(since, rb['t1'])
            # the last claim that ended after the row was made took it (a
            # claim may begin before the row it takes exists: a blocking
            # claim, or one that waited for a lock), and held it until its
            # holder was released (or the sample)
            cl = [c for c in claims.get(jid, []) if c['t1'] < s['t0']]
            if cl and cl[-1]['t1'] > since - 0.01:
                last = cl[-1]
                rel = [r['t1'] for r in releases.get(last['holder'], [])
                       if r['t1'] > last['t0'] and r['t0'] < s['t0']]
                since = max(since, min(rel) if rel else s['t0'])
            lo = since + 1.0
            i = bisect.bisect_left(idle_t0, lo)
            for e in idle[i:]:
                if e['t0'] >= s['t0']:
                    break
                if e['t1'] > s['t0']:
                    continue
                if e['queues'] is not None and q not in e['queues']:
                    continue
                if any(c0 - 20 < s['t1'] and c1 > since - 1 for c0, c1 in crashes):
                    continue
                probes += 1
                p.append('%s (%s): claimable since %.3f, still there at %.3f, but a claim by %s '
                         'at %.3f..%.3f came back empty' % (jid, q, since, s['t0'], e['holder'],
                                                          e['t0'], e['t1']))
                break
    check('no job stuck in work_queue while consumers were idle', p,
          '%d samples, %d empty claims, %d rows seen claimable for over 1 s' % (
              len(samples), len(idle), sum(len(s['claimable']) for s in samples)))

    # --- 13b. no due job left unscheduled ------------------------------------
    p = []
    pauses = collections.defaultdict(list)      # q -> [(t0, t1, paused, certain)]
    for e in by['config']:
        if 'paused' in e:
            pauses[e['q']].append((e['t0'], e['t1'], e['paused'], True))
    for e in by['fault_error']:
        if e['kind'] == 'pause' and e.get('q'):
            pauses[e['q']].append((e['t0'], float('inf'), True, False))

    # while a queue is paused (from the pause's start to 1 s after the end of
    # the resume) or the scheduler is down (from a fault's start to 3 s
    # after it ended: restart and first pass), waiting is legitimate
    outages = [(e['t0'], e['t1'] + 3) for e in by['fault'] + by['fault_error']
               if e['kind'] in ('term_scheduler', 'sigkill', 'restart')]
    paused_spans = collections.defaultdict(list)
    for q, l in pauses.items():
        l = sorted(l)
        for i, (t0, t1, pz, certain) in enumerate(l):
            if pz:
                end_ = next((x[1] for x in l[i + 1:] if x[2] is False and x[3]), float('inf'))
                paused_spans[q].append((t0, end_ + 1))

    def waited(q, a, b):
        """How long of [a, b] was neither paused nor in an outage."""
        spans = sorted((max(a, x), min(b, y)) for x, y in outages + paused_spans[q] if x < b and y > a)
        covered, cur = 0.0, a
        for x, y in spans:
            x = max(x, cur)
            if y > x:
                covered += y - x
                cur = y
        return (b - a) - covered

    # a child of a flow is due once its last parent's ack committed (its
    # run_after is its push's: it may have waited for its parents long)
    def became_due(jid, due):
        for par in parents_of.get(jid, []):
            t1 = [a['t1'] for a in acks_ok.get(par, []) + acks_maybe.get(par, [])]
            if not t1:
                return None     # a parent never acked: check R_FLOW's
            due = max(due, min(t1))
        return due

    n_due = 0
    worst_wait = 0.0
    for s in samples:
        for jid, q, due in s.get('due', []):
            due = became_due(jid, due)
            if due is None:
                continue
            n_due += 1
            w = waited(q, due, s['t0'])
            worst_wait = max(worst_wait, w)
            if w > 5:
                p.append('%s (%s): due at %.3f, not scheduled at %.3f: %.1f s of it '
                         'unpaused with a scheduler up' % (jid, q, due, s['t0'], w))
    check('no due job of an uncapped queue left unscheduled', p,
          '%d jobs seen due for over 5 s; longest wait outside pauses and outages %.1f s' % (
              n_due, worst_wait))

    # --- 14. drained ----------------------------------------------------------
    p = []
    if final_work:
        p.append('%d rows left in work_queue: %s' % (len(final_work), list(final_work)[:EXAMPLES]))
    left = [j for j in final_job.values() if j['state'] != 'failed'
            and not (j['state'] == 'waiting' and is_held(j['id']))]
    if left:
        p.append('%d jobs not failed left in pgqueue.queue: %s' % (
            len(left), ['%s %s' % (j['id'], j['state']) for j in left[:EXAMPLES]]))
    drained = next((e for e in by['phase'] if e['name'] == 'drained'), None)
    drain_s = (drained['t'] - t_drain) if drained and t_drain else None
    check('drained: work_queue empty, only failed jobs left', p,
          'drain took %.1f s' % drain_s if drain_s is not None else '')

    # --- 15. bounded ----------------------------------------------------------
    # bounded by the most live rows seen so far: a table keeps the pages
    # its rows filled after they are gone (VACUUM gives back only those at
    # its end), and slot 0 of queue, which holds a paused queue's backlog,
    # is never truncated; a ring that did not give its slots back would
    # grow with every job, far past that
    p = []
    worst = 0.0
    max_bytes = max_arch = 0
    peak = 0
    for e in sorted(by['sizes'], key=lambda e: e['t']):
        b = e['bytes'].get('queue', 0) + e['bytes'].get('work_queue', 0)
        live = e['queue_rows'] + e['work_rows']
        peak = max(peak, live)
        bound = 8 * 2**20 + 8192 * peak
        worst = max(worst, b / bound)
        max_bytes = max(max_bytes, b)
        max_arch = max(max_arch, e['archive_bytes'])
        if b > bound:
            p.append('at %.0f: queue+work_queue %d bytes for %d live rows (at most %d so far)' % (
                e['t'], b, live, peak))
        abound = 4 * 2**20 + 2048 * e['archive_rows']
        if e['archive_bytes'] > abound:
            p.append('at %.0f: archive %d bytes for %d rows' % (e['t'], e['archive_bytes'],
                                                                e['archive_rows']))
    if not by['sizes']:
        p.append('no size samples')
    check('table sizes bounded', p, '%d samples, largest queue+work_queue %.1f MB (%.0f%% of bound), '
          'archive %.1f MB' % (len(by['sizes']), max_bytes / 2**20, 100 * worst, max_arch / 2**20))

    # --- 16. server log -------------------------------------------------------
    p = []
    kills = sum(1 for e in by['fault'] + by['fault_error']
                if e['kind'] == 'sigkill' and e.get('pid') is not None)
    log = by['server_log'][0] if by['server_log'] else None
    if log is None:
        p.append('no server log summary')
    else:
        for k, n in log['counts'].items():
            if k == 'signal 9':
                if n > kills:
                    p.append('%d processes ended by SIGKILL, %d injected' % (n, kills))
            else:
                p.append('%d lines "%s"' % (n, k))
        p.extend(log['lines'][:EXAMPLES])
    check('server log: no crash but the ones injected', p,
          'counts %s' % (log['counts'] if log else None))

    # --- 17. coverage ---------------------------------------------------------
    p = []
    faults = collections.Counter(e['kind'] for e in by['fault'])
    fault_errors = collections.Counter(e['kind'] for e in by['fault_error'])
    for k in ('term_scheduler', 'sigkill', 'restart', 'release', 'pause', 'resume', 'weight', 'cap'):
        if not faults.get(k):
            p.append('no %s fault' % k)
    if not n_acked:
        p.append('no job acked')
    if not n_failed:
        p.append('no job failed')
    if not steals:
        p.append('no lease taken over')
    if not acks_refused:
        p.append('no stale ack refused')
    check('coverage: every fault kind, acks, failures, steals, stale acks', p)

    ring_figures = ring_checks(by, check, crashes, claims, p_ring) if ring else None

    # --- report ---------------------------------------------------------------
    passed = failed = 0
    for n, (name, problems, info) in enumerate(results, 1):
        if problems:
            failed += 1
            print('not ok %d - %s%s' % (n, name, ' (%s)' % info if info else ''))
            for x in problems[:EXAMPLES if not verbose else None]:
                print('    %s' % x)
            if len(problems) > EXAMPLES and not verbose:
                print('    ... %d more (--verbose)' % (len(problems) - EXAMPLES))
        else:
            passed += 1
            print('ok %d - %s%s' % (n, name, ' (%s)' % info if info else ''))
    figures = dict(
        seconds=start.get('seconds'), seed=start.get('seed'),
        duration=round(end['duration'], 1) if end else None,
        drain_seconds=round(drain_s, 1) if drain_s is not None else None,
        push_calls=len(by['push']), push_uncertain=sum(1 for e in by['push'] if e['status'] == 'uncertain'),
        uncertain_push_jobs_committed=n_unc_yes, uncertain_push_jobs_absent=n_unc_no,
        jobs=n_certain + n_unc_yes, acked=n_acked, failed=n_failed,
        claims=sum(len(l) for l in claims.values()), steals=steals,
        nacks=len(by['nack']), stale_acks_refused=len(acks_refused),
        acks_commit_lost=sum(len(l) for l in acks_maybe.values()),
        claims_commit_lost=len(uncertain_claims), disconnects=len(by['disconnect']),
        faults=dict(faults), fault_errors=dict(fault_errors),
        samples=len(samples), size_samples=len(by['sizes']),
        archive_rows=sum(len(l) for l in archive.values()),
        manual_passes=sum(e['passes'] for e in by['manual_passes']),
        manual_moved=sum(e['moved'] for e in by['manual_passes']),
    )
    if ring_figures is not None:
        figures['ring'] = ring_figures
    print('soak figures: %s' % json.dumps(figures, sort_keys=True))
    if ring_figures is not None:
        print_ring_figures(ring_figures)
    print('soak: %d passed, %d failed' % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
