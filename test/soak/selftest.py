#!/usr/bin/python3
"""
Does checker.py catch what it is meant to?  Takes the history of a run that
passed, makes one violation at a time in a copy (a second accepted ack, an
ack from a stale holder, a lost job, a cap exceeded, ...) and expects the
checker to fail exactly the check that names it.

    /usr/bin/python3 selftest.py history.jsonl [--failing-base]

A history of the ring mode gets the ring checks' violations too (a job
vanished from a snapshot, a pg_dump failed, a restored job missing, ...).
--failing-base takes a history that fails some checks (a run on code with
known defects) and tries only the violations of the checks it passes.

Prints "ok N - ..." / "not ok N - ..." per violation and
"soak: N passed, N failed" (run.sh runs it after a run that passed).
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import checker  # noqa: E402  (the names of its checks)


def load(path):
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def run_checker(events):
    fd, path = tempfile.mkstemp(suffix='.jsonl')
    try:
        with os.fdopen(fd, 'w') as f:
            for e in events:
                f.write(json.dumps(e) + '\n')
        r = subprocess.run([sys.executable, os.path.join(HERE, 'checker.py'), path],
                           stdout=subprocess.PIPE, universal_newlines=True)
        return [l[len('not ok '):].split(' - ', 1)[1] for l in r.stdout.splitlines()
                if l.startswith('not ok ')]
    finally:
        os.unlink(path)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('-')]
    failing_base = '--failing-base' in sys.argv
    base = load(args[0])
    ev = lambda k: [e for e in base if e['ev'] == k]
    acks = [e for e in ev('ack') if e['result'] is True and e['status'] == 'ok']
    claims = {}
    for e in ev('claim'):
        claims.setdefault(e['id'], []).append(e)
    for l in claims.values():
        l.sort(key=lambda e: e['version'])
    crashes = [(e['t0'], e['t1']) for e in ev('fault') if e['kind'] in
               ('sigkill', 'restart', 'term_scheduler')]
    nacked = {(e['id'], e['holder']) for e in ev('nack')}
    released = {e.get('key') for e in ev('fault') if e['kind'] == 'release'}
    mutations = []

    def mutation(name, expect):
        def deco(fn):
            mutations.append((name, expect, fn))
            return fn
        return deco

    def far_from_crashes(t, margin=30):
        return all(not (c0 - margin < t < c1 + margin) for c0, c1 in crashes)

    @mutation('a rate-limited queue released past its limit',
              'rate limits: never more releases in a window of rate_period than rate_limit')
    def _(h):
        c = next(e for e in ev('claim') if e['q'] == 'soak_rate' and e.get('released'))
        limit = next(e for e in ev('start'))['queues']['soak_rate']['rate_limit']
        for k in range(limit + 1):
            h.append(dict(c, id='00000000-0000-7000-8000-%012d' % k, released=c['released'] + k * 1e-4))

    parents_of = {}
    for e in ev('push'):
        parents_of.update(e.get('parents', {}))

    @mutation('a child of a flow claimed before its parent was acked', checker.R_FLOW)
    def _(h):
        acks_t0 = {}    # accepted acks, single or of a whole batch
        for a in acks:
            acks_t0.setdefault(a['id'], []).append(a['t0'])
        for a in ev('ack_batch'):
            if a['status'] == 'ok' and a['count'] == len(a['ids']):
                for i in a['ids']:
                    acks_t0.setdefault(i, []).append(a['t0'])
        for e in h:
            if e['ev'] == 'claim' and e['id'] in parents_of and \
                    all(p in acks_t0 for p in parents_of[e['id']]):
                t = min(min(acks_t0[p]) for p in parents_of[e['id']])
                e['t0'], e['t1'] = t - 0.02, t - 0.01
                return
        raise LookupError('no child of a flow claimed')

    @mutation('a child of a flow left waiting after its parents were acked', checker.R_FLOW)
    def _(h):
        for i, e in enumerate(h):
            if e['ev'] == 'final_archive' and e['id'] in parents_of:
                h[i] = dict(ev='final_job', id=e['id'], q=e['q'], state='waiting', tries=0,
                            last_error=None, dedup=None, t=e.get('t', 0))
                return
        raise LookupError('no child of a flow acked')

    @mutation('a second accepted ack, by another holder', 'at most one accepted ack per job')
    def _(h):
        a = next(a for a in acks if a['id'] in claims)
        b = dict(a, holder=a['holder'] + 'x', t0=a['t0'] + 0.001, t1=a['t1'] + 0.001)
        h.append(b)

    @mutation('an accepted ack from a holder that lost the job',
              'accepted acks come from the latest claimant')
    def _(h):
        for a in acks:
            l = claims.get(a['id'], [])
            if len(l) >= 2 and l[0]['holder'] != a['holder']:
                for e in h:
                    if e is not a and e['ev'] == 'ack' and e['id'] == a['id'] and e['t0'] == a['t0']:
                        e['holder'] = l[0]['holder']
                        return
        raise LookupError('no stolen job acked')

    @mutation('an acked job lost (its archive row gone)',
              'every pushed job acked exactly once or failed after max_tries')
    def _(h):
        i = next(i for i, e in enumerate(h) if e['ev'] == 'final_archive')
        del h[i]

    @mutation('an archive row twice', 'no duplicate ids or archive rows')
    def _(h):
        e = next(e for e in h if e['ev'] == 'final_archive')
        h.append(dict(e))

    @mutation('work committed for a job that was not acked',
              'the work commits with its ack: one row per acked job, none else')
    def _(h):
        e = next(e for e in h if e['ev'] == 'final_job' and e['state'] == 'failed')
        h.append(dict(ev='final_done', id=e['id'], holder='c0.0'))

    @mutation('a job in the tables that nobody pushed', 'no job that was not pushed')
    def _(h):
        h.append(dict(ev='final_job', id='00000000-0000-7000-8000-000000000000', q='soak_plain',
                      state='failed', tries=5, last_error='x', dedup=None))

    @mutation('a claim while another holder\'s lease was live', 'no live lease stolen')
    def _(h):
        for l in claims.values():
            for a, b in zip(l, l[1:]):
                if a['holder'] != b['holder'] and (a['id'], a['holder']) not in nacked \
                        and a['holder'] not in released:
                    for e in h:
                        if e['ev'] == 'claim' and e['id'] == b['id'] and e['version'] == b['version']:
                            e['lock_timeout'] = a['lock_timeout'] - 0.5 + b['lease']
                            return
        raise LookupError('no pair of claims')

    @mutation('two holders with one version', 'one holder per claim (versions and tries grow)')
    def _(h):
        c = next(l[-1] for l in claims.values())
        h.append(dict(c, holder=c['holder'] + 'x'))

    @mutation('a capped queue grown past its cap', 'max_in_flight never exceeded by a pass')
    def _(h):
        # either capped queue: a short run under load may have set one's
        # cap to 0 (none) early and never back
        for q in ('soak_cap3', 'soak_cap5'):
            cfg = sorted((e['t0'], e['t1'], e['max_in_flight']) for e in h
                         if e['ev'] in ('config', 'fault_error') and e.get('q') == q
                         and e.get('max_in_flight') is not None)
            for s in [e for e in h if e['ev'] == 'sample']:
                t = s['t0']
                last = [c for c in cfg if c[1] < t - 5]
                if last and last[-1][2] > 0 and not any(t - 5 <= c[1] and c[0] <= t + 1 for c in cfg) \
                        and s['wq'].get(q, 0) <= last[-1][2]:
                    # a sample just after it: the count jumped past a cap
                    # that had not changed for 5 s
                    h.append(dict(s, wq=dict(s['wq'], **{q: last[-1][2] + 1}),
                                  t0=s['t0'] + 0.01, t1=s['t1'] + 0.01))
                    return
        raise LookupError('no sample under a stable cap')

    @mutation('a group with two jobs in flight under group_max_in_flight = 1',
              'group_max_in_flight never exceeded')
    def _(h):
        for s in [e for e in h if e['ev'] == 'sample']:
            if (s.get('grp') or {}).get('soak_group'):
                h.append(dict(s, grp=dict(s['grp'], soak_group=2),
                              t0=s['t0'] + 0.01, t1=s['t1'] + 0.01))
                return
        raise LookupError('no sample with a job of a group in flight')

    @mutation('a claimable row missed by an empty claim',
              'no job stuck in work_queue while consumers were idle')
    def _(h):
        idle = next((e for e in h if e['ev'] == 'idle' and e['queues'] is None
                     and all(not (c0 - 25 < e['t1'] and c1 > e['t0'] - 4) for c0, c1 in crashes)),
                    None)
        if idle is None:
            # a short run with a crash every few seconds has no empty claim
            # far from one: an empty claim of all queues made 10 s after the
            # last crash ended (a copy of a real one, moved)
            real = next(e for e in h if e['ev'] == 'idle')
            t = max([c1 for c0, c1 in crashes] + [real['t1']]) + 10
            idle = dict(real, queues=None, t0=t, t1=t + 0.5)
            h.append(idle)
        h.append(dict(ev='sample', wq={}, due=[], t0=idle['t1'] + 0.01, t1=idle['t1'] + 0.02,
                      claimable=[['00000000-0000-7000-8000-000000000001', 'soak_plain',
                                  idle['t0'] - 2]]))

    @mutation('a due job of an uncapped queue not scheduled',
              'no due job of an uncapped queue left unscheduled')
    def _(h):
        samples = [e for e in h if e['ev'] == 'sample']
        for q in ('soak_plain', 'soak_fail'):
            # paused from a pause's start to the end of the next resume
            cf = sorted((e['t0'], e['t1'], e['paused']) for e in h
                        if e['ev'] in ('config', 'fault_error') and e.get('q') == q
                        and (e.get('paused') is not None or e.get('kind') == 'pause'))
            spans = []
            for i, (t0, t1, pz) in enumerate(cf):
                if pz is not False:
                    end = next((c[1] for c in cf[i + 1:] if c[2] is False), float('inf'))
                    spans.append((t0, end))
            for s in samples[len(samples) // 3:]:
                t = s['t0']
                if all(not (o0 <= t + 0.1 and o1 >= t - 15) for o0, o1 in crashes) and \
                        all(not (p0 <= t + 0.1 and p1 >= t - 10) for p0, p1 in spans):
                    s['due'] = s.get('due', []) + [['00000000-0000-7000-8000-000000000002',
                                                     q, t - 8]]
                    return
            # no quiet sample (a short run, a fault every few seconds): a job
            # due since the run began, seen at the last sample, whose wait
            # outside pauses and scheduler outages (as the checker counts
            # them) is over 8 s
            outages = [(e['t0'], e['t1'] + 3) for e in h if e['ev'] in ('fault', 'fault_error')
                       and e['kind'] in ('term_scheduler', 'sigkill', 'restart')]
            t_run = next(e['t'] for e in h if e['ev'] == 'phase' and e['name'] == 'run')
            s = samples[-1]
            cover = sorted((max(t_run, x), min(s['t0'], y)) for x, y in
                           outages + [(a, b + 1) for a, b in spans] if x < s['t0'] and y > t_run)
            covered, cur = 0.0, t_run
            for x, y in cover:
                x = max(x, cur)
                if y > x:
                    covered += y - x
                    cur = y
            if s['t0'] - t_run - covered > 8:
                s['due'] = s.get('due', []) + [['00000000-0000-7000-8000-000000000002', q, t_run]]
                return
        raise LookupError('no quiet sample')

    @mutation('a backend crashed by itself (signal 11)', 'server log: no crash but the ones injected')
    def _(h):
        e = next(e for e in h if e['ev'] == 'server_log')
        e['counts'] = dict(e['counts'], **{'signal 11': 1})

    @mutation('half a push found after a lost COMMIT',
              'pushes with a lost COMMIT: absent, or acked once or failed')
    def _(h):
        p = next(e for e in h if e['ev'] == 'push' and len(e['ids']) > 1)
        h.append(dict(ev='push_resolved', ids=p['ids'], q=p['q'], by=p['by'], dedup=None, found=1))

    # --- the ring mode's checks (ring.py) ---------------------------------------
    ring = any(e['ev'] == 'start' and e.get('mode') == 'ring' for e in base)
    if ring:

        @mutation('the ring never turned', checker.R1)
        def _(h):
            first = next(i for i, e in enumerate(h) if e['ev'] == 'ring')
            h[:] = [e for i, e in enumerate(h) if e['ev'] != 'ring' or i == first]

        @mutation('a job vanished from a snapshot on the primary', checker.R3)
        def _(h):
            e = next(e for e in h if e['ev'] == 'snap' and e['where'] == 'primary'
                     and e['status'] == 'ok' and e.get('rows'))
            e['vanished'] = ['00000000-0000-7000-8000-000000000003']

        @mutation('an ack, nack or extend under REPEATABLE READ refused to its holder', checker.R4)
        def _(h):
            # an ack if the run has a fitting one, else a nack or an extend
            # (a short run may have few acks under REPEATABLE READ that no
            # claim of unknown outcome overlaps)
            unsure = [e for e in base if e['ev'] == 'claim_uncertain']
            answered = [e for k in ('ack', 'nack', 'extend') for e in ev(k)
                        if e.get('ctx') == 'rr' and e['status'] == 'ok' and
                        e['result'] not in (None, False)]
            # a release of the holder's key between its claim and the call
            # would make a refusal right
            releases = [e for e in base if e['ev'] == 'fault' and e['kind'] == 'release']
            for a in answered:
                l = claims.get(a['id'], [])
                if l and l[-1]['holder'] == a['holder'] and \
                        not any(r.get('key') == a['holder'] and r['t1'] > l[-1]['t0'] and
                                r['t0'] < a['t1'] for r in releases) and \
                        not any(u['t1'] > l[-1]['t0'] and u['t0'] < a['t1'] for u in unsure):
                    for e in h:
                        if e['ev'] == a['ev'] and e['id'] == a['id'] and e['t0'] == a['t0']:
                            e['result'] = False if a['ev'] == 'ack' else None
                            return
            raise LookupError('no ack, nack or extend under REPEATABLE READ answered')

        @mutation('a failed pg_dump', checker.R5)
        def _(h):
            e = next(e for e in h if e['ev'] == 'dump' and e['rc'] == 0)
            e.update(rc=1, err=['pg_dump: error: query failed: ERROR:  relation '
                                '"pgqueue.queue_3" does not exist'])

        @mutation('an error of pg_restore', checker.R6)
        def _(h):
            e = next(e for e in h if e['ev'] == 'restore' and e.get('dump') is not None)
            e.update(rc=1, n_errors=1, errors=['pg_restore: error: could not execute query'])

        @mutation('a job of the dump missing from the restored database', checker.R7)
        def _(h):
            e = next(e for e in h if e['ev'] == 'restore_check' and e['when'] == 'final'
                     and e.get('jobs'))
            e['jobs'] = e['jobs'][1:]

        @mutation('a standby snapshot that lost jobs between its counts', checker.R8)
        def _(h):
            e = next(e for e in h if e['ev'] == 'snap' and e['where'] == 'standby'
                     and e['status'] == 'ok' and len(e['paused']) == 2)
            e['paused'] = [e['paused'][0], e['paused'][0] - 1]

    passed = failed = 0
    base_fail = run_checker(base)
    if base_fail and not failing_base:
        print('not ok 0 - the history itself fails: %s' % base_fail)
        print('soak: 0 passed, 1 failed')
        sys.exit(1)
    for n, (name, expect, fn) in enumerate(mutations, 1):
        if any(g == expect or g.startswith(expect + ' (') for g in base_fail):
            print('ok %d - checker catches %s # SKIP the history fails that check already' % (n, name))
            continue
        h = copy.deepcopy(base)
        try:
            fn(h)
        except (StopIteration, LookupError) as e:
            print('not ok %d - checker catches %s: no place to make it (%r)' % (n, name, e))
            failed += 1
            continue
        got = run_checker(h)
        if any(g == expect or g.startswith(expect + ' (') for g in got):
            passed += 1
            print('ok %d - checker catches %s' % (n, name))
        else:
            failed += 1
            print('not ok %d - checker catches %s: expected "%s" to fail, got %s' % (
                n, name, expect, got))
    print('soak: %d passed, %d failed' % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
