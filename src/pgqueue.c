/*-------------------------------------------------------------------------
 *
 * pgqueue.c
 *		Entry point of the pgqueue extension: defines the GUCs (over
 *		variables that the files using them own), installs the shared
 *		memory hooks and the utility hook, registers the transaction
 *		callbacks and the launcher background worker.
 *
 * The SQL functions work whether or not the library is preloaded.  With
 * shared_preload_libraries = 'pgqueue' we also get shared memory (counters,
 * wake-on-commit, blocking claims) and the launcher, which starts one
 * scheduler per database named in pgqueue.database (launcher.c).
 *
 * Layer 7 of src/README (the module, on top): it may call every other
 * file.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/guc.h"

#include "pgqueue.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static void pgq_register_launcher(void);

/*
 * Module load.  Defines the GUCs every backend needs; the postmaster-only
 * parts (pgqueue.database, shared memory, workers) only when preloading,
 * because defining a PGC_POSTMASTER variable after startup is not allowed.
 */
void
_PG_init(void)
{
	DefineCustomIntVariable("pgqueue.naptime",
							"Time the scheduler sleeps when a pass found less than a full batch.",
							"Commits that push jobs wake the scheduler earlier.",
							&pgqueue_naptime,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pgqueue.batch_size",
							"Maximum number of jobs the scheduler moves in one pass.",
							NULL,
							&pgqueue_batch_size,
							100, 1, PGQ_MAX_ITEMS,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("pgqueue.enabled",
							 "Whether the scheduler background workers schedule jobs.",
							 "When off, the schedulers stay up but schedule nothing.",
							 &pgqueue_enabled,
							 true,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("pgqueue.max_payload_size",
							"Largest payload pgq_push accepts.",
							NULL,
							&pgqueue_max_payload_kb,
							16 * 1024, 1, 1024 * 1024,
							PGC_SUSET,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pgqueue.slot_size",
							"Size at which the scheduler starts a new slot of pgqueue.work_queue.",
							"Rows go to the newest slot; a slot whose rows are all gone is truncated.",
							&pgqueue_slot_size_kb,
							1024, 64, 1024 * 1024,
							PGC_SIGHUP,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	if (process_shared_preload_libraries_in_progress)
	{
		DefineCustomStringVariable("pgqueue.database",
								   "Comma-separated list of databases that get a scheduler.",
								   NULL,
								   &pgqueue_database,
								   "postgres",
								   PGC_POSTMASTER,
								   0,
								   NULL, NULL, NULL);
	}

	/*
	 * Every backend publishes wake-ups and counters at commit, and a
	 * scheduling pass that rolled back, with its transaction or a
	 * subtransaction, is forgotten (schedule.c).
	 */
	pgq_xact_callbacks_register(pgq_schedule_at_xact_end);
	RegisterSubXactCallback(pgq_schedule_subxact_callback, NULL);

	if (!process_shared_preload_libraries_in_progress)
		return;

	/*
	 * Only when preloading, as pg_stat_statements does: a library loaded
	 * later by a backend would otherwise remove (with a WARNING) a
	 * pgqueue.database left in postgresql.conf, which it does not define.
	 */
	MarkGUCPrefixReserved("pgqueue");

	pgq_shmem_install_hooks();
	pgq_hook_install();
	pgq_register_launcher();
}

/*
 * Register the launcher, the one static background worker: it starts the
 * schedulers as dynamic workers once their databases exist (launcher.c).
 * Registered to start when recovery has finished: nothing of pgqueue runs
 * on a hot standby, and all of it starts after promotion.  Restarted a
 * second after a crash or an error exit.
 */
static void
pgq_register_launcher(void)
{
	BackgroundWorker worker;
	List	   *names = pgq_database_list();

	if (list_length(names) > PGQ_MAX_DATABASES)
		ereport(WARNING,
				(errmsg("pgqueue supports at most %d databases, ignoring \"%s\" and the rest",
						PGQ_MAX_DATABASES, (char *) list_nth(names, PGQ_MAX_DATABASES))));

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pgqueue");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "pgq_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pgqueue launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pgqueue launcher");
	worker.bgw_main_arg = (Datum) 0;
	worker.bgw_notify_pid = 0;
	RegisterBackgroundWorker(&worker);
}
