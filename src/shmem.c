/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		Shared memory of pgqueue: cumulative counters, one slot per database
 *		(its scheduler's latch and the condition variable blocking claims
 *		sleep on), and the transaction callback that publishes a
 *		transaction's counts and wake-ups when, and only when, it commits.
 *
 * Wake-on-commit uses no LISTEN/NOTIFY: NOTIFY serializes committers on a
 * global lock.  A committing backend sets the latch of its database's
 * scheduler (new jobs to schedule) and/or broadcasts the condition variable
 * (new claimable jobs).  A rolled-back transaction publishes nothing.
 *
 * All of this exists only when the library is in shared_preload_libraries;
 * otherwise the functions here do nothing (blocking claims then poll).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "pgqueue.h"

PG_FUNCTION_INFO_V1(pgq_counters);

/* Waiting claims without shared memory poll this often. */
#define PGQ_POLL_MS 100

/*
 * Slots: the first PGQ_MAX_DATABASES are reserved for the databases of
 * pgqueue.database, by their index there, so that a scheduler always finds
 * one; the PGQ_SHARED_SLOTS after them go to other databases on first use
 * (blocking claims there poll once they are all taken).
 */
#define PGQ_SHARED_SLOTS 64
#define PGQ_DB_SLOTS (PGQ_MAX_DATABASES + PGQ_SHARED_SLOTS)

typedef struct PgqDbSlot
{
	Oid			dboid;			/* InvalidOid: free */
	int			scheduler_procno;	/* pgprocno of its scheduler, or -1 */
	ConditionVariable work_cv;	/* claims of this database sleep here */
	pg_atomic_uint32 filtered_waiters;	/* of them, claims with a queues filter */
	slock_t		hint_mutex;		/* protects the hint fields */
	TimestampTz hint_bound[PGQ_NUM_HINTS];	/* see pgq_hint_get */
	uint64		hint_epoch[PGQ_NUM_HINTS];	/* bumped by every lowering */
	TimestampTz hint_next_full[PGQ_NUM_HINTS];	/* when a full scan is due */
	PgqReadyKey sched_bound;	/* see pgq_sched_bound_get */
	PgqReadyKey sched_low;		/* lowest lowering since the last set */
	uint64		sched_sets;		/* bumped by every set */
	TimestampTz sched_next_full;	/* when a full pass is due */
} PgqDbSlot;

typedef struct PgqShared
{
	slock_t		mutex;			/* protects slots[] and db_known[] */
	TimestampTz stats_reset;
	pg_atomic_uint64 counters[PGQ_NUM_COUNTERS];
	bool		db_known[PGQ_MAX_DATABASES];	/* see worker.c */
	PgqDbSlot	slots[PGQ_DB_SLOTS];
} PgqShared;

static PgqShared *pgq_shared = NULL;
static PgqDbSlot *my_slot = NULL;	/* slot of MyDatabaseId, once looked up */

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* What the current transaction will publish if it commits. */
static int64 pending_counts[PGQ_NUM_COUNTERS];
static bool pending_any = false;
static int	pending_wake = 0;
static int64 pending_claimable = 0;	/* jobs made claimable, if counted */

/*
 * pending_counts as they were when each open subtransaction started, newest
 * first, so that a rolled-back subtransaction (ROLLBACK TO, a PL/pgSQL
 * exception block) publishes nothing either.  Lives in TopTransactionContext.
 */
typedef struct PgqSubCounts
{
	SubTransactionId subid;
	int64		counts[PGQ_NUM_COUNTERS];
	struct PgqSubCounts *next;
} PgqSubCounts;

static PgqSubCounts *sub_counts = NULL;

/* Hint lowerings the current transaction owes at commit; DT_NOEND: none. */
static TimestampTz pending_lower[PGQ_NUM_HINTS] = {DT_NOEND, DT_NOEND};

/* The current transaction claimed or extended: see pgq_hint_hold. */
static bool hints_held = false;

/* Lowering of the scheduling bound owed at commit; valid if sched_pending. */
static PgqReadyKey sched_pending_low;
static bool sched_pending = false;

/* The current transaction moved jobs: see pgq_sched_moved. */
static bool sched_moved = false;

static void pgq_shmem_request(void);
static void pgq_shmem_startup(void);
static void pgq_xact_callback(XactEvent event, void *arg);
static void pgq_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);
static PgqDbSlot *pgq_my_slot(void);
static void pgq_broadcast_claimers(void);
static void pgq_scheduler_detach(int code, Datum arg);
static void pgq_hints_reset(PgqDbSlot *slot);
static void pgq_hints_apply(bool commit);

/* Install the shared memory hooks; called from _PG_init when preloading. */
void
pgq_shmem_install_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = pgq_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = pgq_shmem_startup;
}

static void
pgq_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(PgqShared)));
}

/* Create or attach to the shared struct. */
static void
pgq_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	pgq_shared = ShmemInitStruct("pgqueue", sizeof(PgqShared), &found);
	if (!found)
	{
		int			i;

		SpinLockInit(&pgq_shared->mutex);
		pgq_shared->stats_reset = GetCurrentTimestamp();
		for (i = 0; i < PGQ_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&pgq_shared->counters[i], 0);
		for (i = 0; i < PGQ_MAX_DATABASES; i++)
			pgq_shared->db_known[i] = false;
		for (i = 0; i < PGQ_DB_SLOTS; i++)
		{
			pgq_shared->slots[i].dboid = InvalidOid;
			pgq_shared->slots[i].scheduler_procno = -1;
			ConditionVariableInit(&pgq_shared->slots[i].work_cv);
			pg_atomic_init_u32(&pgq_shared->slots[i].filtered_waiters, 0);
			SpinLockInit(&pgq_shared->slots[i].hint_mutex);
			pgq_hints_reset(&pgq_shared->slots[i]);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * The slot of the current database.  When no slot has it yet, a scheduler
 * (reserved >= 0: its index in pgqueue.database) takes its reserved slot and
 * any other backend a free shared one.  NULL without shared memory or when
 * every shared slot is taken (then claims poll).  The caller holds no lock.
 */
static PgqDbSlot *
pgq_find_slot(int reserved)
{
	int			i;
	PgqDbSlot  *found = NULL;

	SpinLockAcquire(&pgq_shared->mutex);
	for (i = 0; i < PGQ_DB_SLOTS && found == NULL; i++)
		if (pgq_shared->slots[i].dboid == MyDatabaseId)
			found = &pgq_shared->slots[i];
	if (found == NULL && reserved >= 0 && reserved < PGQ_MAX_DATABASES)
		found = &pgq_shared->slots[reserved];
	for (i = PGQ_MAX_DATABASES; i < PGQ_DB_SLOTS && found == NULL; i++)
		if (pgq_shared->slots[i].dboid == InvalidOid)
			found = &pgq_shared->slots[i];
	if (found != NULL && found->dboid != MyDatabaseId)
	{
		found->dboid = MyDatabaseId;
		pgq_hints_reset(found);
	}
	SpinLockRelease(&pgq_shared->mutex);
	return found;
}

/* The slot of the current database for an ordinary backend, or NULL. */
static PgqDbSlot *
pgq_my_slot(void)
{
	if (my_slot == NULL && pgq_shared != NULL && OidIsValid(MyDatabaseId))
		my_slot = pgq_find_slot(-1);
	return my_slot;
}

/* ----------------------------------------------------------------
 * Counters
 * ----------------------------------------------------------------
 */

/* Add n to a counter when the current transaction commits. */
void
pgq_count(PgqCounter counter, int64 n)
{
	if (n == 0)
		return;
	pending_counts[counter] += n;
	pending_any = true;
}

/* Add n to a counter now, whatever becomes of the transaction. */
void
pgq_count_now(PgqCounter counter, int64 n)
{
	if (pgq_shared != NULL)
		pg_atomic_fetch_add_u64(&pgq_shared->counters[counter], n);
}

/*
 * pgq_counters() returns table
 *
 * The counters since server start, one row.
 */
Datum
pgq_counters(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		values[PGQ_NUM_COUNTERS + 1];
	bool		nulls[PGQ_NUM_COUNTERS + 1] = {0};
	int			i;

	if (pgq_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgqueue must be loaded via shared_preload_libraries to keep counters"),
				 errhint("Add pgqueue to shared_preload_libraries in postgresql.conf and restart the server.")));

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	for (i = 0; i < PGQ_NUM_COUNTERS; i++)
		values[i] = Int64GetDatum((int64) pg_atomic_read_u64(&pgq_shared->counters[i]));
	values[PGQ_NUM_COUNTERS] = TimestampTzGetDatum(pgq_shared->stats_reset);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * Wake-ups
 * ----------------------------------------------------------------
 */

/*
 * Ask for a wake-up when the current transaction ends: PGQ_WAKE_SCHEDULER
 * and PGQ_WAKE_CLAIMERS at commit, PGQ_WAKE_ON_ABORT (claimers) at abort.
 */
void
pgq_wake_at_commit(int what)
{
	pending_wake |= what;
}

/*
 * Ask that n waiting claims be woken at commit: the scheduling pass made n
 * jobs claimable.  Waking them all (PGQ_WAKE_CLAIMERS) would make every
 * waiter but n look in vain.
 */
void
pgq_claimable_at_commit(int64 n)
{
	pending_claimable += n;
}

/*
 * At commit: wake one waiting claim per job made claimable, or all of them
 * when some wait with a queues filter (a claim woken for a job it does not
 * take would leave it to sleep), when the count is large, or when it is not
 * known (PGQ_WAKE_CLAIMERS).
 */
static void
pgq_signal_claimers(PgqDbSlot *slot)
{
	if ((pending_wake & PGQ_WAKE_CLAIMERS) || pending_claimable > 32 ||
		pg_atomic_read_u32(&slot->filtered_waiters) > 0)
		ConditionVariableBroadcast(&slot->work_cv);
	else
	{
		int64		i;

		for (i = 0; i < pending_claimable; i++)
			ConditionVariableSignal(&slot->work_cv);
	}
}

/* Wake the claims of this database that wait for work. */
static void
pgq_broadcast_claimers(void)
{
	PgqDbSlot  *slot = pgq_my_slot();

	if (slot != NULL)
		ConditionVariableBroadcast(&slot->work_cv);
}

/*
 * Register the transaction callback; every backend that loads the library
 * does this once, from _PG_init.
 */
void
pgq_xact_callbacks_register(void)
{
	RegisterXactCallback(pgq_xact_callback, NULL);
	RegisterSubXactCallback(pgq_subxact_callback, NULL);
}

/*
 * At commit, publish the counts and wake-ups the transaction collected; at
 * abort or prepare, drop them.  Called after the commit is visible to other
 * transactions, so a woken process sees the new rows.
 */
static void
pgq_xact_callback(XactEvent event, void *arg)
{
	int			i;

	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT)
	{
		pgq_hints_apply(true);
		if (pgq_shared != NULL)
		{
			PgqDbSlot  *slot;

			if (pending_any)
				for (i = 0; i < PGQ_NUM_COUNTERS; i++)
					if (pending_counts[i] != 0)
						pg_atomic_fetch_add_u64(&pgq_shared->counters[i],
												pending_counts[i]);

			if ((pending_wake != 0 || pending_claimable > 0) &&
				(slot = pgq_my_slot()) != NULL)
			{
				if (pending_wake & PGQ_WAKE_SCHEDULER)
				{
					int			procno = slot->scheduler_procno;

					if (procno >= 0)
						SetLatch(&ProcGlobal->allProcs[procno].procLatch);
				}
				if ((pending_wake & PGQ_WAKE_CLAIMERS) || pending_claimable > 0)
					pgq_signal_claimers(slot);
			}
		}
	}
	else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
	{
		/*
		 * A claim (or ack, nack...) that rolls back unlocks work_queue rows
		 * that a waiting claim skipped: let it look again.
		 */
		pgq_hints_apply(false);
		if (pending_wake & PGQ_WAKE_ON_ABORT)
			pgq_broadcast_claimers();
	}
	else if (event == XACT_EVENT_PREPARE)
		pgq_hints_apply(false); /* see the comment of the scan hints */
	else
		return;

	/* commit, abort or prepare: start afresh */
	if (pending_any)
		memset(pending_counts, 0, sizeof(pending_counts));
	pending_any = false;
	pending_wake = 0;
	pending_claimable = 0;
	sub_counts = NULL;			/* freed with TopTransactionContext */
}

/*
 * Remember the counts at the start of a subtransaction; put them back if it
 * aborts.  (Wake-ups are not undone: a spurious one costs only a look.)
 */
static void
pgq_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	PgqSubCounts *s;

	if (event == SUBXACT_EVENT_START_SUB)
	{
		s = MemoryContextAlloc(TopTransactionContext, sizeof(PgqSubCounts));
		s->subid = mySubid;
		memcpy(s->counts, pending_counts, sizeof(pending_counts));
		s->next = sub_counts;
		sub_counts = s;
	}
	else if ((event == SUBXACT_EVENT_COMMIT_SUB || event == SUBXACT_EVENT_ABORT_SUB) &&
			 sub_counts != NULL && sub_counts->subid == mySubid)
	{
		s = sub_counts;
		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			memcpy(pending_counts, s->counts, sizeof(pending_counts));
			if (pending_wake & PGQ_WAKE_ON_ABORT)
				pgq_broadcast_claimers();
		}
		sub_counts = s->next;
		pfree(s);
	}
}

/*
 * Make the calling scheduler the one whose latch committers of its database
 * set.  Called once by the scheduler after it connected; dbindex is its
 * index in pgqueue.database, whose reserved slot it takes if no backend
 * of the database took a shared one first.
 */
void
pgq_scheduler_attach(int dbindex)
{
	my_slot = pgq_find_slot(dbindex);
	my_slot->scheduler_procno = MyProc->pgprocno;
	before_shmem_exit(pgq_scheduler_detach, (Datum) 0);
}

static void
pgq_scheduler_detach(int code, Datum arg)
{
	if (my_slot != NULL && my_slot->scheduler_procno == MyProc->pgprocno)
		my_slot->scheduler_procno = -1;
}

/*
 * Whether the scheduler of the database with index dbindex in
 * pgqueue.database has seen its database exist (see worker.c); set or
 * read it.
 */
bool
pgq_db_known(int dbindex, int set)
{
	bool		result;

	if (pgq_shared == NULL || dbindex < 0 || dbindex >= PGQ_MAX_DATABASES)
		return false;
	SpinLockAcquire(&pgq_shared->mutex);
	if (set >= 0)
		pgq_shared->db_known[dbindex] = (set > 0);
	result = pgq_shared->db_known[dbindex];
	SpinLockRelease(&pgq_shared->mutex);
	return result;
}

/*
 * Prepare to sleep for work in pgq_wait_for_work.  Call before looking for
 * work, so that a broadcast between the look and the sleep is not missed.
 */
void
pgq_prepare_wait(bool filtered)
{
	PgqDbSlot  *slot = pgq_my_slot();

	if (slot != NULL)
	{
		if (filtered)
			pg_atomic_fetch_add_u32(&slot->filtered_waiters, 1);
		ConditionVariablePrepareToSleep(&slot->work_cv);
	}
}

/*
 * Sleep until a committing transaction of this database publishes new
 * claimable work, or until the time until, whichever is first.  Without
 * shared memory, sleep at most PGQ_POLL_MS (the caller polls).  Interrupts
 * (cancel, statement_timeout, terminate) are served.
 */
void
pgq_wait_for_work(TimestampTz until)
{
	PgqDbSlot  *slot = pgq_my_slot();
	TimestampTz now = GetCurrentTimestamp();
	long		timeout_ms;

	if (until <= now)
		return;
	timeout_ms = (long) ((until - now + 999) / 1000);

	if (slot != NULL)
	{
		ConditionVariableTimedSleep(&slot->work_cv, timeout_ms, PG_WAIT_EXTENSION);
		return;
	}

	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 Min(timeout_ms, PGQ_POLL_MS), PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

/*
 * Stop waiting (after the claim loop, also when it failed); filtered as
 * given to pgq_prepare_wait.
 */
void
pgq_end_wait(bool filtered)
{
	PgqDbSlot  *slot = pgq_my_slot();

	ConditionVariableCancelSleep();
	if (slot != NULL && filtered)
		pg_atomic_fetch_sub_u32(&slot->filtered_waiters, 1);
}

/* ----------------------------------------------------------------
 * Scan hints
 *
 * Rows leave the heads of work_queue's ready index (claimed) and lease
 * index (acked) all the time.  Their index entries stay until VACUUM: while
 * an old snapshot holds the xmin horizon back they cannot even be marked
 * dead, and in between two VACUUMs the emptied leaf pages stay in the
 * index.  A claim that started each walk at the left end of the index would
 * step over all of them, so the scans start at a lower bound kept here per
 * database:
 *
 * PGQ_HINT_READY: no never-claimed (or released) row has created < bound.
 * PGQ_HINT_LEASE: no row has an expired lease with lock_timeout < bound.
 *
 * A scan reads the bound and its epoch before taking its snapshot, and
 * sets the bound only if no lowering happened since (pgq_hint_set).  It
 * never sets it past a row it saw as a candidate but could not lock: the
 * holder's rollback would make that row claimable again.  A transaction
 * that makes rows fall under the bound lowers it when it commits
 * (pgq_hint_lower_at_commit), after its changes are visible, bumping the
 * epoch: a scheduling pass inserting rows, a release; for leases a claim or
 * extend whose lease had already run out when it committed.  A rolled-back
 * claim needs nothing: while it held its rows every other scan stopped at
 * them, and its own later scans, which see its changes, set no bound
 * (pgq_hint_hold).
 *
 * The bound only tells where to start, never whether a row may be taken.
 * What it misses, rows made claimable behind the API's back (a manual
 * UPDATE of work_queue) or by a PREPAREd transaction committed later, is
 * found by the next full scan: one is due PGQ_HINT_CHECK_MS after the last,
 * later while they are slow (pgq_full_due).
 * ----------------------------------------------------------------
 */

#define PGQ_HINT_CHECK_MS 1000
#define PGQ_HINT_NO_SET PG_UINT64_MAX	/* an epoch that never matches */

/*
 * A full scan walks every entry VACUUM has not removed yet: while an old
 * snapshot holds VACUUM back, that is every row claimed (or scheduled)
 * since, each a heap fetch.  So one backend at a time does it (it claims
 * the check when it starts), and the next one is due no sooner than
 * PGQ_FULL_COST times as long as the last took, at most PGQ_HINT_MAX_MS:
 * full scans cost at most 1/PGQ_FULL_COST of one process's time.
 */
#define PGQ_FULL_COST 20
#define PGQ_HINT_MAX_MS 30000

/* When this backend started the full scan of hint h (PGQ_NUM_HINTS: sched) */
static TimestampTz full_started[PGQ_NUM_HINTS + 1];

/*
 * Is a full scan due?  If so, the caller does it: the next one is put off
 * for now.  Called under hint_mutex.
 */
static bool
pgq_full_due(TimestampTz *next_full, int h, TimestampTz now)
{
	if (now < *next_full && *next_full - now <= PGQ_HINT_MAX_MS * INT64CONST(1000))
		return false;
	*next_full = now + PGQ_HINT_CHECK_MS * INT64CONST(1000);
	full_started[h] = now;
	return true;
}

/* The full scan started by pgq_full_due is done.  Called under hint_mutex. */
static void
pgq_full_done(TimestampTz *next_full, int h, TimestampTz now)
{
	int64		wait = Max(now - full_started[h], 0) * PGQ_FULL_COST;

	wait = Max(wait, PGQ_HINT_CHECK_MS * INT64CONST(1000));
	wait = Min(wait, PGQ_HINT_MAX_MS * INT64CONST(1000));
	*next_full = now + wait;
}

static void
pgq_hints_reset(PgqDbSlot *slot)
{
	int			h;

	for (h = 0; h < PGQ_NUM_HINTS; h++)
	{
		slot->hint_bound[h] = DT_NOBEGIN;
		slot->hint_epoch[h] = 0;
		slot->hint_next_full[h] = 0;
	}
	slot->sched_bound.np = PG_INT64_MIN;
	slot->sched_bound.ra = DT_NOBEGIN;
	slot->sched_low.np = PG_INT64_MAX;
	slot->sched_low.ra = DT_NOEND;
	slot->sched_sets = 0;
	slot->sched_next_full = 0;
}

/*
 * Read hint h: returns false when a full scan is due (no shared memory, or
 * see pgq_full_due); *bound is then DT_NOBEGIN.  *epoch is for
 * pgq_hint_set.  A caller that will not set the bound (claim_full false)
 * does not take the full scan on itself: it walks from the start while one
 * is due.
 */
bool
pgq_hint_get(PgqHint h, TimestampTz *bound, uint64 *epoch, bool claim_full)
{
	PgqDbSlot  *slot = pgq_my_slot();
	TimestampTz now;
	bool		valid;

	*bound = DT_NOBEGIN;
	*epoch = 0;
	if (slot == NULL)
		return false;
	/* a scan that will set no bound does not take the full scan on itself */
	if (pending_lower[h] != DT_NOEND || hints_held)
		claim_full = false;
	now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->hint_mutex);
	*epoch = slot->hint_epoch[h];
	if (claim_full)
		valid = !pgq_full_due(&slot->hint_next_full[h], h, now);
	else
		valid = now < slot->hint_next_full[h];
	if (valid)
		*bound = slot->hint_bound[h];
	SpinLockRelease(&slot->hint_mutex);

	/*
	 * This transaction's own rows under the bound are visible to it before
	 * it commits: start below them, and leave the bound alone.
	 */
	if (pending_lower[h] != DT_NOEND)
	{
		*bound = Min(*bound, pending_lower[h]);
		*epoch = PGQ_HINT_NO_SET;
	}
	if (hints_held)
		*epoch = PGQ_HINT_NO_SET;
	return valid;
}

/*
 * Set hint h to bound, found by a scan that read epoch (pgq_hint_get)
 * before its snapshot, unless a lowering came in between.  full: the scan
 * started at the beginning of the index.
 */
void
pgq_hint_set(PgqHint h, TimestampTz bound, uint64 epoch, bool full)
{
	PgqDbSlot  *slot = pgq_my_slot();
	TimestampTz now;

	if (slot == NULL)
		return;
	now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->hint_mutex);
	if (slot->hint_epoch[h] == epoch)
	{
		slot->hint_bound[h] = bound;
		if (full)
			pgq_full_done(&slot->hint_next_full[h], h, now);
	}
	SpinLockRelease(&slot->hint_mutex);
}

/*
 * The current transaction took rows (claimed, stole, extended) that a
 * rollback would put back below a bound its own later scans pass (they see
 * its changes, which nobody else does): until it ends, its scans set no
 * bound.
 */
void
pgq_hint_hold(void)
{
	hints_held = true;
}

/* Lower hint h to bound when the current transaction commits. */
void
pgq_hint_lower_at_commit(PgqHint h, TimestampTz bound)
{
	if (bound < pending_lower[h])
		pending_lower[h] = bound;
}

/*
 * At the end of the transaction: apply the lowerings if it committed.  A
 * lease lowering matters only when the lease already ran out: a scan that
 * set the bound past it took its snapshot before this commit, and sets the
 * bound no later than its own start time.
 */
static void
pgq_hints_apply(bool commit)
{
	PgqDbSlot  *slot;
	int			h;

	hints_held = false;
	sched_moved = false;
	if (sched_pending)
	{
		sched_pending = false;
		if (commit && (slot = pgq_my_slot()) != NULL)
		{
			SpinLockAcquire(&slot->hint_mutex);
			if (pgq_key_cmp(&sched_pending_low, &slot->sched_bound) < 0)
				slot->sched_bound = sched_pending_low;
			if (pgq_key_cmp(&sched_pending_low, &slot->sched_low) < 0)
				slot->sched_low = sched_pending_low;
			SpinLockRelease(&slot->hint_mutex);
		}
	}
	for (h = 0; h < PGQ_NUM_HINTS; h++)
	{
		TimestampTz low = pending_lower[h];

		pending_lower[h] = DT_NOEND;
		if (!commit || low == DT_NOEND ||
			(h == PGQ_HINT_LEASE && low >= GetCurrentTimestamp()) ||
			(slot = pgq_my_slot()) == NULL)
			continue;
		SpinLockAcquire(&slot->hint_mutex);
		if (low < slot->hint_bound[h])
			slot->hint_bound[h] = low;
		slot->hint_epoch[h]++;
		SpinLockRelease(&slot->hint_mutex);
	}
}

/* ----------------------------------------------------------------
 * The scheduling bound
 *
 * The same idea for the scheduling pass's walks of queue_ready_idx
 * (queue, -priority, run_after, id): every job a pass moves leaves a dead
 * entry at the head of its queue's range, where the next pass would step
 * over it (and, while an old snapshot holds VACUUM back, fetch its heap
 * tuple to find it dead).  The bound is a key (-priority, run_after) below
 * which no queue has a pending or retry job; passes walk each queue from
 * (queue, bound) on.
 *
 * A pass finds the new bound in the same statement that moves the jobs:
 * the smallest key over the first ready job of every queue, as its snapshot
 * sees them (before its own moves, so that a rollback of the pass puts
 * nothing below it), whether due, paused, capped or locked by another pass.
 * Jobs can also appear below it: a push with a higher priority or an older
 * run_after, a nack that sets retry.  Those transactions lower the bound
 * when they commit (pgq_sched_lower_at_commit), and also keep the lowest
 * such key since the last set in sched_low: a set takes the smaller of what
 * its pass found and sched_low, so a job committed after the pass's
 * snapshot (invisible to it) is never passed.  A set is refused when
 * another set came in between (sched_sets), when the pass's snapshot is
 * the transaction's (it may predate lowerings already folded into the
 * bound) and once the transaction has moved jobs (its later passes see
 * them gone; a rollback would bring them back).  Jobs made ready behind the
 * API's back are found by the next full pass (pgq_full_due).
 * ----------------------------------------------------------------
 */

int
pgq_key_cmp(const PgqReadyKey *a, const PgqReadyKey *b)
{
	if (a->np != b->np)
		return a->np < b->np ? -1 : 1;
	if (a->ra != b->ra)
		return a->ra < b->ra ? -1 : 1;
	return 0;
}

/*
 * Read the scheduling bound: returns false when a full pass is due; *bound
 * is then the lowest key.  *ticket is for pgq_sched_bound_set.
 */
bool
pgq_sched_bound_get(PgqReadyKey *bound, uint64 *ticket)
{
	PgqDbSlot  *slot = pgq_my_slot();
	TimestampTz now;
	bool		valid;
	bool		can_set;

	bound->np = PG_INT64_MIN;
	bound->ra = DT_NOBEGIN;
	*ticket = PGQ_HINT_NO_SET;
	if (slot == NULL)
		return false;
	can_set = !sched_moved && !IsolationUsesXactSnapshot();
	now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->hint_mutex);
	*ticket = can_set ? slot->sched_sets : PGQ_HINT_NO_SET;
	if (can_set)
		valid = !pgq_full_due(&slot->sched_next_full, PGQ_NUM_HINTS, now);
	else
		valid = now < slot->sched_next_full;
	if (valid)
		*bound = slot->sched_bound;
	SpinLockRelease(&slot->hint_mutex);

	/* its own jobs are visible to it before it commits */
	if (sched_pending && pgq_key_cmp(&sched_pending_low, bound) < 0)
		*bound = sched_pending_low;
	return valid;
}

/*
 * Set the scheduling bound to found, what a pass that read ticket
 * (pgq_sched_bound_get) before its snapshot saw, or lower.  full: the pass
 * walked from the start of every queue.
 */
void
pgq_sched_bound_set(const PgqReadyKey *found, uint64 ticket, bool full)
{
	PgqDbSlot  *slot = pgq_my_slot();
	TimestampTz now;

	if (slot == NULL || ticket == PGQ_HINT_NO_SET)
		return;
	now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->hint_mutex);
	if (slot->sched_sets == ticket)
	{
		slot->sched_bound = *found;
		if (pgq_key_cmp(&slot->sched_low, found) < 0)
			slot->sched_bound = slot->sched_low;
		slot->sched_low.np = PG_INT64_MAX;
		slot->sched_low.ra = DT_NOEND;
		slot->sched_sets++;
		if (full)
			pgq_full_done(&slot->sched_next_full, PGQ_NUM_HINTS, now);
	}
	SpinLockRelease(&slot->hint_mutex);
}

/*
 * A job with key (-priority, run_after) becomes pending or retry when the
 * current transaction commits.
 */
void
pgq_sched_lower_at_commit(int64 np, TimestampTz ra)
{
	PgqReadyKey k;

	k.np = np;
	k.ra = ra;
	if (!sched_pending || pgq_key_cmp(&k, &sched_pending_low) < 0)
		sched_pending_low = k;
	sched_pending = true;
}

/* The current transaction moved jobs to work_queue: it sets no bound now. */
void
pgq_sched_moved(void)
{
	sched_moved = true;
}
