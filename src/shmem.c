/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		pgqueue's shared memory: the cumulative counters and one slot per
 *		database (its scheduler's latch, the condition variable blocking
 *		claims sleep on, its scan bounds).  What goes into it is published
 *		by publish.c and bounds.c.
 *
 * All of this exists only when the library is in shared_preload_libraries;
 * otherwise pgq_shared is NULL and every lookup here finds no slot.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#include "shmem.h"

PgqShared  *pgq_shared = NULL;
static PgqDbSlot *my_slot = NULL;	/* slot of MyDatabaseId, once looked up */

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void pgq_shmem_request(void);
static void pgq_shmem_startup(void);
static void pgq_scheduler_detach(int code, Datum arg);
static void pgq_scheduler_unregister(int code, Datum arg);

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
			pgq_shared->scheduler_pid[i] = 0;
		for (i = 0; i < PGQ_DB_SLOTS; i++)
		{
			pgq_shared->slots[i].dboid = InvalidOid;
			pgq_shared->slots[i].scheduler_procno = -1;
			ConditionVariableInit(&pgq_shared->slots[i].work_cv);
			pg_atomic_init_u32(&pgq_shared->slots[i].filtered_waiters, 0);
			SpinLockInit(&pgq_shared->slots[i].bound_mutex);
			pgq_bounds_reset(&pgq_shared->slots[i]);
			pg_atomic_init_u64(&pgq_shared->slots[i].settings_gen, 0);
			SpinLockInit(&pgq_shared->slots[i].ready_mutex);
			pgq_shared->slots[i].ready_seq = 0;
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
		pgq_bounds_reset(found);
		pg_atomic_fetch_add_u64(&found->settings_gen, 1);
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
 * Register the calling process as the scheduler of the database with index
 * dbindex in pgqueue.database.  False when another live scheduler of that
 * database is registered (the caller must exit); the registration ends when
 * the process exits.  The launcher reads it (pgq_scheduler_running) to know
 * which databases have a scheduler, also those started by a launcher before
 * it.
 */
bool
pgq_scheduler_register(int dbindex)
{
	bool		ok;

	if (pgq_shared == NULL || dbindex < 0 || dbindex >= PGQ_MAX_DATABASES)
		return false;
	SpinLockAcquire(&pgq_shared->mutex);
	ok = (pgq_shared->scheduler_pid[dbindex] == 0);
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
