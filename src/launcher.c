/*-------------------------------------------------------------------------
 *
 * launcher.c
 *		The launcher: pgqueue's one static background worker.  It starts a
 *		scheduler (worker.c) per database named in pgqueue.database, as a
 *		dynamic background worker, once that database exists, and starts it
 *		again when it stops.
 *
 * Why a launcher.  A scheduler must connect to its database, and a process
 * can connect only once.  A static scheduler whose database does not exist
 * (yet), or does not allow connections, fails at every start, once a second
 * forever; so each scheduler used to connect to no database first, look its
 * database up, and exit with code 1 to be restarted straight into it: one
 * "background worker ... exited with exit code 1" per database at every
 * start of the server.  The launcher connects to no database and reads the
 * shared catalog pg_database (as the autovacuum launcher does); it starts a
 * scheduler, connecting by OID, only when its database exists and allows
 * connections.  A database that does not gets one LOG line, and a look every
 * second until it does.
 *
 * The schedulers are registered with BGW_NEVER_RESTART and with the
 * launcher as bgw_notify_pid, so the postmaster tells the launcher (SIGUSR1,
 * which sets its latch) when one starts or stops, as autoprewarm's leader
 * is told of its per-database workers.  One that stopped is started again
 * at once, or one second after its previous start if it ran less than that
 * (a scheduler that fails at once is not restarted in a tight loop).  A
 * crash of any process makes the postmaster reset shared memory and forget
 * the dynamic workers (BGW_NEVER_RESTART); it restarts the launcher, which
 * starts the schedulers again.
 *
 * SIGTERM.  The launcher and the schedulers exit with code 0, which the
 * postmaster logs at DEBUG1 only: a shutdown logs nothing of pgqueue (die()
 * would log a FATAL and exit with code 1, logged as "exited with exit code
 * 1").  Code 0 also tells the postmaster not to restart the process.  For a
 * scheduler that is what we want: the launcher restarts it, so a
 * pg_terminate_backend of a scheduler still gets it restarted at once.  For
 * the launcher, a SIGTERM that is not part of a shutdown (the launcher
 * cannot tell) must not leave the server without one: before exiting it
 * registers its replacement, a dynamic worker running this same code.  The
 * postmaster starts it at once on a running server, and never during a
 * shutdown (it starts no worker then).  The replacement is restarted after a
 * crash (bgw_restart_time), since the static launcher it replaced has been
 * forgotten.  A launcher that starts finds the schedulers its predecessor
 * started in shared memory (pgq_scheduler_running); only their starter is
 * told when they stop, so it looks at those every second.
 *
 * Holds.  A backend that runs CREATE DATABASE from a database of
 * pgqueue.database, or ALTER DATABASE ... RENAME, ALTER DATABASE ... SET
 * TABLESPACE or DROP DATABASE on one, holds its scheduler off while the
 * command runs (hook.c): the launcher does not start it until the hold is
 * released, which sets the launcher's latch, or until the holding backend
 * is gone (a hold of a backend that died is released here).
 *
 * Layer 6 of src/README (processes and hooks): it may call the other
 * files of its layer, the SQL entry points (api.c, admin.c) and every
 * layer below them.
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
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "pgqueue.h"

/* How often the launcher looks again at what it is not told about. */
#define PGQ_LAUNCHER_RECHECK_MS 1000

/* A scheduler is started at most once a second per database. */
#define PGQ_RESTART_MS 1000

/* pgqueue.database: the databases that get a scheduler (pgq_database_list) */
char	   *pgqueue_database = NULL;

/* What pg_database says of a database. */
typedef enum PgqDbState
{
	PGQ_DB_MISSING,				/* no such database */
	PGQ_DB_NOCONN,				/* datallowconn is false */
	PGQ_DB_OK
} PgqDbState;

/* What the launcher keeps per entry of pgqueue.database. */
typedef struct PgqLaunchedDb
{
	const char *name;
	BackgroundWorkerHandle *handle; /* the scheduler it started, or NULL */
	TimestampTz started;		/* when it last started one; 0: never */
	bool		had_scheduler;	/* one ran since the database was last found */
	PgqDbState	logged;			/* the state last logged */
	bool		slot_warned;	/* logged that no worker slot was free */
} PgqLaunchedDb;

static long pgq_launcher_tend(PgqLaunchedDb *db, int dbindex);
static PgqDbState pgq_database_state(const char *dbname, Oid *dboid);
static bool pgq_start_scheduler(PgqLaunchedDb *db, int dbindex, Oid dboid);
static void pgq_launcher_replace(void);

/*
 * Split pgqueue.database into a list of palloc'd names: comma-separated,
 * surrounding white space trimmed, empty entries ignored, case kept (unlike
 * SplitIdentifierString, so "MyDb" names the database MyDb).
 */
List *
pgq_database_list(void)
{
	List	   *names = NIL;
	char	   *p = pstrdup(pgqueue_database ? pgqueue_database : "");

	while (*p)
	{
		char	   *end = strchr(p, ',');
		char	   *last;

		if (end)
			*end = '\0';
		while (*p == ' ' || *p == '\t')
			p++;
		last = p + strlen(p);
		while (last > p && (last[-1] == ' ' || last[-1] == '\t'))
			*--last = '\0';
		if (*p)
			names = lappend(names, p);
		if (!end)
			break;
		p = end + 1;
	}
	return names;
}

/*
 * Entry point of the launcher.  Connects to no database; runs until
 * SIGTERM, then registers its replacement and exits with code 0.
 */
void
pgq_launcher_main(Datum main_arg)
{
	List	   *names = pgq_database_list();
	int			ndb = Min(list_length(names), PGQ_MAX_DATABASES);
	PgqLaunchedDb *dbs;
	int			i;

	pgq_is_pgqueue_process = true;
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgq_launcher_attach();		/* a released hold sets its latch (shmem.c) */

	dbs = MemoryContextAllocZero(TopMemoryContext,
								 sizeof(PgqLaunchedDb) * Max(ndb, 1));
	for (i = 0; i < ndb; i++)
	{
		dbs[i].name = MemoryContextStrdup(TopMemoryContext, list_nth(names, i));
		dbs[i].logged = PGQ_DB_OK;
	}

	while (!ShutdownRequestPending)
	{
		long		timeout = -1;	/* -1: until the latch is set */

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		for (i = 0; i < ndb && !ShutdownRequestPending; i++)
		{
			long		wait = pgq_launcher_tend(&dbs[i], i);

			if (wait >= 0 && (timeout < 0 || wait < timeout))
				timeout = wait;
		}
		if (ShutdownRequestPending)
			break;

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_EXIT_ON_PM_DEATH |
						 (timeout >= 0 ? WL_TIMEOUT : 0),
						 timeout,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}

	pgq_launcher_replace();
	proc_exit(0);
}

/*
 * See to the scheduler of database db (index dbindex in pgqueue.database):
 * start it when it is not running and its database exists.  Returns in how
 * many milliseconds to look again without being told (-1: only when the
 * postmaster says the scheduler stopped).
 */
static long
pgq_launcher_tend(PgqLaunchedDb *db, int dbindex)
{
	TimestampTz now;
	Oid			dboid;
	PgqDbState	state;

	if (db->handle != NULL)
	{
		pid_t		pid;
		BgwHandleStatus status = GetBackgroundWorkerPid(db->handle, &pid);

		if (status == BGWH_STARTED || status == BGWH_NOT_YET_STARTED)
			return -1;			/* the postmaster tells us when it stops */
		pfree(db->handle);
		db->handle = NULL;
	}

	/* one that a launcher before this one started: nobody tells us */
	if (pgq_scheduler_running(dbindex) != 0)
	{
		db->had_scheduler = true;
		return PGQ_LAUNCHER_RECHECK_MS;
	}

	/*
	 * Held off by a backend that runs CREATE DATABASE from it, or ALTER or
	 * DROP DATABASE on it (hook.c): not started until the hold is released,
	 * which sets our latch, or its backend is gone.
	 */
	if (pgq_hold_holder(dbindex) != 0)
		return PGQ_LAUNCHER_RECHECK_MS;

	now = GetCurrentTimestamp();
	if (db->started != 0 &&
		!TimestampDifferenceExceeds(db->started, now, PGQ_RESTART_MS))
		return TimestampDifferenceMilliseconds(now,
											   TimestampTzPlusMilliseconds(db->started,
																		   PGQ_RESTART_MS));

	state = pgq_database_state(db->name, &dboid);
	if (state == PGQ_DB_OK)
	{
		/*
		 * A DROP DATABASE in progress holds its database's lock until it
		 * commits, and terminates the scheduler first (WITH (FORCE), or as
		 * it waits for the other sessions to go), as does ALTER DATABASE
		 * ... RENAME (whose hold on the scheduler, hook.c, ends before it
		 * commits): wait for it, and look again, lest the scheduler started
		 * meanwhile fail to connect to a database that is gone (a FATAL and
		 * an "exited with exit code 1") or run under a name that
		 * pgqueue.database does not give.
		 */
		StartTransactionCommand();
		LockSharedObject(DatabaseRelationId, dboid, 0, AccessShareLock);
		CommitTransactionCommand();
		state = pgq_database_state(db->name, &dboid);
	}
	if (state != PGQ_DB_OK)
	{
		if (state != db->logged && state == PGQ_DB_MISSING && db->had_scheduler)
			ereport(LOG,
					(errmsg("pgqueue launcher: database \"%s\" named in pgqueue.database does not exist",
							db->name),
					 errdetail("It was dropped or renamed while its scheduler ran."),
					 errhint("For a scheduler under its new name, change pgqueue.database and restart the server.")));
		else if (state != db->logged && state == PGQ_DB_MISSING)
			ereport(LOG,
					(errmsg("pgqueue launcher: database \"%s\" named in pgqueue.database does not exist",
							db->name),
					 errhint("Create the database; its scheduler starts within a second or two.")));
		else if (state != db->logged)
			ereport(LOG,
					(errmsg("pgqueue launcher: database \"%s\" named in pgqueue.database does not allow connections",
							db->name),
					 errhint("Its scheduler starts within a second or two of ALTER DATABASE ... ALLOW_CONNECTIONS true.")));
		db->logged = state;
		db->had_scheduler = false;
		return PGQ_LAUNCHER_RECHECK_MS;
	}
	db->logged = PGQ_DB_OK;

	if (db->had_scheduler)
		ereport(LOG,
				(errmsg("pgqueue launcher: the scheduler of database \"%s\" stopped; starting it again",
						db->name)));
	if (!pgq_start_scheduler(db, dbindex, dboid))
		return PGQ_LAUNCHER_RECHECK_MS;
	db->had_scheduler = true;
	return -1;
}

/*
 * What pg_database says of database dbname; its OID in *dboid when it
 * exists.  Reads pg_database with a plain heap scan, as the autovacuum
 * launcher does: without a database we cannot use the catalog caches.
 */
static PgqDbState
pgq_database_state(const char *dbname, Oid *dboid)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	PgqDbState	result = PGQ_DB_MISSING;

	*dboid = InvalidOid;
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (result == PGQ_DB_MISSING &&
		   HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (strcmp(NameStr(db->datname), dbname) == 0)
		{
			*dboid = db->oid;
			result = db->datallowconn ? PGQ_DB_OK : PGQ_DB_NOCONN;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return result;
}

/*
 * Start the scheduler of database db (index dbindex, OID dboid) as a
 * dynamic background worker that the postmaster never restarts by itself
 * and whose start and stop it tells this process.  False when no worker
 * slot is free (max_worker_processes): said once, tried again every second.
 */
static bool
pgq_start_scheduler(PgqLaunchedDb *db, int dbindex, Oid dboid)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	MemoryContext oldcxt;
	bool		ok;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pgqueue");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "pgq_scheduler_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pgqueue scheduler for %s", db->name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "pgqueue scheduler");
	worker.bgw_main_arg = Int32GetDatum(dbindex);
	memcpy(worker.bgw_extra, &dboid, sizeof(Oid));
	worker.bgw_notify_pid = MyProcPid;

	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	ok = RegisterDynamicBackgroundWorker(&worker, &handle);
	MemoryContextSwitchTo(oldcxt);
	if (!ok)
	{
		if (!db->slot_warned)
			ereport(WARNING,
					(errmsg("pgqueue launcher: no background worker slot free for the scheduler of database \"%s\"",
							db->name),
					 errhint("Raise max_worker_processes; the launcher tries again every second.")));
		db->slot_warned = true;
		return false;
	}
	db->slot_warned = false;
	db->handle = handle;
	db->started = GetCurrentTimestamp();
	return true;
}

/*
 * Register a new launcher to take over from this one, which is exiting
 * after SIGTERM (see the file header).  The postmaster starts it when the
 * server runs; during a shutdown it never does.
 */
static void
pgq_launcher_replace(void)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memcpy(&worker, MyBgworkerEntry, sizeof(worker));
	worker.bgw_restart_time = 1;
	worker.bgw_notify_pid = 0;
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		ereport(LOG,
				(errmsg("pgqueue launcher: no background worker slot free for a new launcher"),
				 errdetail("The running schedulers go on; one that stops is started again after the next server restart.")));
}
