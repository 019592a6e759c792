/*-------------------------------------------------------------------------
 *
 * bounds.c
 *		Scan bounds: where claims and scheduling passes start their index
 *		walks, kept in shared memory per database.  One protocol for the
 *		three of them, written down here with the reason each path keeps it.
 *
 * Why.  Entries leave the head of three indexes all the time: claims take
 * never-claimed rows off work_queue_ready_idx, acks take leased rows off
 * work_queue_lease_idx, scheduling passes take jobs off each queue's range
 * of queue_ready_idx.  The index entries stay until VACUUM; while an old
 * snapshot holds the xmin horizon back they cannot even be marked dead, and
 * a walk from the left end of the index visits the heap tuple of every one
 * of them.  So walks start at a bound instead.
 *
 * The bounds, and their keys (compared as (hi, lo)):
 *	 PGQ_BOUND_READY  work_queue_ready_idx (created, batch_order): (0, created)
 *	 PGQ_BOUND_LEASE  work_queue_lease_idx (lock_timeout): (0, lock_timeout)
 *	 PGQ_BOUND_SCHED  queue_ready_idx (queue, -priority, run_after, id):
 *					  (-priority, run_after), the same for every queue
 * An entry counts for a bound while its row is in the index's predicate
 * in the committed state: READY a work_queue row never claimed or released
 * (lock_timeout IS NULL), LEASE a leased one (lock_timeout IS NOT NULL),
 * SCHED a 'pending' or 'retry' job (due or not, paused, capped or not).
 *
 * THE INVARIANT: no entry that counts has a key below its bound, once every
 * committed transaction has applied its lowerings (rule 3).  A bound only
 * says where to start; whether a row may be taken is decided on the row.
 *
 * The rules that keep it:
 *	1. A walk raises a bound to at most "first": the key of the first entry
 *	   it could not pass, as its snapshot sees the table; it passes only
 *	   entries whose rows are gone or out of the predicate, and never an
 *	   entry whose row it saw counting but could not lock (held by another
 *	   transaction, whose rollback would keep it counting).  A walk that ran
 *	   out of entries has first = the highest key.
 *	2. The walk reads its bound's ticket (the count of sets) before taking
 *	   its snapshot (pgq_bound_begin), and the set (pgq_bound_end) happens
 *	   only if no other set came in between; it stores min(first, low),
 *	   where low is the lowest lowering since the last set, and resets low.
 *	   So an entry committed after the walk's snapshot, invisible to it, is
 *	   not passed: its transaction lowered the bound after its commit,
 *	   hence after the ticket was read, either before the set (then it is in
 *	   low) or after (then it lowers the bound set).
 *	3. A transaction that makes an entry count with key k lowers the bound
 *	   and low to k when it commits, after its commit is visible
 *	   (pgq_bound_lower_at_commit, applied by the commit callback).
 *	4. A transaction that changed a bound's index (pgq_bound_hold, or a
 *	   lowering it owes) raises that bound no more until it ends: its
 *	   snapshot sees its own changes, which others do not see, and a
 *	   rollback brings back what it removed.  Its walks start below the
 *	   entries it added.
 *	5. A transaction with a transaction snapshot (REPEATABLE READ,
 *	   SERIALIZABLE) never raises a bound: its snapshot may predate the
 *	   ticket.  (Reading a bound is fine for it: what lies below it cannot
 *	   be locked by it either.)
 *	6. Lowering is always safe.  A walk that finds an entry below the bound
 *	   (possible only for one made behind the API's back) lowers the bound
 *	   to it at once.
 *	7. A walk from the start (a "full" walk) is what finds entries made
 *	   behind the API's back: a manual INSERT or UPDATE, and a PREPAREd
 *	   transaction's entries (COMMIT PREPARED is another session's commit,
 *	   where no lowering of the preparing one can run).  One is due
 *	   PGQ_FULL_CHECK_MS after the last one ended, or PGQ_FULL_COST times its
 *	   duration if that is longer (at most PGQ_FULL_MAX_MS): while VACUUM is
 *	   held back a full walk visits every dead entry, so they take at most
 *	   1/PGQ_FULL_COST of one process's time.  The walk that finds one due
 *	   takes it (others keep using the bound) and records its duration
 *	   whatever becomes of its set.  A scheduling pass's full walk lasts
 *	   to the end of the pass: the refresh that sets the bound only
 *	   resets the queues' heads, the walks from them visit the entries.
 *	8. A session's own start for a LEASE walk filtered by queue.  Such a
 *	   walk passes the expired leases of every other queue between the
 *	   bound and now, and the bound cannot pass an expired lease that no
 *	   claim takes (a queue whose workers are gone): without more, every
 *	   claim of every other queue's workers would visit them all.  So a
 *	   filtered walk that passed PGQ_MEMO_MIN or more of them leaves its
 *	   session a start of its own: the key where it stopped (the first
 *	   lease of its queues, or the walk's now), for the same queues.  The
 *	   next filtered walks of those queues start there and raise nothing
 *	   (the entries they skip are not theirs to judge).  An entry of those
 *	   queues below that start that the walk did not see can come only from
 *	   a transaction that commits after the walk's snapshot a lease whose
 *	   deadline is already past at its commit (a lease older than its
 *	   transaction), from a lowering of rule 6 or a restore, or from behind
 *	   the API's back; the first three bump the bound's memo_gen when they
 *	   happen (at commit: after it is visible), and a full walk's start
 *	   bumps it too (rule 7's period bounds the fourth).  A prepared
 *	   transaction's leases commit in another session, where no bump runs:
 *	   a transaction with LEASE lowerings lists its xid at PREPARE, no
 *	   session uses a start of its own while one listed is still prepared,
 *	   and the first to find one ended takes it off and bumps memo_gen (the
 *	   end is visible then: a prepared transaction stays "in progress"
 *	   until its COMMIT or ROLLBACK PREPARED is).  A start is used
 *	   only while memo_gen is what the walk that made it read before its
 *	   snapshot, and only by a transaction that could raise the bound
 *	   (rules 4 and 5); one that could not neither keeps nor uses one.
 *
 * The paths, and how each keeps the invariant:
 *	 push, push_batch   SCHED: their jobs count when they commit: rule 3
 *						(pgq_ready_at_commit, which also leaves the note
 *						that tells the scheduling processes the queue).
 *	 scheduling pass    SCHED: its jobs stop counting: rule 4 (held).
 *						READY: its work_queue rows count when it commits,
 *						created >= the pass's start: rule 3 (to the start).
 *						Between full walks a pass walks only the queues it
 *						takes jobs from, each from a head its process keeps
 *						by the same rules (schedule.c); SCHED is where a
 *						process that rebuilds its view starts each queue,
 *						and is raised only then, to the lowest head: rules
 *						1, 2, 6, 7.
 *	 claim, steal       READY rows stop counting, LEASE rows start (their
 *						deadline: the LEASE walk raises its bound up to the
 *						first deadline still to come, so that the claims
 *						until then skip the walk) and, for a steal, stop:
 *						rules 4 and 3.  Its walks: 1, 2, 6, 7; filtered
 *						walks of READY only lower (rule 6); filtered LEASE
 *						walks raise it with what they saw of every queue,
 *						or start at the session's own start (rule 8).
 *	 extend             LEASE: rule 4, and rule 3 for the new deadline.
 *	 ack                READY and LEASE rows go: rule 4.
 *	 nack               LEASE (and READY) rows go: rule 4; SCHED: its job
 *						counts again: rule 3.
 *	 release            LEASE rows go, READY rows come (their created):
 *						rules 4 and 3; rows failed on their last try: 4.
 *	 operator calls     (retry, cancel, purge) as the above for what they do.
 *	 rollback           nothing is lowered (rule 3 applies at commit only);
 *						rows it removed come back, but it raised nothing
 *						(rule 4) and other walks stopped at its locked rows
 *						(rule 1).
 *	 subtransactions    lowerings and holds stay when one rolls back: a
 *						lowering too many costs only a longer walk.
 *	 two-phase commit   at PREPARE the lowerings are dropped: rule 7.
 *	 restore            rows loaded by COPY, behind the API's back, while
 *						the scheduler paused (hook.c): when it resumes it
 *						lowers every bound to its lowest key and makes a
 *						full walk due (pgq_bounds_lower_all): rules 6, 7.
 *	 hot standby        claims fail their read-only check before reading a
 *						bound and passes do not run, so a promoted standby's
 *						bounds were never raised.
 *	 crash              shared memory starts over: every bound at its
 *						lowest key, its first walk a full one.
 *
 * Without shared memory (the library not preloaded) every walk is a full
 * walk.
 *
 * Layer 2 of src/README (shared memory and wake-ups): it may call the
 * other files of its layer and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "storage/procarray.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "shmem_internal.h"

#define PGQ_FULL_CHECK_MS	1000
#define PGQ_FULL_COST		100
#define PGQ_FULL_MAX_MS		30000
#define PGQ_MEMO_MIN		32

/*
 * Rule 8: this session's own start for LEASE walks filtered by queues (a
 * copy of the array, compared byte for byte), made by a walk that read
 * memo_gen == gen before its snapshot; passed: the leases of other queues
 * the walks behind it passed.
 */
typedef struct LeaseMemo
{
	ArrayType  *queues;
	PgqKey		start;
	uint64		gen;
	int64		passed;
} LeaseMemo;

static LeaseMemo memo;

static const char *const pgq_bound_names[PGQ_NUM_BOUNDS] = {"READY", "LEASE", "SCHED"};

static const PgqKey pgq_key_min = {PG_INT64_MIN, DT_NOBEGIN};
static const PgqKey pgq_key_max = {PG_INT64_MAX, DT_NOEND};

/* What the current transaction owes and holds (rules 3 and 4). */
static PgqKey pending_low[PGQ_NUM_BOUNDS];
static bool pending[PGQ_NUM_BOUNDS];
static bool held[PGQ_NUM_BOUNDS];

int
pgq_key_cmp(const PgqKey *a, const PgqKey *b)
{
	if (a->hi != b->hi)
		return a->hi < b->hi ? -1 : 1;
	if (a->lo != b->lo)
		return a->lo < b->lo ? -1 : 1;
	return 0;
}

/* A key of READY or LEASE: (0, ts). */
PgqKey
pgq_time_key(TimestampTz ts)
{
	PgqKey		k;

	k.hi = 0;
	k.lo = ts;
	return k;
}

/* Every bound of a new slot at its lowest key, a full walk due. */
void
pgq_bounds_reset(PgqDbSlot *slot)
{
	int			b;

	for (b = 0; b < PGQ_NUM_BOUNDS; b++)
	{
		slot->bounds[b].bound = pgq_key_min;
		slot->bounds[b].low = pgq_key_max;
		slot->bounds[b].sets = 0;
		slot->bounds[b].next_full = 0;
		/* no session's start made in the slot's last life matches */
		slot->bounds[b].memo_gen = (uint64) GetCurrentTimestamp();
		memset(slot->bounds[b].memo_prepared, 0, sizeof(slot->bounds[b].memo_prepared));
		slot->bounds[b].memo_prepared_lost = false;
	}
}

/*
 * Rules 6 and 7 for every bound of slot at once: rows were written behind
 * the API's back (a restore, hook.c).  Each bound and its low go to the
 * lowest key, and a full walk is due; the tickets are kept (rule 2: a walk
 * under way stores no more than low, now the lowest key).
 */
void
pgq_bounds_lower_all(PgqDbSlot *slot)
{
	int			b;

	SpinLockAcquire(&slot->bound_mutex);
	for (b = 0; b < PGQ_NUM_BOUNDS; b++)
	{
		slot->bounds[b].bound = pgq_key_min;
		slot->bounds[b].low = pgq_key_min;
		slot->bounds[b].next_full = 0;
		slot->bounds[b].memo_gen++;
	}
	SpinLockRelease(&slot->bound_mutex);
}

/*
 * Begin a walk of bound id's index: call before taking the walk's
 * snapshot.  may_raise: the walk sees every entry that counts (not only
 * those of some queues), so its result can raise the bound.  scan->start
 * is where to start (the lowest key for a full walk).
 */
void
pgq_bound_begin(PgqBoundId id, bool may_raise, PgqScan *scan)
{
	PgqDbSlot  *slot = pgq_my_slot();
	PgqBoundState *st;
	TimestampTz now;

	scan->id = id;
	scan->start = pgq_key_min;
	scan->full = true;
	scan->owns_full = false;
	scan->walk_goes_on = false;
	scan->entries = -1;
	scan->raise = false;
	scan->ticket = 0;
	scan->memo_ok = false;
	scan->from_memo = false;
	scan->memo_gen = 0;
	if (slot == NULL)
		return;

	/* rules 4 and 5 */
	scan->memo_ok = !held[id] && !pending[id] && !IsolationUsesXactSnapshot();
	scan->raise = may_raise && scan->memo_ok;
	now = GetCurrentTimestamp();
	st = &slot->bounds[id];
	SpinLockAcquire(&slot->bound_mutex);
	scan->ticket = st->sets;
	if (now >= st->next_full)
	{
		/* rule 7: this walk takes the full walk that is due */
		st->next_full = now + PGQ_FULL_CHECK_MS * INT64CONST(1000);
		scan->owns_full = true;
		scan->began = now;
		/* rule 8: what it may find was not seen by the sessions' starts */
		st->memo_gen++;
	}
	else
	{
		scan->start = st->bound;
		scan->full = false;
	}
	scan->memo_gen = st->memo_gen;
	SpinLockRelease(&slot->bound_mutex);

	/* rule 4: start below what this transaction added */
	if (pending[id] && pgq_key_cmp(&pending_low[id], &scan->start) < 0)
		scan->start = pending_low[id];
}

/*
 * End a walk begun with pgq_bound_begin: first is the key of the first
 * entry it could not pass (rule 1; pgq_key_max when it ran out).
 */
void
pgq_bound_end(PgqScan *scan, PgqKey first)
{
	PgqDbSlot  *slot = pgq_my_slot();
	PgqBoundState *st;

	if (slot == NULL)
		return;
	st = &slot->bounds[scan->id];
	SpinLockAcquire(&slot->bound_mutex);
	if (scan->raise && st->sets == scan->ticket)
	{
		/* rule 2 */
		st->bound = pgq_key_cmp(&first, &st->low) < 0 ? first : st->low;
		st->low = pgq_key_max;
		st->sets++;
	}
	else if (pgq_key_cmp(&first, &st->bound) < 0)
	{
		/* rule 6 */
		st->bound = first;
		if (pgq_key_cmp(&first, &st->low) < 0)
			st->low = first;
		st->memo_gen++;
	}
	SpinLockRelease(&slot->bound_mutex);
	if (!scan->walk_goes_on)
		pgq_bound_full_done(scan);
}

/*
 * The walk begun with pgq_bound_begin is over: if it was the full walk that
 * was due, the next one is due PGQ_FULL_COST times its duration from now
 * (rule 7).  pgq_bound_end calls it, unless scan->walk_goes_on: the walk
 * goes on after its result was stored (a scheduling pass sets the SCHED
 * bound from the heads it starts from, then walks from them), and its
 * caller calls this when it ends, so that the spacing counts the walk.
 */
void
pgq_bound_full_done(PgqScan *scan)
{
	PgqDbSlot  *slot;
	PgqBoundState *st;
	TimestampTz now;
	int64		took;
	int64		wait;

	if (!scan->owns_full || (slot = pgq_my_slot()) == NULL)
		return;
	scan->owns_full = false;
	now = GetCurrentTimestamp();
	took = Max(now - scan->began, 0);
	wait = took * PGQ_FULL_COST;
	wait = Max(wait, PGQ_FULL_CHECK_MS * INT64CONST(1000));
	wait = Min(wait, PGQ_FULL_MAX_MS * INT64CONST(1000));
	st = &slot->bounds[scan->id];
	SpinLockAcquire(&slot->bound_mutex);
	st->next_full = now + wait;
	SpinLockRelease(&slot->bound_mutex);
	if (scan->entries >= 0)
		elog(DEBUG1, "pgqueue: full walk of the %s bound took " INT64_FORMAT " us; the next in " INT64_FORMAT " ms; " INT64_FORMAT " index entries read",
			 pgq_bound_names[scan->id], took, wait / 1000, scan->entries);
	else
		elog(DEBUG1, "pgqueue: full walk of the %s bound took " INT64_FORMAT " us; the next in " INT64_FORMAT " ms",
			 pgq_bound_names[scan->id], took, wait / 1000);
}

/* Rule 8: whether the session's start is for these queues (byte for byte). */
static bool
pgq_memo_for(ArrayType *queues)
{
	return memo.queues != NULL && VARSIZE(memo.queues) == VARSIZE(queues) &&
		memcmp(memo.queues, queues, VARSIZE(queues)) == 0;
}

/*
 * Rule 8: whether no transaction prepared with LEASE lowerings is still
 * prepared.  Those found ended are taken off the list, with a bump of
 * memo_gen (their leases are visible now: every start is dropped).
 */
static bool
pgq_memo_no_prepared(void)
{
	PgqDbSlot  *slot = pgq_my_slot();
	PgqBoundState *st;
	TransactionId xids[PGQ_MEMO_PREPARED];
	bool		none = true;
	int			i;

	if (slot == NULL)
		return false;
	st = &slot->bounds[PGQ_BOUND_LEASE];
	SpinLockAcquire(&slot->bound_mutex);
	memcpy(xids, st->memo_prepared, sizeof(xids));
	if (st->memo_prepared_lost)
		none = false;
	SpinLockRelease(&slot->bound_mutex);
	for (i = 0; i < PGQ_MEMO_PREPARED; i++)
	{
		if (!TransactionIdIsValid(xids[i]))
			continue;
		none = false;
		if (TransactionIdIsInProgress(xids[i]))
			continue;
		SpinLockAcquire(&slot->bound_mutex);
		if (st->memo_prepared[i] == xids[i])
		{
			st->memo_prepared[i] = InvalidTransactionId;
			st->memo_gen++;
		}
		SpinLockRelease(&slot->bound_mutex);
	}
	return none;
}

/*
 * Rule 8, at PREPARE: list the transaction when it has LEASE lowerings (its
 * leases will commit where no bump runs).
 */
void
pgq_bounds_at_prepare(void)
{
	PgqDbSlot  *slot;
	PgqBoundState *st;
	TransactionId xid = GetTopTransactionIdIfAny();
	int			i;

	if (!pending[PGQ_BOUND_LEASE] || !TransactionIdIsValid(xid) ||
		(slot = pgq_my_slot()) == NULL)
		return;
	st = &slot->bounds[PGQ_BOUND_LEASE];
	SpinLockAcquire(&slot->bound_mutex);
	for (i = 0; i < PGQ_MEMO_PREPARED; i++)
		if (!TransactionIdIsValid(st->memo_prepared[i]))
			break;
	if (i < PGQ_MEMO_PREPARED)
		st->memo_prepared[i] = xid;
	else
		st->memo_prepared_lost = true;
	st->memo_gen++;
	SpinLockRelease(&slot->bound_mutex);
}

/*
 * Rule 8: a LEASE walk filtered by queues, begun with pgq_bound_begin and
 * not skipped, starts at the session's own start for the same queues when
 * there is one, still good, above scan->start; it then raises nothing.
 */
void
pgq_bound_memo_apply(PgqScan *scan, ArrayType *queues)
{
	Assert(scan->id == PGQ_BOUND_LEASE && queues != NULL);
	if (scan->full || !scan->memo_ok || !pgq_memo_for(queues) ||
		memo.gen != scan->memo_gen || memo.passed < PGQ_MEMO_MIN ||
		pgq_key_cmp(&memo.start, &scan->start) <= 0 ||
		!pgq_memo_no_prepared())
		return;
	scan->start = memo.start;
	scan->from_memo = true;
	scan->raise = false;
}

/*
 * Rule 8: a filtered LEASE walk saw no lease of queues in [scan->start,
 * upto) and passed that many of other queues: keep upto as the session's
 * start for queues when the walks behind it passed PGQ_MEMO_MIN or more.
 */
void
pgq_bound_memo_store(PgqScan *scan, ArrayType *queues, PgqKey upto, int64 passed)
{
	if (!scan->memo_ok || pgq_my_slot() == NULL)
		return;
	if (scan->from_memo)
		passed += memo.passed;
	if (passed < PGQ_MEMO_MIN)
	{
		memo.passed = 0;	/* not worth a start of its own */
		return;
	}
	if (!pgq_memo_for(queues))
	{
		if (memo.queues != NULL)
			pfree(memo.queues);
		memo.queues = MemoryContextAlloc(TopMemoryContext, VARSIZE(queues));
		memcpy(memo.queues, queues, VARSIZE(queues));
	}
	memo.start = upto;
	memo.gen = scan->memo_gen;
	memo.passed = passed;
}

/* Rule 3: lower bound id to key when the current transaction commits. */
void
pgq_bound_lower_at_commit(PgqBoundId id, PgqKey key)
{
	if (!pending[id] || pgq_key_cmp(&key, &pending_low[id]) < 0)
		pending_low[id] = key;
	pending[id] = true;
}

/* Rule 4: the current transaction changed bound id's index. */
void
pgq_bound_hold(PgqBoundId id)
{
	held[id] = true;
}

/*
 * At the end of the transaction (publish.c's callback): at commit apply the
 * lowerings (rule 3), then forget them and the holds.
 */
void
pgq_bounds_at_xact_end(bool commit)
{
	PgqDbSlot  *slot = NULL;
	int			b;

	for (b = 0; b < PGQ_NUM_BOUNDS; b++)
	{
		if (commit && pending[b] &&
			(slot != NULL || (slot = pgq_my_slot()) != NULL))
		{
			PgqBoundState *st = &slot->bounds[b];

			SpinLockAcquire(&slot->bound_mutex);
			if (pgq_key_cmp(&pending_low[b], &st->bound) < 0)
				st->bound = pending_low[b];
			if (pgq_key_cmp(&pending_low[b], &st->low) < 0)
				st->low = pending_low[b];
			/* rule 8: a lease that ran out before its commit */
			if (b == PGQ_BOUND_LEASE && pending_low[b].hi == 0 &&
				pending_low[b].lo < GetCurrentTimestamp())
				st->memo_gen++;
			SpinLockRelease(&slot->bound_mutex);
		}
		pending[b] = false;
		held[b] = false;
	}
}
