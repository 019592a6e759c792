/*-------------------------------------------------------------------------
 *
 * worker.c
 *		The scheduler background worker: one per database named in
 *		pgqueue.database, started by the launcher (launcher.c), running
 *		scheduling passes.
 *
 * Each pass is its own transaction.  After a full pass the next runs at
 * once; otherwise the worker sleeps pgqueue.naptime, or until the earliest
 * job of the pass's view that was not yet due becomes due, whichever comes
 * first; a commit that pushed jobs sets its latch earlier (see publish.c).
 * It does nothing while the extension is not installed in its database or
 * pgqueue.enabled is off, nor while a session loads pgqueue's tables in its
 * database (a restore) and for PGQ_RESTORE_GRACE_SECS after (hook.c): no
 * pass, no upkeep of the rings or the archive.  The launcher starts it only
 * when recovery has finished and its database exists, so it connects
 * straight to it (by OID).
 *
 * SIGTERM ends the loop between passes and the worker exits with code 0,
 * which the postmaster logs at DEBUG1 only; the launcher, told by the
 * postmaster, starts it again unless the server is shutting down.  So does
 * a hold of a CREATE, ALTER or DROP DATABASE that needs it gone (hook.c),
 * which also sends SIGTERM; the launcher starts it again once the hold is
 * released.
 *
 * Layer 6 of src/README (processes and hooks): it may call the other
 * files of its layer, the SQL entry points (api.c, admin.c) and every
 * layer below them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "pgqueue.h"

/*
 * A wake-up within PGQ_GATHER_WINDOW_MS of the end of a pass that moved
 * more than one job waits PGQ_GATHER_MS before the next pass (see the main
 * loop).  Measured with 2 producers and 4 consumers: 280 passes/s of about
 * 5 jobs with a 2 ms wait, 125 passes/s and 17 % more jobs finished with
 * 6 ms.
 */
#define PGQ_GATHER_WINDOW_MS 5
#define PGQ_GATHER_MS 6

/* pgqueue.naptime (ms) and pgqueue.batch_size: the scheduler's loop */
int			pgqueue_naptime = 1000;
int			pgqueue_batch_size = 100;

PGDLLEXPORT void pgq_scheduler_main(Datum main_arg);

/*
 * Whether the extension is installed, kept between passes as pg_cron keeps
 * its job cache: ext_cache_valid is cleared by a relcache invalidation of
 * pgqueue.queue (DROP EXTENSION drops it) or of every relation (a reset of
 * the caches).  Only a known extension is cached: while there is none, each
 * pass looks for it again (one index probe of pg_extension).
 */
static bool ext_cache_valid = false;
static Oid	ext_cache_oid = InvalidOid;
static Oid	ext_cache_relid = InvalidOid;	/* pgqueue.queue */
static uint64 ext_cache_gen = 0;	/* bumped by every invalidation of it */

static bool restore_paused = false;	/* the last pass paused for a restore */
static bool forget_wanted = false;	/* forget the tables before the next pass */

static int	pgq_run_pass(const char *dbname);
static void pgq_note_pause(const char *dbname, bool paused, pid_t restorer);
static void pgq_forget_tables(void);
static void pgq_short_xact(void (*fn) (void));
static Oid	pgq_extension_pinned(void);
static void pgq_extension_cache_callback(Datum arg, Oid relid);
static long pgq_next_wait_ms(int moved);

/*
 * Entry point of a scheduler.  main_arg is the index of its database in
 * pgqueue.database, bgw_extra holds its OID (launcher.c).
 */
void
pgq_scheduler_main(Datum main_arg)
{
	int			dbindex = DatumGetInt32(main_arg);
	char	   *dbname = list_nth(pgq_database_list(), dbindex);
	Oid			dboid;
	bool		extension_seen = false;

	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	pgq_is_pgqueue_process = true;

	/*
	 * Another scheduler of this database runs (started by an earlier
	 * launcher), or a command holds it off (hook.c): exit before connecting.
	 */
	if (!pgq_scheduler_register(dbindex))
		proc_exit(0);

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	/* the same fixed search_path and planner settings as the SQL functions */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * A pass does not wait for its commit record to reach disk.  If the
	 * server crashes first, the pass is lost as a whole and its jobs are
	 * still pending; a claim of one of them commits synchronously, and so
	 * flushes the pass's commit record (earlier in the WAL) with its own.
	 */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
	pgq_scheduler_attach(dbindex);
	CacheRegisterRelcacheCallback(pgq_extension_cache_callback, (Datum) 0);

	ereport(LOG,
			(errmsg("pgqueue scheduler started for database \"%s\"", dbname)));

	while (!ShutdownRequestPending)
	{
		int			moved = -1;
		int			batch_size;
		int			rc;
		TimestampTz last_pass_end;

		CHECK_FOR_INTERRUPTS();
		if (pgq_scheduler_held(dbindex))
			break;				/* a database command needs it gone (hook.c) */
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		batch_size = pgqueue_batch_size;	/* what this pass will use */

		/* off for a while: the tables may have been restored meanwhile */
		if (!pgqueue_enabled)
			forget_wanted = true;
		else
		{
			MemoryContext oldcxt = CurrentMemoryContext;

			/* an error in a pass is logged; the loop goes on */
			PG_TRY();
			{
				moved = pgq_run_pass(dbname);
			}
			PG_CATCH();
			{
				MemoryContextSwitchTo(oldcxt);
				EmitErrorReport();
				FlushErrorState();
				AbortCurrentTransaction();
				pgstat_report_activity(STATE_IDLE, NULL);
				moved = -1;
			}
			PG_END_TRY();
			pgq_restore_pass_end();

			if (moved == -2 && extension_seen)
				ereport(LOG,
						(errmsg("pgqueue scheduler: extension pgqueue is not installed in database \"%s\" any more; waiting for it",
								dbname)));
			extension_seen = (moved != -2);
		}

		/* a full pass: there is probably more, go again at once */
		if (moved >= batch_size || ShutdownRequestPending)
			continue;

		last_pass_end = GetCurrentTimestamp();
		rc = WaitLatch(MyLatch,
					   WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					   pgq_next_wait_ms(moved),
					   PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);

		/*
		 * Woken by a commit right after a pass that found several jobs:
		 * jobs are arriving faster than passes can take them one or two at
		 * a time.  Let more arrive before the next pass, so that a pass (a
		 * transaction and a few statements) is paid for by many jobs.  At a
		 * low rate, when latency is what counts, a pass finds one job and
		 * the next runs at once.
		 */
		if ((rc & WL_LATCH_SET) && moved > 1 && !ShutdownRequestPending &&
			!TimestampDifferenceExceeds(last_pass_end, GetCurrentTimestamp(),
										PGQ_GATHER_WINDOW_MS))
		{
			(void) WaitLatch(MyLatch, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 PGQ_GATHER_MS, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
		}
	}

	proc_exit(0);
}

/*
 * How long to sleep after a pass that moved moved jobs (-1: it failed, -2:
 * no extension): pgqueue.naptime, or less when the pass saw a job that
 * becomes due sooner (its run_after), as autoprewarm sleeps until its next
 * dump is due.  Rounded up to the millisecond, so that the pass that wakes
 * finds the job due.
 */
static long
pgq_next_wait_ms(int moved)
{
	long		wait = pgqueue_naptime;
	TimestampTz due;

	if (moved < 0)
		return wait;
	due = pgq_schedule_next_due();
	if (due != DT_NOEND)
		wait = Min(wait, TimestampDifferenceMilliseconds(GetCurrentTimestamp(), due));
	return wait;
}

/*
 * One scheduling pass of database dbname in its own transaction, then the
 * upkeep that is due, each step in a transaction of its own, so that the
 * locks its DDL takes are held for a moment and never by the pass.
 * Returns how many jobs the pass moved, or -2 when the extension is not
 * installed in this database.  While a restore loads pgqueue's tables
 * (hook.c) it does nothing after the look for the extension and returns
 * 0; the first pass after that, or after pgqueue.enabled was off, is
 * preceded by a short transaction that forgets what was known of the
 * tables (pgq_forget_tables).  Marks the database's slot busy
 * (pgq_restore_pass_begin): the caller ends that with pgq_restore_pass_end,
 * whether the pass succeeded or failed.
 */
static int
pgq_run_pass(const char *dbname)
{
	int			moved = -2;
	pid_t		restorer;
	bool		paused = pgq_restore_pass_begin(&restorer);

	pgq_note_pause(dbname, paused, restorer);

	/* after a restore, or a time disabled: first forget, and commit that */
	if (!paused && forget_wanted)
	{
		pgq_short_xact(pgq_forget_tables);
		forget_wanted = false;
	}

	/*
	 * The rings' turns, in a transaction of their own that has sent its
	 * invalidations before the pass begins: a claim that sees the pass's
	 * rows then sees the slot they went into (ring.c).
	 */
	if (!paused && pgq_ring_maintain_wanted())
	{
		pgq_short_xact(pgq_ring_maintain);
		/* the rows left in old slots, moved once the turns are committed */
		if (pgq_ring_move_wanted())
			pgq_short_xact(pgq_ring_move);
	}

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());

	if (OidIsValid(pgq_extension_pinned()))
	{
		if (paused)
			moved = 0;			/* a restore loads the tables: hands off */
		else
		{
			pgstat_report_activity(STATE_RUNNING, "pgqueue scheduling pass");
			SPI_connect();
			moved = pgq_schedule_pass(pgqueue_batch_size);
			SPI_finish();
			pgq_ring_check_full();	/* the next look at the rings at once? */
			pgq_count_now(PGQ_PASSES, 1);
		}
	}

	PopActiveSnapshot();
	CommitTransactionCommand();

	if (!paused && moved >= 0)
	{
		/* free slots beyond those the rings keep (ring.c) */
		if (pgq_ring_shrink_wanted())
			pgq_short_xact(pgq_ring_shrink);
		/* archive partitions made ahead and retired, once a minute (archive.c) */
		if (pgq_archive_maintain_wanted())
			pgq_short_xact(pgq_archive_maintain);
		/* retired tables dropped once no older snapshot is left (retire.c) */
		if (pgq_retired_drop_wanted())
			pgq_short_xact(pgq_retired_drop);
	}
	/* at once when a slot's row counts were zeroed (ring.c) */
	pgstat_report_stat(pgq_ring_stats_flush_wanted());
	pgstat_report_activity(STATE_IDLE,
						   paused ? "pgqueue scheduler paused: a restore loads pgqueue's tables" : NULL);
	return moved;
}

/*
 * Run fn (a step of the upkeep, or pgq_forget_tables) in a short
 * transaction of its own, if the extension is still installed.  fn raises
 * no error of its own.
 */
static void
pgq_short_xact(void (*fn) (void))
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (OidIsValid(pgq_extension_pinned()))
		fn();
	PopActiveSnapshot();
	CommitTransactionCommand();
}

/*
 * Log when the scheduler of database dbname pauses for a restore (paused,
 * restorer: a session that loads pgqueue's tables, or 0 when the last one
 * is gone and the grace period runs) and when it resumes.
 */
static void
pgq_note_pause(const char *dbname, bool paused, pid_t restorer)
{
	if (paused && !restore_paused && restorer != 0)
		ereport(LOG,
				(errmsg("pgqueue scheduler: database \"%s\": pausing while process %d loads pgqueue's tables (a restore)",
						dbname, (int) restorer),
				 errdetail("No pass and no upkeep of the slots or the archive until %d s after its last statement on them, or its end.",
						   PGQ_RESTORE_GRACE_SECS)));
	else if (paused && !restore_paused)
		ereport(LOG,
				(errmsg("pgqueue scheduler: database \"%s\": pausing: a session loaded pgqueue's tables (a restore) less than %d s ago",
						dbname, PGQ_RESTORE_GRACE_SECS)));
	else if (!paused && restore_paused)
	{
		ereport(LOG,
				(errmsg("pgqueue scheduler: database \"%s\": resuming: no session has loaded pgqueue's tables for %d s",
						dbname, PGQ_RESTORE_GRACE_SECS)));
		forget_wanted = true;
	}
	restore_paused = paused;
}

/*
 * In a transaction of its own before the first pass after a pause for a
 * restore, or after pgqueue.enabled was off: forget what the
 * processes of the database learned of the tables before, since they may
 * have been written behind the API's back meanwhile (a restore's COPY of
 * the jobs, the settings, pgqueue.slots): the scan bounds and the settings
 * (shmem.c), this process's scheduling view and its notes of the slots
 * (ring.c), and every backend's view of the slots (a relcache
 * invalidation of both parents, at commit; a COPY into pgqueue.slots
 * sends none).  The extension is installed.
 */
static void
pgq_forget_tables(void)
{
	Oid			nsp = get_namespace_oid("pgqueue", false);

	pgq_restore_forget();
	pgq_schedule_forget();
	pgq_ring_forget();
	CacheInvalidateRelcacheByRelid(pgq_relid(nsp, "queue"));
	CacheInvalidateRelcacheByRelid(pgq_relid(nsp, "work_queue"));
}

/*
 * The OID of extension pgqueue in this database, or InvalidOid when it is
 * not installed; when it is, locked (ACCESS SHARE, until the end of the
 * transaction) so that a DROP EXTENSION waits for the pass instead of
 * pulling the tables from under it.  The caller is inside a transaction.
 * Taking the lock reads the pending invalidations, so a DROP committed
 * before it clears the cache and the extension is looked up again.
 */
static Oid
pgq_extension_pinned(void)
{
	for (;;)
	{
		Oid			extoid;
		uint64		gen;

		if (!ext_cache_valid)
		{
			Oid			nsp;

			/* set first: an invalidation read by the lookups clears it */
			ext_cache_valid = true;
			ext_cache_oid = get_extension_oid("pgqueue", true);
			nsp = get_namespace_oid("pgqueue", true);
			ext_cache_relid = OidIsValid(nsp) ? get_relname_relid("queue", nsp) : InvalidOid;
			if (!OidIsValid(ext_cache_oid) || !OidIsValid(ext_cache_relid))
				ext_cache_valid = false;	/* no invalidation tells of a CREATE */
		}
		extoid = ext_cache_oid;
		if (!OidIsValid(extoid))
			return InvalidOid;
		gen = ext_cache_gen;
		LockDatabaseObject(ExtensionRelationId, extoid, 0, AccessShareLock);
		if (ext_cache_gen == gen)
			return extoid;
		/* dropped (or dropped and created again) meanwhile: look again */
		UnlockDatabaseObject(ExtensionRelationId, extoid, 0, AccessShareLock);
	}
}

/* Relcache invalidation: of pgqueue.queue, or of everything (relid 0). */
static void
pgq_extension_cache_callback(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == ext_cache_relid)
	{
		ext_cache_valid = false;
		ext_cache_gen++;
	}
}
