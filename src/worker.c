/*-------------------------------------------------------------------------
 *
 * worker.c
 *		The scheduler background worker: one per database named in
 *		pgqueue.database, running scheduling passes.
 *
 * Each pass is its own transaction.  After a full pass the next runs at
 * once; otherwise the worker sleeps pgqueue.naptime, or less when a commit
 * that pushed jobs sets its latch (see shmem.c).  It does nothing while the
 * extension is not installed in its database or pgqueue.enabled is off.  It
 * is registered with BgWorkerStart_RecoveryFinished, so on a hot standby it
 * does not run at all and the postmaster starts it after promotion.
 *
 * A database named in pgqueue.database that does not exist must not make
 * the worker fail at connection time once a second forever.  So a worker
 * first connects to no database and looks its database up in the shared
 * catalog; when it is missing it says so once and checks again every
 * second.  Once found, it records that in shared memory and exits to be
 * restarted straight into the database (a backend can connect only once).
 * The record is cleared before every connection attempt, so a database
 * dropped later sends the next start back to the checking path.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "pgqueue.h"

/* How often a worker whose database is missing looks again. */
#define PGQ_DB_RECHECK_MS 1000

/*
 * A wake-up within PGQ_GATHER_WINDOW_MS of the end of a pass that moved
 * more than one job waits PGQ_GATHER_MS before the next pass (see the main
 * loop).  Measured with 2 producers and 4 consumers: 280 passes/s of about
 * 5 jobs with a 2 ms wait, 125 passes/s and 17 % more jobs finished with
 * 6 ms.
 */
#define PGQ_GATHER_WINDOW_MS 5
#define PGQ_GATHER_MS 6

PGDLLEXPORT void pgq_scheduler_main(Datum main_arg);

static void pgq_wait_for_database(int dbindex, const char *dbname);
static int	pgq_database_exists(const char *dbname);
static int	pgq_run_pass(void);

/*
 * Entry point of a scheduler.  main_arg is the index of its database in
 * pgqueue.database.
 */
void
pgq_scheduler_main(Datum main_arg)
{
	int			dbindex = DatumGetInt32(main_arg);
	List	   *names = pgq_database_list();
	char	   *dbname;
	bool		extension_seen = false;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	if (dbindex < 0 || dbindex >= list_length(names))
		proc_exit(0);			/* pgqueue.database changed under us */
	dbname = list_nth(names, dbindex);

	if (!pgq_db_known(dbindex, -1))
		pgq_wait_for_database(dbindex, dbname);		/* does not return */

	/* forget the database until the connection succeeds */
	pgq_db_known(dbindex, 0);
	BackgroundWorkerInitializeConnection(dbname, NULL, 0);
	pgq_db_known(dbindex, 1);

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

	ereport(LOG,
			(errmsg("pgqueue scheduler started for database \"%s\"", dbname)));

	for (;;)
	{
		int			moved = -1;
		int			batch_size;
		int			rc;
		TimestampTz last_pass_end;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		batch_size = pgqueue_batch_size;	/* what this pass will use */

		if (pgqueue_enabled)
		{
			MemoryContext oldcxt = CurrentMemoryContext;

			/* an error in a pass is logged; the loop goes on */
			PG_TRY();
			{
				moved = pgq_run_pass();
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

			if (moved == -2 && extension_seen)
				ereport(LOG,
						(errmsg("pgqueue scheduler: extension pgqueue is not installed in database \"%s\" any more; waiting for it",
								dbname)));
			extension_seen = (moved != -2);
		}

		/* a full pass: there is probably more, go again at once */
		if (moved >= batch_size)
			continue;

		last_pass_end = GetCurrentTimestamp();
		rc = WaitLatch(MyLatch,
					   WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					   pgqueue_naptime,
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
		if ((rc & WL_LATCH_SET) && moved > 1 &&
			!TimestampDifferenceExceeds(last_pass_end, GetCurrentTimestamp(),
										PGQ_GATHER_WINDOW_MS))
		{
			(void) WaitLatch(MyLatch, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 PGQ_GATHER_MS, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
		}
	}
}

/*
 * One scheduling pass in its own transaction.  Returns how many jobs it
 * moved, or -2 when the extension is not installed in this database.
 */
static int
pgq_run_pass(void)
{
	int			moved = -2;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());

	if (OidIsValid(get_extension_oid("pgqueue", true)))
	{
		pgstat_report_activity(STATE_RUNNING, "pgqueue scheduling pass");
		pgq_archive_maintain();	/* archive partitions, once a minute (archive.c) */
		SPI_connect();
		moved = pgq_schedule_pass(pgqueue_batch_size);
		SPI_finish();
		pgq_count_now(PGQ_PASSES, 1);
	}

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return moved;
}

/*
 * Whether database dbname exists: 1, or 0 when it does not, or -1 when it
 * exists but does not allow connections (datallowconn; connecting would fail
 * at every restart).  Reads pg_database with a plain heap scan, as the
 * autovacuum launcher does: without a database we cannot use the catalog
 * caches.
 */
static int
pgq_database_exists(const char *dbname)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	bool		found = false;
	int			result = 0;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (!found && HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		found = (strcmp(NameStr(db->datname), dbname) == 0);
		if (found)
			result = db->datallowconn ? 1 : -1;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return result;
}

/*
 * Wait, connected to no database, until database dbname exists; then
 * record that and exit so that the postmaster restarts this worker, which
 * then connects to it.  Logs once that the database is missing.
 */
static void
pgq_wait_for_database(int dbindex, const char *dbname)
{
	int			logged = 1;		/* what was last logged: 0 or -1 */

	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	for (;;)
	{
		int			state;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		state = pgq_database_exists(dbname);

		if (state > 0)
		{
			pgq_db_known(dbindex, 1);
			proc_exit(1);		/* restart connected to the database */
		}
		if (state != logged && state == 0)
			ereport(LOG,
					(errmsg("pgqueue scheduler: database \"%s\" named in pgqueue.database does not exist",
							dbname),
					 errhint("Create the database; its scheduler starts within seconds.")));
		else if (state != logged)
			ereport(LOG,
					(errmsg("pgqueue scheduler: database \"%s\" named in pgqueue.database does not allow connections",
							dbname),
					 errhint("Its scheduler starts within seconds of ALTER DATABASE ... ALLOW_CONNECTIONS true.")));
		logged = state;

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 PGQ_DB_RECHECK_MS,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
