/*-------------------------------------------------------------------------
 *
 * publish.c
 *		What a transaction publishes when, and only when, it commits: its
 *		counts (the cumulative counters), its wake-ups (the scheduler's
 *		latch, the condition variable blocking claims sleep on) and its
 *		lowerings of the scan bounds (bounds.c).  Also the sleep of a
 *		blocking claim, and pgq_counters().
 *
 * Wake-on-commit uses no LISTEN/NOTIFY: NOTIFY serializes committers on a
 * global lock.  A committing backend sets the latch of its database's
 * scheduler (new jobs to schedule) and/or signals the condition variable
 * (new claimable jobs).  A rolled-back transaction publishes nothing, but
 * wakes waiting claims if it held rows they skipped.
 *
 * Without shared memory (the library not preloaded) nothing is published
 * and blocking claims poll.
 *
 * Layer 2 of src/README (shared memory and wake-ups): it may call the
 * other files of its layer and common.c.  The one step of a layer above
 * that the transaction callback runs, the scheduling pass's
 * (schedule.c), it calls through the pointer _PG_init registers.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "shmem_internal.h"

PG_FUNCTION_INFO_V1(pgq_counters);

/* Waiting claims without shared memory poll this often. */
#define PGQ_POLL_MS 100

/* What the current transaction will publish if it commits. */
static int64 pending_counts[PGQ_NUM_COUNTERS];
static bool pending_any = false;
static int	pending_wake = 0;
static int64 pending_claimable = 0;	/* jobs made claimable, if counted */

/*
 * pending_counts as they were when a subtransaction that counted something
 * began, innermost first, so that a rolled-back subtransaction (ROLLBACK TO,
 * a PL/pgSQL exception block) publishes nothing either.  Made only by
 * pgq_count, so savepoints that do no queue work cost nothing.  Lives in
 * TopTransactionContext.
 */
typedef struct PgqSubCounts
{
	SubTransactionId subid;
	int64		counts[PGQ_NUM_COUNTERS];
	struct PgqSubCounts *next;
} PgqSubCounts;

static PgqSubCounts *sub_counts = NULL;

/*
 * Queues this transaction made work ready in (pgq_ready_at_commit), written
 * to the database's ring of notes at commit; more than PGQ_READY_NAMES
 * distinct ones are written as one note meaning "every queue".
 */
#define PGQ_READY_NAMES 8
static char pending_ready[PGQ_READY_NAMES][PGQ_MAX_NAME_BYTES + 1];
static PgqKey pending_ready_key[PGQ_READY_NAMES];
static uint32 pending_ready_slots[PGQ_READY_NAMES];
static int	pending_nready = 0;
static bool pending_ready_all = false;
static bool pending_settings = false;

/*
 * What the scheduling pass does at the end of every transaction
 * (schedule.c, pgq_schedule_at_xact_end): a layer above this one, so
 * given to pgq_xact_callbacks_register rather than called by name.
 */
static PgqXactEndCallback xact_end_callback = NULL;

/* The blocking claim of this backend, while it waits (see pgq_prepare_wait). */
static bool waiting = false;
static bool waiting_filtered = false;
static bool wait_exit_registered = false;

static void pgq_xact_callback(XactEvent event, void *arg);
static void pgq_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);
static void pgq_broadcast_claimers(void);
static void pgq_wait_exit(int code, Datum arg);

/* ----------------------------------------------------------------
 * Counters
 * ----------------------------------------------------------------
 */

/* Add n to a counter when the current transaction commits. */
void
pgq_count(PgqCounter counter, int64 n)
{
	SubTransactionId subid;

	if (n == 0)
		return;
	subid = GetCurrentSubTransactionId();
	if (subid != TopSubTransactionId &&
		(sub_counts == NULL || sub_counts->subid != subid))
	{
		PgqSubCounts *s = MemoryContextAlloc(TopTransactionContext, sizeof(PgqSubCounts));

		s->subid = subid;
		memcpy(s->counts, pending_counts, sizeof(pending_counts));
		s->next = sub_counts;
		sub_counts = s;
	}
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
	{
		elog(DEBUG1, "pgqueue: waking every waiting claim");
		ConditionVariableBroadcast(&slot->work_cv);
	}
	else
	{
		int64		i;

		elog(DEBUG1, "pgqueue: waking " INT64_FORMAT " waiting claims", pending_claimable);
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
 * A job of queue becomes ready (pending or retry) with key (-priority,
 * run_after) when the current transaction commits, its row in one of the
 * slots of pgqueue.queue in the mask slots (PGQ_SLOT_BIT; PGQ_ALL_SLOTS
 * when not known): the SCHED bound is lowered to the key (bounds.c) and
 * the scheduling processes are told the queue and the slots (schedule.c
 * reads the notes).
 */
void
pgq_ready_at_commit(text *queue, PgqKey key, uint32 slots)
{
	int			len = VARSIZE_ANY_EXHDR(queue);
	int			i;

	pgq_bound_lower_at_commit(PGQ_BOUND_SCHED, key);
	if (pending_ready_all)
		return;
	if (len > PGQ_MAX_NAME_BYTES)
	{
		pending_ready_all = true;
		return;
	}
	for (i = 0; i < pending_nready; i++)
		if (strlen(pending_ready[i]) == len &&
			memcmp(pending_ready[i], VARDATA_ANY(queue), len) == 0)
		{
			if (pgq_key_cmp(&key, &pending_ready_key[i]) < 0)
				pending_ready_key[i] = key;
			pending_ready_slots[i] |= slots;
			return;
		}
	if (pending_nready == PGQ_READY_NAMES)
	{
		pending_ready_all = true;
		return;
	}
	memcpy(pending_ready[pending_nready], VARDATA_ANY(queue), len);
	pending_ready[pending_nready][len] = '\0';
	pending_ready_key[pending_nready] = key;
	pending_ready_slots[pending_nready] = slots;
	pending_nready++;
}

/* The current transaction changes queue settings (pgqueue.queues). */
void
pgq_settings_changed_at_commit(void)
{
	pending_settings = true;
}

/* Write the transaction's ready queues to the ring of notes (at commit). */
static void
pgq_write_ready_notes(PgqDbSlot *slot)
{
	int			n = pending_ready_all ? 1 : pending_nready;
	int			i;

	SpinLockAcquire(&slot->ready_mutex);
	for (i = 0; i < n; i++)
	{
		PgqReadyNote *note = &slot->ready[slot->ready_seq % PGQ_READY_RING];

		slot->ready_seq++;
		note->seq = slot->ready_seq;
		if (pending_ready_all)
			note->queue[0] = '\0';
		else
		{
			strcpy(note->queue, pending_ready[i]);
			note->key = pending_ready_key[i];
			note->slots = pending_ready_slots[i];
		}
	}
	SpinLockRelease(&slot->ready_mutex);
}

/*
 * The notes written after note number *pos (the caller's position, 0 at
 * first): their queue names, keys and slot masks in *names, *keys and
 * *slotmasks (palloc'd), their number returned; *pos moves to the last.
 * Returns -1 when the caller fell more than the ring behind, or a note said
 * "every queue": the caller walks every queue.  Also -1 without shared
 * memory.
 */
int
pgq_read_ready_notes(uint64 *pos, char ***names, PgqKey **keys, uint32 **slotmasks)
{
	PgqDbSlot  *slot = pgq_my_slot();
	uint64		seq;
	int			n = 0;
	bool		all = false;

	*names = NULL;
	*keys = NULL;
	*slotmasks = NULL;
	if (slot == NULL)
		return -1;
	SpinLockAcquire(&slot->ready_mutex);
	seq = slot->ready_seq;
	if (seq - *pos > PGQ_READY_RING)
		all = true;
	else if (seq > *pos)
	{
		uint64		i;

		*names = palloc(sizeof(char *) * (seq - *pos));
		*keys = palloc(sizeof(PgqKey) * (seq - *pos));
		*slotmasks = palloc(sizeof(uint32) * (seq - *pos));
		for (i = *pos + 1; i <= seq && !all; i++)
		{
			/* note number i is in ready[(i - 1) % PGQ_READY_RING] */
			PgqReadyNote *note = &slot->ready[(i - 1) % PGQ_READY_RING];

			if (note->queue[0] == '\0')
				all = true;
			else
			{
				(*keys)[n] = note->key;
				(*slotmasks)[n] = note->slots;
				(*names)[n++] = pstrdup(note->queue);
			}
		}
	}
	SpinLockRelease(&slot->ready_mutex);
	*pos = seq;
	return all ? -1 : n;
}

/*
 * The queues the current transaction made work ready in so far (visible to
 * it before its notes are written at commit): their names, keys and slot
 * masks, their number returned, or -1 when it made work ready in more queues than it
 * keeps.
 */
int
pgq_own_ready(char ***names, PgqKey **keys, uint32 **slotmasks)
{
	int			i;

	*names = NULL;
	*keys = NULL;
	*slotmasks = NULL;
	if (pending_ready_all)
		return -1;
	if (pending_nready == 0)
		return 0;
	*names = palloc(sizeof(char *) * pending_nready);
	*keys = palloc(sizeof(PgqKey) * pending_nready);
	*slotmasks = palloc(sizeof(uint32) * pending_nready);
	for (i = 0; i < pending_nready; i++)
	{
		(*names)[i] = pending_ready[i];
		(*keys)[i] = pending_ready_key[i];
		(*slotmasks)[i] = pending_ready_slots[i];
	}
	return pending_nready;
}

/*
 * The settings generation of this database.  Without shared memory (the
 * library not preloaded, or no slot for the database) no pgq_configure of
 * another session can be heard of: a number that changes at every call,
 * so that every scheduling pass reads the settings again (a pause, a cap,
 * a rate limit set meanwhile) instead of keeping those of its session's
 * first pass for good.
 */
uint64
pgq_settings_generation(void)
{
	static uint64 unshared_gen = 0;
	PgqDbSlot  *slot = pgq_my_slot();

	return slot ? pg_atomic_read_u64(&slot->settings_gen) : ++unshared_gen;
}

/*
 * How many commits freed places under a limit (PGQ_WAKE_PLACES) in this
 * database so far: a grouped queue whose every group with a due job was full
 * waits for it to change (schedule.c).  Read before the pass's snapshot: a
 * commit counted after the read is seen by the next pass.  Without shared
 * memory it changes at every call.
 */
uint64
pgq_places_generation(void)
{
	static uint64 unshared_gen = 0;
	PgqDbSlot  *slot = pgq_my_slot();
	uint64		gen;

	if (slot == NULL)
		return ++unshared_gen;
	gen = pg_atomic_read_u64(&slot->places_gen);
	pg_memory_barrier();		/* before the snapshot's reads */
	return gen;
}

/*
 * Whether the current transaction freed places (PGQ_WAKE_PLACES) that it
 * has not yet published: a pass in the same transaction sees them.
 */
bool
pgq_own_places_freed(void)
{
	return (pending_wake & PGQ_WAKE_PLACES) != 0;
}

/*
 * Register the transaction callbacks; every backend that loads the library
 * does this once, from _PG_init.  at_xact_end is called at every commit,
 * abort and prepare, after the bounds have been dealt with.
 */
void
pgq_xact_callbacks_register(PgqXactEndCallback at_xact_end)
{
	xact_end_callback = at_xact_end;
	RegisterXactCallback(pgq_xact_callback, NULL);
	RegisterSubXactCallback(pgq_subxact_callback, NULL);
}

/*
 * At commit, publish the counts, wake-ups and bound lowerings the
 * transaction collected; at abort or prepare, drop them.  Called after the
 * commit is visible to other transactions, so a woken process sees the new
 * rows.
 */
static void
pgq_xact_callback(XactEvent event, void *arg)
{
	int			i;

	if (event == XACT_EVENT_PRE_PREPARE)
	{
		pgq_bounds_at_prepare();	/* see bounds.c, rule 8 */
		return;
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_PREPARE)
		pgq_calls_at_xact_end();

	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT)
	{
		pgq_bounds_at_xact_end(true);
		xact_end_callback(true);
		if (pgq_shared != NULL)
		{
			PgqDbSlot  *slot;

			if (pending_any)
				for (i = 0; i < PGQ_NUM_COUNTERS; i++)
					if (pending_counts[i] != 0)
						pg_atomic_fetch_add_u64(&pgq_shared->counters[i],
												pending_counts[i]);

			if ((pending_nready > 0 || pending_ready_all || pending_settings) &&
				(slot = pgq_my_slot()) != NULL)
			{
				/* before the wake-ups: a woken scheduler reads them */
				if (pending_nready > 0 || pending_ready_all)
					pgq_write_ready_notes(slot);
				if (pending_settings)
					pg_atomic_fetch_add_u64(&slot->settings_gen, 1);
			}
			if ((pending_wake != 0 || pending_claimable > 0) &&
				(slot = pgq_my_slot()) != NULL)
			{
				/* before the wake-up: a woken pass reads it */
				if (pending_wake & PGQ_WAKE_PLACES)
					pg_atomic_fetch_add_u64(&slot->places_gen, 1);
				/*
				 * A scheduler with pgqueue.enabled off schedules nothing:
				 * do not wake it at every push.  When the setting comes
				 * back on, the scheduler's reload is followed by a pass.
				 */
				if ((pending_wake & PGQ_WAKE_SCHEDULER) && pgqueue_enabled)
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
		pgq_bounds_at_xact_end(false);
		xact_end_callback(false);
		if (pending_wake & PGQ_WAKE_ON_ABORT)
			pgq_broadcast_claimers();
	}
	else if (event == XACT_EVENT_PREPARE)
	{
		pgq_bounds_at_xact_end(false);	/* see bounds.c, rule 7 */
		xact_end_callback(false);	/* it may yet roll back */
	}
	else
		return;

	/* commit, abort or prepare: start afresh */
	if (pending_any)
		memset(pending_counts, 0, sizeof(pending_counts));
	pending_any = false;
	pending_wake = 0;
	pending_claimable = 0;
	pending_nready = 0;
	pending_ready_all = false;
	pending_settings = false;
	sub_counts = NULL;			/* freed with TopTransactionContext */
}

/*
 * When a subtransaction that counted something ends: rolled back, its counts
 * are taken back; committed, they become its parent's (whose own rollback
 * must take them back too).  Wake-ups are not undone: a spurious one costs
 * only a look.
 */
static void
pgq_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	PgqSubCounts *s = sub_counts;

	if (event == SUBXACT_EVENT_ABORT_SUB)
		pgq_calls_at_subxact_abort(mySubid);
	if ((event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB) ||
		s == NULL || s->subid != mySubid)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		memcpy(pending_counts, s->counts, sizeof(pending_counts));
		if (pending_wake & PGQ_WAKE_ON_ABORT)
			pgq_broadcast_claimers();
	}
	else if (parentSubid != TopSubTransactionId &&
			 (s->next == NULL || s->next->subid != parentSubid))
	{
		/* the parent counted nothing itself: the record is now the parent's */
		s->subid = parentSubid;
		return;
	}
	sub_counts = s->next;
	pfree(s);
}

/* ----------------------------------------------------------------
 * Blocking claims
 * ----------------------------------------------------------------
 */

/*
 * Prepare to sleep for work in pgq_wait_for_work.  Call before looking for
 * work, so that a wake-up between the look and the sleep is not missed;
 * end with pgq_end_wait, also when the look fails.
 */
void
pgq_prepare_wait(bool filtered)
{
	PgqDbSlot  *slot = pgq_my_slot();

	if (slot == NULL)
		return;
	if (!wait_exit_registered)
	{
		/* a FATAL exit (pg_terminate_backend) runs no PG_FINALLY */
		before_shmem_exit(pgq_wait_exit, (Datum) 0);
		wait_exit_registered = true;
	}
	waiting = true;
	waiting_filtered = filtered;
	if (filtered)
		pg_atomic_fetch_add_u32(&slot->filtered_waiters, 1);
	ConditionVariablePrepareToSleep(&slot->work_cv);
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
 * Stop waiting (after the claim loop; also when it failed).  completed:
 * the loop ended normally (a claim or the end of the wait), not by an
 * error.  A claim that fails (cancelled, statement_timeout) may have taken
 * a signal meant for one waiter, and PostgreSQL 15 cannot tell whether it
 * did: pass one on, so that another waiting claim looks.
 */
void
pgq_end_wait(bool completed)
{
	PgqDbSlot  *slot = pgq_my_slot();

	if (!waiting)
		return;
	ConditionVariableCancelSleep();
	if (slot != NULL)
	{
		if (waiting_filtered)
			pg_atomic_fetch_sub_u32(&slot->filtered_waiters, 1);
		if (!completed)
			ConditionVariableSignal(&slot->work_cv);
	}
	waiting = false;
	waiting_filtered = false;
}

/* A backend that exits while its claim waits (FATAL) stops waiting first. */
static void
pgq_wait_exit(int code, Datum arg)
{
	pgq_end_wait(false);
}
