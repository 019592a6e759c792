/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		pgqueue's shared memory: the cumulative counters and one slot per
 *		database (its scheduler's latch, the condition variable blocking
 *		claims sleep on, its scan bounds, the sessions restoring into it).
 *		What goes into it is published by publish.c and bounds.c.  Also
 *		who runs: the schedulers and the launcher, and the holds that keep
 *		a database's scheduler off (hook.c).
 *
 * All of this exists only when the library is in shared_preload_libraries;
 * otherwise pgq_shared is NULL and every lookup here finds no slot.
 *
 * Layer 2 of src/README (shared memory and wake-ups): it may call the
 * other files of its layer and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#include "shmem_internal.h"

PgqShared  *pgq_shared = NULL;
static PgqDbSlot *my_slot = NULL;	/* slot of MyDatabaseId, once looked up */

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void pgq_shmem_request(void);
static void pgq_shmem_startup(void);
static void pgq_scheduler_detach(int code, Datum arg);
static void pgq_scheduler_unregister(int code, Datum arg);
static void pgq_restore_unlist(int code, Datum arg);
static void pgq_hold_release_at_exit(int code, Datum arg);
static bool pgq_held_locked(int dbindex);

/*
 * pgqueue calls under way in this backend (nested ones count once), and
 * the subtransaction each of the first PGQ_CALL_LEVELS began in: a call
 * that an error ends inside a subtransaction (a PL/pgSQL EXCEPTION block)
 * is over when the subtransaction is rolled back.
 */
#define PGQ_CALL_LEVELS 8
static int	call_depth = 0;
static SubTransactionId call_subid[PGQ_CALL_LEVELS];
static uint32 call_last = 1;	/* the last call's mark: odd, never 0 */
static bool call_exit_registered = false;

/* Entries of pgq_shared->calls: one per PGPROC there may be. */
static int
pgq_call_slots(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts + 1;
}

/* The size of pgqueue's shared memory. */
static Size
pgq_shmem_size(void)
{
	return MAXALIGN(add_size(offsetof(PgqShared, calls),
							 mul_size(pgq_call_slots(), sizeof(pg_atomic_uint32))));
}

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
	RequestAddinShmemSpace(pgq_shmem_size());
}

/* Create or attach to the shared struct. */
static void
pgq_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	pgq_shared = ShmemInitStruct("pgqueue", pgq_shmem_size(), &found);
	if (!found)
	{
		int			i;

		SpinLockInit(&pgq_shared->mutex);
		pgq_shared->stats_reset = GetCurrentTimestamp();
		for (i = 0; i < PGQ_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&pgq_shared->counters[i], 0);
		for (i = 0; i < PGQ_MAX_DATABASES; i++)
			pgq_shared->scheduler_pid[i] = 0;
		for (i = 0; i < PGQ_MAX_HOLDS; i++)
			pgq_shared->holds[i].pid = 0;
		pgq_shared->launcher_procno = -1;
		for (i = 0; i < PGQ_DB_SLOTS; i++)
		{
			pgq_shared->slots[i].dboid = InvalidOid;
			pgq_shared->slots[i].scheduler_procno = -1;
			ConditionVariableInit(&pgq_shared->slots[i].work_cv);
			pg_atomic_init_u32(&pgq_shared->slots[i].filtered_waiters, 0);
			SpinLockInit(&pgq_shared->slots[i].bound_mutex);
			pgq_bounds_reset(&pgq_shared->slots[i]);
			pg_atomic_init_u64(&pgq_shared->slots[i].settings_gen, 0);
			pg_atomic_init_u64(&pgq_shared->slots[i].places_gen, 0);
			SpinLockInit(&pgq_shared->slots[i].ready_mutex);
			pgq_shared->slots[i].ready_seq = 0;
			SpinLockInit(&pgq_shared->slots[i].restore_mutex);
			memset(pgq_shared->slots[i].restorers, 0,
				   sizeof(pgq_shared->slots[i].restorers));
			pgq_shared->slots[i].restore_last = 0;
			pgq_shared->slots[i].pass_busy = false;
		}
		pgq_shared->ncalls = pgq_call_slots();
		for (i = 0; i < pgq_shared->ncalls; i++)
			pg_atomic_init_u32(&pgq_shared->calls[i], 0);
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
		pgq_bounds_reset(found);
		pg_atomic_fetch_add_u64(&found->settings_gen, 1);
		pg_atomic_fetch_add_u64(&found->places_gen, 1);
	}
	SpinLockRelease(&pgq_shared->mutex);
	return found;
}

/* The slot of the current database for an ordinary backend, or NULL. */
PgqDbSlot *
pgq_my_slot(void)
{
	if (my_slot == NULL && pgq_shared != NULL && OidIsValid(MyDatabaseId))
		my_slot = pgq_find_slot(-1);
	return my_slot;
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
	my_slot->scheduler_procno = pgq_my_procno();
	before_shmem_exit(pgq_scheduler_detach, (Datum) 0);
}

static void
pgq_scheduler_detach(int code, Datum arg)
{
	if (my_slot != NULL && my_slot->scheduler_procno == pgq_my_procno())
		my_slot->scheduler_procno = -1;
	pgq_restore_pass_end();
}

/*
 * Register the calling process as the scheduler of the database with index
 * dbindex in pgqueue.database.  False when another live scheduler of that
 * database is registered, or a backend holds the database's scheduler off
 * (pgq_hold_take): the caller must exit, before it connects to the
 * database.  The registration ends when the process exits.  The launcher
 * reads it (pgq_scheduler_running) to know which databases have a
 * scheduler, also those started by a launcher before it.
 */
bool
pgq_scheduler_register(int dbindex)
{
	bool		ok;

	if (pgq_shared == NULL || dbindex < 0 || dbindex >= PGQ_MAX_DATABASES)
		return false;
	SpinLockAcquire(&pgq_shared->mutex);
	ok = (pgq_shared->scheduler_pid[dbindex] == 0 && !pgq_held_locked(dbindex));
	if (ok)
		pgq_shared->scheduler_pid[dbindex] = MyProcPid;
	SpinLockRelease(&pgq_shared->mutex);
	if (ok)
		on_shmem_exit(pgq_scheduler_unregister, Int32GetDatum(dbindex));
	return ok;
}

static void
pgq_scheduler_unregister(int code, Datum arg)
{
	int			dbindex = DatumGetInt32(arg);

	SpinLockAcquire(&pgq_shared->mutex);
	if (pgq_shared->scheduler_pid[dbindex] == MyProcPid)
		pgq_shared->scheduler_pid[dbindex] = 0;
	SpinLockRelease(&pgq_shared->mutex);
}

/*
 * Whether a scheduler runs for the current database (it attached to the
 * database's slot: pgq_scheduler_attach), as far as shared memory says;
 * false without it.
 */
bool
pgq_scheduler_attached(void)
{
	PgqDbSlot  *slot = pgq_my_slot();

	return slot != NULL && slot->scheduler_procno >= 0;
}

/* The pid of the scheduler of the database with index dbindex, or 0. */
pid_t
pgq_scheduler_running(int dbindex)
{
	pid_t		pid;

	if (pgq_shared == NULL || dbindex < 0 || dbindex >= PGQ_MAX_DATABASES)
		return 0;
	SpinLockAcquire(&pgq_shared->mutex);
	pid = pgq_shared->scheduler_pid[dbindex];
	SpinLockRelease(&pgq_shared->mutex);
	return pid;
}

/* ----------------------------------------------------------------
 * Restores: sessions that load pgqueue's tables pause the scheduler
 * ----------------------------------------------------------------
 */

/*
 * List this backend as one that loads or builds pgqueue's tables in its
 * database (hook.c decides which statements do), as of now: the database's
 * scheduler pauses while it is a backend of the database, and for
 * PGQ_RESTORE_GRACE_SECS after its latest such statement or its end
 * (pgq_restore_pass_begin).  A pass the scheduler began before, while it
 * did not know of this backend, is waited for (at most
 * PGQ_RESTORE_WAIT_MS): when this returns, no pass that could see what the
 * statement does runs.  Returns whether the backend was not listed before
 * (its first such statement); false too when it cannot be listed (no
 * shared memory, no slot free for its database).  The caller is inside a
 * transaction, in a database that has a scheduler.
 */
bool
pgq_restore_note(void)
{
	static bool exit_callback = false;
	PgqDbSlot  *slot = pgq_my_slot();
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz give_up;
	PgqRestorer *entry = NULL;
	bool		first = false;
	bool		busy;
	int			i;

	if (slot == NULL)
		return false;
	if (!exit_callback)
	{
		before_shmem_exit(pgq_restore_unlist, (Datum) 0);
		exit_callback = true;
	}

	SpinLockAcquire(&slot->restore_mutex);
	for (i = 0; i < PGQ_MAX_RESTORERS && entry == NULL; i++)
		if (slot->restorers[i].pid == MyProcPid)
			entry = &slot->restorers[i];
	for (i = 0; i < PGQ_MAX_RESTORERS && entry == NULL; i++)
		if (slot->restorers[i].pid == 0)
			entry = &slot->restorers[i];
	if (entry == NULL)
	{
		/* all taken: the one noted longest ago leaves, its grace kept */
		entry = &slot->restorers[0];
		for (i = 1; i < PGQ_MAX_RESTORERS; i++)
			if (slot->restorers[i].last < entry->last)
				entry = &slot->restorers[i];
	}
	if (entry->pid != MyProcPid)
	{
		first = true;
		if (entry->pid != 0)
			slot->restore_last = Max(slot->restore_last, now);
		entry->pid = MyProcPid;
	}
	entry->last = now;
	slot->restore_last = Max(slot->restore_last, now);
	busy = slot->pass_busy;
	SpinLockRelease(&slot->restore_mutex);

	/* a pass begun before the scheduler could see this backend listed */
	give_up = TimestampTzPlusMilliseconds(now, PGQ_RESTORE_WAIT_MS);
	while (busy && GetCurrentTimestamp() < give_up)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		SpinLockAcquire(&slot->restore_mutex);
		busy = slot->pass_busy;
		SpinLockRelease(&slot->restore_mutex);
	}
	return first;
}

/* At exit of a backend that pgq_restore_note listed: its grace begins. */
static void
pgq_restore_unlist(int code, Datum arg)
{
	PgqDbSlot  *slot = my_slot;
	int			i;

	if (slot == NULL)
		return;
	SpinLockAcquire(&slot->restore_mutex);
	for (i = 0; i < PGQ_MAX_RESTORERS; i++)
		if (slot->restorers[i].pid == MyProcPid)
		{
			slot->restorers[i].pid = 0;
			slot->restore_last = Max(slot->restore_last, GetCurrentTimestamp());
		}
	SpinLockRelease(&slot->restore_mutex);
}

/*
 * For the scheduler, before a pass: whether it must pause for a restore in
 * its database.  It must while a backend that pgq_restore_note listed is
 * still a backend of this database, and until PGQ_RESTORE_GRACE_SECS after
 * the latest statement of any or the end of the last (which this notices,
 * for a backend that ended without unlisting itself, at the first look
 * after it).  *restorer is set to a live listed backend, or 0.  When it
 * need not pause, the pass is marked busy until pgq_restore_pass_end, and a
 * backend listed meanwhile waits for it to end.  The caller is the
 * scheduler, attached to its slot.
 */
bool
pgq_restore_pass_begin(pid_t *restorer)
{
	PgqDbSlot  *slot = my_slot;
	PgqRestorer listed[PGQ_MAX_RESTORERS];
	TimestampTz last;
	TimestampTz now;
	bool		gone = false;
	int			i;

	*restorer = 0;
	if (slot == NULL)
		return false;
	SpinLockAcquire(&slot->restore_mutex);
	memcpy(listed, slot->restorers, sizeof(listed));
	last = slot->restore_last;
	slot->pass_busy = true;
	SpinLockRelease(&slot->restore_mutex);

	now = GetCurrentTimestamp();
	for (i = 0; i < PGQ_MAX_RESTORERS; i++)
	{
		PGPROC	   *proc;

		if (listed[i].pid == 0)
			continue;
		proc = BackendPidGetProc(listed[i].pid);
		if (proc != NULL && proc->databaseId == MyDatabaseId)
			*restorer = listed[i].pid;
		else
		{
			listed[i].pid = -listed[i].pid; /* gone: to unlist below */
			gone = true;
		}
	}
	if (gone)
	{
		last = Max(last, now);
		SpinLockAcquire(&slot->restore_mutex);
		for (i = 0; i < PGQ_MAX_RESTORERS; i++)
			if (listed[i].pid < 0 && slot->restorers[i].pid == -listed[i].pid)
				slot->restorers[i].pid = 0;
		slot->restore_last = Max(slot->restore_last, now);
		SpinLockRelease(&slot->restore_mutex);
	}
	if (*restorer == 0 &&
		(last == 0 ||
		 now >= TimestampTzPlusMilliseconds(last, PGQ_RESTORE_GRACE_SECS * 1000)))
		return false;
	pgq_restore_pass_end();
	return true;
}

/*
 * For the scheduler, when it resumes after a restore: what the processes of
 * its database learned of the tables before is forgotten, since the
 * restore wrote them behind the API's back.  The scan bounds go to their
 * lowest keys (bounds.c), and the settings' generation moves on, so that
 * every scheduling process reloads the queues' settings.
 */
void
pgq_restore_forget(void)
{
	if (my_slot == NULL)
		return;
	pgq_bounds_lower_all(my_slot);
	pg_atomic_fetch_add_u64(&my_slot->settings_gen, 1);
}

/* For the scheduler: the pass that pgq_restore_pass_begin let run ended. */
void
pgq_restore_pass_end(void)
{
	if (my_slot == NULL || pgq_shared == NULL)
		return;
	SpinLockAcquire(&my_slot->restore_mutex);
	my_slot->pass_busy = false;
	SpinLockRelease(&my_slot->restore_mutex);
}

/* ----------------------------------------------------------------
 * Holds: backends that keep a database's scheduler off (hook.c)
 * ----------------------------------------------------------------
 */

/* Whether a backend holds off the scheduler of dbindex; mutex held. */
static bool
pgq_held_locked(int dbindex)
{
	int			i;

	for (i = 0; i < PGQ_MAX_HOLDS; i++)
		if (pgq_shared->holds[i].pid != 0 && pgq_shared->holds[i].dbindex == dbindex)
			return true;
	return false;
}

/*
 * Hold off the scheduler of the database with index dbindex in
 * pgqueue.database: the launcher does not start it, and a running one exits
 * between passes (pgq_scheduler_held), until pgq_hold_release or this
 * backend's end.  *running is the pid of the scheduler that ran when the
 * hold was taken (0: none; a scheduler that registers later sees the hold
 * and exits before it connects).  False when every entry is taken
 * (PGQ_MAX_HOLDS backends hold schedulers off at once): then no hold.
 */
bool
pgq_hold_take(int dbindex, pid_t *running)
{
	static bool exit_callback = false;
	bool		ok = false;
	int			i;

	*running = 0;
	if (pgq_shared == NULL || dbindex < 0 || dbindex >= PGQ_MAX_DATABASES)
		return false;
	if (!exit_callback)
	{
		before_shmem_exit(pgq_hold_release_at_exit, (Datum) 0);
		exit_callback = true;
	}
	SpinLockAcquire(&pgq_shared->mutex);
	for (i = 0; i < PGQ_MAX_HOLDS && !ok; i++)
		if (pgq_shared->holds[i].pid == 0)
		{
			pgq_shared->holds[i].pid = MyProcPid;
			pgq_shared->holds[i].dbindex = dbindex;
			ok = true;
		}
	*running = pgq_shared->scheduler_pid[dbindex];
	SpinLockRelease(&pgq_shared->mutex);
	return ok;
}

/*
 * Release every hold of this backend, and wake the launcher so that it
 * starts the schedulers again at once.
 */
void
pgq_hold_release(void)
{
	int			procno;
	int			i;

	if (pgq_shared == NULL)
		return;
	SpinLockAcquire(&pgq_shared->mutex);
	for (i = 0; i < PGQ_MAX_HOLDS; i++)
		if (pgq_shared->holds[i].pid == MyProcPid)
			pgq_shared->holds[i].pid = 0;
	procno = pgq_shared->launcher_procno;
	SpinLockRelease(&pgq_shared->mutex);
	if (procno >= 0)
		SetLatch(&ProcGlobal->allProcs[procno].procLatch);
}

static void
pgq_hold_release_at_exit(int code, Datum arg)
{
	pgq_hold_release();
}

/* For a scheduler, between passes: whether a backend holds it off. */
bool
pgq_scheduler_held(int dbindex)
{
	bool		held;

	if (pgq_shared == NULL || dbindex < 0 || dbindex >= PGQ_MAX_DATABASES)
		return false;
	SpinLockAcquire(&pgq_shared->mutex);
	held = pgq_held_locked(dbindex);
	SpinLockRelease(&pgq_shared->mutex);
	return held;
}

/*
 * For the launcher: the pid of a live backend that holds off the scheduler
 * of dbindex, or 0.  The holds of backends that are gone (one that died
 * before it could release them) are released here.
 */
pid_t
pgq_hold_holder(int dbindex)
{
	PgqHold		holds[PGQ_MAX_HOLDS];
	pid_t		holder = 0;
	int			i;

	if (pgq_shared == NULL)
		return 0;
	SpinLockAcquire(&pgq_shared->mutex);
	memcpy(holds, pgq_shared->holds, sizeof(holds));
	SpinLockRelease(&pgq_shared->mutex);
	for (i = 0; i < PGQ_MAX_HOLDS; i++)
	{
		if (holds[i].pid == 0 || holds[i].dbindex != dbindex)
			continue;
		if (BackendPidGetProc(holds[i].pid) != NULL)
		{
			holder = holds[i].pid;
			continue;
		}
		SpinLockAcquire(&pgq_shared->mutex);
		if (pgq_shared->holds[i].pid == holds[i].pid)
			pgq_shared->holds[i].pid = 0;
		SpinLockRelease(&pgq_shared->mutex);
	}
	return holder;
}

/* Make the calling process the launcher that pgq_hold_release wakes. */
void
pgq_launcher_attach(void)
{
	if (pgq_shared == NULL)
		return;
	SpinLockAcquire(&pgq_shared->mutex);
	pgq_shared->launcher_procno = pgq_my_procno();
	SpinLockRelease(&pgq_shared->mutex);
}

/* ----------------------------------------------------------------
 * Calls under way
 *
 * A pgqueue call (tables.c: pgq_write_begin .. pgq_write_end) opens the
 * slots of the rings lazily, after it took its snapshot and perhaps after
 * a wait for a row lock; a slot truncated meanwhile would show that
 * snapshot none of the rows it should see (ring.c).  The scheduler learns
 * which backends' snapshots may see a slot's rows from their xmin, but a
 * backend's xmin is that of its oldest snapshot: a worker function, or a
 * transaction with an old cursor, holds an old one while its calls take
 * new ones.  So each call marks itself here before it takes a snapshot,
 * and the scheduler waits for the calls it sees under way (note_waits).
 * The mark is written, and a full barrier made, before the call's first
 * snapshot; a snapshot that could see a slot's last rows was taken before
 * their deletes committed, which the scheduler saw before it reads the
 * marks (after a barrier of its own).
 * ----------------------------------------------------------------
 */

static void
pgq_call_clear(int code, Datum arg)
{
	int			b = pgq_my_backend();

	if (pgq_shared != NULL && b >= 0 && b < pgq_shared->ncalls)
		pg_atomic_write_u32(&pgq_shared->calls[b], 0);
}

/* A pgqueue call begins (before it takes its first snapshot). */
void
pgq_call_begin(void)
{
	int			b = pgq_my_backend();

	if (call_depth < PGQ_CALL_LEVELS)
		call_subid[call_depth] = GetCurrentSubTransactionId();
	if (call_depth++ > 0 || pgq_shared == NULL || b < 0 || b >= pgq_shared->ncalls)
		return;
	if (!call_exit_registered)
	{
		before_shmem_exit(pgq_call_clear, (Datum) 0);
		call_exit_registered = true;
	}
	call_last += 2;
	if (call_last == 1)
		call_last = 3;			/* wrapped: still not the last call's mark */
	pg_atomic_write_u32(&pgq_shared->calls[b], call_last);
	pg_memory_barrier();
}

/* The call begun by pgq_call_begin ends (its snapshots are released). */
void
pgq_call_end(void)
{
	if (call_depth > 0 && --call_depth == 0)
		pgq_call_clear(0, (Datum) 0);
}

/* At the end of a transaction: a call cut short by an error is over. */
void
pgq_calls_at_xact_end(void)
{
	if (call_depth > 0)
	{
		call_depth = 0;
		pgq_call_clear(0, (Datum) 0);
	}
}

/*
 * When subtransaction subid rolls back: the calls begun in it (or in one
 * of its children, whose ids are higher) are over.  Calls nested deeper
 * than PGQ_CALL_LEVELS stay counted until the transaction ends (the
 * scheduler then waits longer, never less).
 */
void
pgq_calls_at_subxact_abort(SubTransactionId subid)
{
	if (call_depth == 0)
		return;
	while (call_depth > 0 && call_depth <= PGQ_CALL_LEVELS &&
		   call_subid[call_depth - 1] >= subid)
		call_depth--;
	if (call_depth == 0)
		pgq_call_clear(0, (Datum) 0);
}

/*
 * The mark of the call under way in the backend of virtual transaction
 * vxid, or 0 when none is (or there is no shared memory).
 */
uint32
pgq_call_of(VirtualTransactionId vxid)
{
	int			b = pgq_vxid_backend(vxid);

	pg_memory_barrier();
	if (pgq_shared == NULL || b < 0 || b >= pgq_shared->ncalls)
		return 0;
	return pg_atomic_read_u32(&pgq_shared->calls[b]);
}
