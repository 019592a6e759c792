/*-------------------------------------------------------------------------
 *
 * admin.c
 *		The operator API of version 1.1: pgq_retry, pgq_retry_failed,
 *		pgq_cancel, pgq_purge, and pgq_push_periodic (periodic jobs from
 *		pg_cron).
 *
 * These functions exist only in 1.1 databases (pgqueue--1.1.sql and the
 * update from 1.0).  Each is SECURITY DEFINER with SET search_path =
 * pg_catalog, pg_temp and the planner settings, as the calls of api.c that
 * are not per job; every query is schema-qualified, takes values only as
 * SPI parameters and keeps its plan.
 *
 * Lock order, as in api.c: a function that touches an existing job locks
 * its pgqueue.work_queue row first and its pgqueue.queue row second.
 * pgq_cancel deletes a scheduled job's work_queue row first (waiting for a
 * holder's open ack, nack or claim), then the job; a job not in work_queue
 * is deleted with a state predicate, so that under READ COMMITTED a
 * scheduling pass that moved it meanwhile makes the delete skip it, and
 * the cancel goes round again by the work_queue path.
 *
 * Layer 5 of src/README (SQL entry points): it may call the other file of
 * its layer, the job operations (jobs.c, claim.c, schedule.c, archive.c)
 * and every layer below them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "api.h"

PG_FUNCTION_INFO_V1(pgq_retry);
PG_FUNCTION_INFO_V1(pgq_retry_failed);
PG_FUNCTION_INFO_V1(pgq_cancel);
PG_FUNCTION_INFO_V1(pgq_purge);
PG_FUNCTION_INFO_V1(pgq_push_periodic);

/* How often a statement goes round again after losing a race. */
#define PGQ_ADMIN_ATTEMPTS 10

/* The names of periodic jobs leave room for "@<period start>" in a dedup_key. */
#define PGQ_MAX_PERIODIC_NAME_BYTES (PGQ_MAX_KEY_BYTES - 32)

/* The states pgq_purge takes, and its statement for each. */
static const char *const purge_states[] = {"pending", "retry", "failed", "waiting"};

static SPIPlanPtr plan_retry = NULL;
static SPIPlanPtr plan_retry_failed = NULL;
static SPIPlanPtr plan_cancel_work = NULL;
static SPIPlanPtr plan_cancel_job = NULL;
static SPIPlanPtr plan_cancel_find = NULL;
static SPIPlanPtr plan_retention = NULL;
static SPIPlanPtr plan_purge[4] = {NULL, NULL, NULL, NULL};
static SPIPlanPtr plan_periodic_mark = NULL;
static SPIPlanPtr plan_periodic_job = NULL;
static SPIPlanPtr plan_periodic_find = NULL;

static void pgq_run_statement(void *arg);
static bool pgq_run_retrying(PgqStatement *st);
static uint64 pgq_requeued(int64 *min_np, TimestampTz *min_ra);

/* ----------------------------------------------------------------
 * Helpers
 * ----------------------------------------------------------------
 */

static void
pgq_run_statement(void *arg)
{
	PgqStatement *st = (PgqStatement *) arg;

	st->rc = pgq_execute_moving(st->plan, st->args, st->nulls);
}

/*
 * Run a statement that moves failed jobs back to pending.  It leaves out a
 * job whose dedup_key a live job holds, but a push of the same key that
 * commits after its snapshot makes it fail on queue_dedup_idx: then it runs
 * again (a new snapshot, under READ COMMITTED, sees that push and leaves
 * the job out).  Returns false when it kept failing so.
 */
static bool
pgq_run_retrying(PgqStatement *st)
{
	int			attempt;

	for (attempt = 0; attempt < PGQ_ADMIN_ATTEMPTS; attempt++)
	{
		ErrorData  *edata = pgq_subxact(pgq_run_statement, st, ERRCODE_UNIQUE_VIOLATION);

		if (edata == NULL)
		{
			if (st->rc != SPI_OK_UPDATE_RETURNING)
				elog(ERROR, "retry of failed jobs failed");
			return true;
		}
		FreeErrorData(edata);
	}
	return false;
}

/*
 * After a retry statement: the lowest key (-priority, run_after) of the
 * jobs it made pending (columns 1 and 2; column 3 is their queue, one queue
 * per statement), and how many.
 */
static uint64
pgq_requeued(int64 *min_np, TimestampTz *min_ra)
{
	uint64		i;

	*min_np = PG_INT64_MAX;
	*min_ra = DT_NOEND;
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		int64		np = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													 SPI_tuptable->tupdesc, 1, &isnull));
		TimestampTz ra = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[i],
														   SPI_tuptable->tupdesc, 2, &isnull));

		if (np < *min_np || (np == *min_np && ra < *min_ra))
		{
			*min_np = np;
			*min_ra = ra;
		}
	}
	return SPI_processed;
}

/* ----------------------------------------------------------------
 * pgq_retry, pgq_retry_failed
 * ----------------------------------------------------------------
 */

/*
 * Failed jobs back to pending, due now, tries 0, last_error kept; their
 * key in queue_ready_idx is returned.  A failed job whose dedup_key a live
 * job holds stays failed (as a push of that key would add nothing), and of
 * failed jobs sharing a dedup_key only the newest goes back.
 */
#define RETRY_SET \
	"UPDATE pgqueue.queue q" \
	"   SET state = 'pending', tries = 0, run_after = pg_catalog.now()," \
	"       version = q.version + 1"
#define RETRY_FREE_KEY(J) \
	"NOT EXISTS (SELECT 1 FROM pgqueue.queue o" \
	"             WHERE o.queue = " J ".queue AND o.dedup_key = " J ".dedup_key" \
	"               AND o.state <> 'failed')"
#define RETRY_RETURNING " RETURNING -(q.priority::bigint), q.run_after, q.queue"

static const char *const retry_sql =
RETRY_SET
" WHERE q.id = $1 AND q.state = 'failed'"
"   AND (q.dedup_key IS NULL OR " RETRY_FREE_KEY("q") ")"
RETRY_RETURNING;

static const char *const retry_failed_sql =
RETRY_SET
" WHERE q.id = ANY (ARRAY("
"         SELECT f.id FROM ("
"           SELECT f.id, f.queue, f.dedup_key,"
"                  row_number() OVER (PARTITION BY f.dedup_key ORDER BY f.id DESC) AS n"
"             FROM pgqueue.queue f"
"            WHERE f.queue = $1 AND f.state = 'failed') f"
"          WHERE f.dedup_key IS NULL OR (f.n = 1 AND " RETRY_FREE_KEY("f") ")))"
"   AND q.state = 'failed'"
RETRY_RETURNING;

/*
 * Run a retry statement and let the scheduler know about what it made
 * pending; returns how many jobs.
 */
static uint64
pgq_retry_run(SPIPlanPtr plan, Datum *args)
{
	PgqStatement st = {plan, args, NULL, 0};
	int64		np;
	TimestampTz ra;
	uint64		n;

	if (!pgq_run_retrying(&st))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not retry failed jobs: concurrent pushes kept taking their dedup_key"),
				 errhint("Retry the transaction.")));
	n = pgq_requeued(&np, &ra);
	if (n > 0)
	{
		PgqKey		key;
		bool		isnull;

		/* ready at commit (publish.c: the scheduling processes are told) */
		key.hi = np;
		key.lo = ra;
		pgq_ready_at_commit(DatumGetTextPCopy(SPI_getbinval(SPI_tuptable->vals[0],
															SPI_tuptable->tupdesc,
															3, &isnull)),
							key, PGQ_ALL_SLOTS);
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	}
	return n;
}

/*
 * pgq_retry(id uuid) returns boolean
 *
 * A failed job goes back to pending, due now, tries 0, last_error kept.
 * False when the job is not failed, does not exist, or its dedup_key is
 * held by a live job.
 */
Datum
pgq_retry(PG_FUNCTION_ARGS)
{
	Oid			type = UUIDOID;
	Datum		arg;
	uint64		n;

	pgq_require(fcinfo, 0, "id");
	arg = PG_GETARG_DATUM(0);

	SPI_connect();
	n = pgq_retry_run(pgq_keep_plan(&plan_retry, retry_sql, 1, &type), &arg);
	SPI_finish();
	PG_RETURN_BOOL(n == 1);
}

/*
 * pgq_retry_failed(queue text) returns bigint
 *
 * pgq_retry for every failed job of the queue; returns how many went back.
 */
Datum
pgq_retry_failed(PG_FUNCTION_ARGS)
{
	Oid			type = TEXTOID;
	Datum		arg = PointerGetDatum(pgq_checked_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES));
	uint64		n;

	SPI_connect();
	n = pgq_retry_run(pgq_keep_plan(&plan_retry_failed, retry_failed_sql, 1, &type), &arg);
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}

/* ----------------------------------------------------------------
 * pgq_cancel
 * ----------------------------------------------------------------
 */

#define CANCEL_RETENTION "(SELECT s.retention FROM pgqueue.queues s WHERE s.queue = q.queue)"

/* A job in work_queue: its row first (waiting for a holder), then the job. */
static const char *const cancel_work_sql =
"WITH w AS (DELETE FROM pgqueue.work_queue WHERE id = $1 RETURNING id, tries)"
" DELETE FROM pgqueue.queue q USING w WHERE q.id = w.id"
" RETURNING " PGQ_ARCHIVE_COLUMNS(CANCEL_RETENTION, "w.tries", "q.payload");

/* A job not in work_queue; skipped when a pass has moved it meanwhile. */
static const char *const cancel_job_sql =
"DELETE FROM pgqueue.queue q WHERE q.id = $1 AND q.state <> 'scheduled'"
" RETURNING " PGQ_ARCHIVE_COLUMNS(CANCEL_RETENTION, "q.tries", "q.payload");

/*
 * pgq_cancel(id uuid) returns boolean
 *
 * Removes the job, in whatever state, archived as 'cancelled' when its
 * queue keeps an archive.  A job held under a lease goes too: its holder's
 * pgq_ack, pgq_extend and pgq_nack find no row and answer false/NULL.
 * False when there is no such job (any more).
 */
Datum
pgq_cancel(PG_FUNCTION_ARGS)
{
	Oid			type = UUIDOID;
	Datum		arg;
	bool		done = false;
	bool		freed = false;
	int			attempt;

	pgq_require(fcinfo, 0, "id");
	arg = PG_GETARG_DATUM(0);

	SPI_connect();
	for (attempt = 0; attempt < PGQ_ADMIN_ATTEMPTS; attempt++)
	{
		/*
		 * Each statement takes a new snapshot under READ COMMITTED; the job
		 * row may move to slot 0 while the first waits for a holder.
		 */
		if (pgq_execute_moving(pgq_keep_plan(&plan_cancel_work, cancel_work_sql, 1, &type),
							   &arg, NULL) != SPI_OK_DELETE_RETURNING)
			elog(ERROR, "cancel failed");
		if (SPI_processed == 1)
		{
			done = freed = true;
			break;
		}
		if (pgq_execute_moving(pgq_keep_plan(&plan_cancel_job, cancel_job_sql, 1, &type),
							   &arg, NULL) != SPI_OK_DELETE_RETURNING)
			elog(ERROR, "cancel failed");
		if (SPI_processed == 1)
		{
			done = true;
			break;
		}
		/* no such job, or one that a pass scheduled meanwhile: look again */
		if (SPI_execute_plan(pgq_keep_plan(&plan_cancel_find,
										   "SELECT 1 FROM pgqueue.queue q WHERE q.id = $1",
										   1, &type),
							 &arg, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "cancel failed");
		if (SPI_processed == 0)
			break;
	}
	if (attempt == PGQ_ADMIN_ATTEMPTS)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not cancel job %s: it kept moving between states",
						DatumGetCString(DirectFunctionCall1(uuid_out, arg))),
				 errhint("Retry the transaction.")));
	if (done)
	{
		pgq_archive_spi_rows(SPI_tuptable, SPI_processed, 1, PGQ_OUTCOME_CANCELLED);
		/* rows left the indexes of every bound (bounds.c, rule 4) */
		pgq_bound_hold(PGQ_BOUND_READY);
		pgq_bound_hold(PGQ_BOUND_LEASE);
		pgq_bound_hold(PGQ_BOUND_SCHED);
	}
	SPI_finish();

	/* its waiting descendants go with it (flow.c) */
	if (done)
		pgq_flow_cancel(PointerGetDatum(construct_array(&arg, 1, UUIDOID, UUID_LEN, false,
														TYPALIGN_CHAR)),
						"cancelled");

	/*
	 * A place under the queue's max_in_flight is free at commit; a job
	 * cancelled in retry frees a place of its group (1.2)
	 */
	if (freed || done)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER | PGQ_WAKE_PLACES);
	PG_RETURN_BOOL(done);
}

/* ----------------------------------------------------------------
 * pgq_purge
 * ----------------------------------------------------------------
 */

/*
 * Delete the jobs of queue $1 in one state, archiving them as 'purged'
 * (finished $2, expires $3) when $3 is not NULL; their ids too when $4
 * (their waiting descendants are cancelled: flow.c).  The state is
 * written into each statement, so that the planner can use the partial
 * index of that state.
 */
#define PURGE_SQL(STATE) \
	"WITH d AS (" \
	"  DELETE FROM pgqueue.queue q WHERE q.queue = $1 AND q.state = '" STATE "'" \
	"  RETURNING q.id, q.queue, q.payload, q.priority, q.tries, q.created, q.last_error)," \
	" a AS (" \
	"  INSERT INTO pgqueue.archive (id, queue, payload, priority, tries, created," \
	"                               finished, outcome, last_error, expires)" \
	"  SELECT d.id, d.queue, d.payload, d.priority, d.tries, d.created," \
	"         $2, 'purged', d.last_error, $3" \
	"    FROM d WHERE $3 IS NOT NULL)" \
	" SELECT count(*), array_agg(d.id) FILTER (WHERE $4) FROM d"

static const char *const purge_sql[4] = {
	PURGE_SQL("pending"), PURGE_SQL("retry"), PURGE_SQL("failed"), PURGE_SQL("waiting")
};

/*
 * pgq_purge(queue text, state text DEFAULT 'failed') returns bigint
 *
 * Removes every job of the queue in state pending, retry, failed or (1.2)
 * waiting (another state is 22023); returns how many.  Archived as
 * 'purged' when the queue keeps an archive; their waiting descendants are
 * cancelled (flow.c).  Jobs in work_queue are not touched: cancel them
 * one by one.
 */
Datum
pgq_purge(PG_FUNCTION_ARGS)
{
	Oid			rtype = TEXTOID;
	Oid			types[4] = {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, BOOLOID};
	Datum		args[4];
	char		nulls[4] = {' ', ' ', 'n', ' '};
	Datum		purged = (Datum) 0;
	bool		flows;
	MemoryContext caller = CurrentMemoryContext;
	char	   *state;
	int			s;
	bool		isnull;
	int64		retention = 0;
	int64		n;

	args[0] = PointerGetDatum(pgq_checked_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES));
	pgq_require(fcinfo, 1, "state");
	state = text_to_cstring(PG_GETARG_TEXT_PP(1));
	for (s = 0; s < lengthof(purge_states); s++)
		if (strcmp(state, purge_states[s]) == 0)
			break;
	if (s == lengthof(purge_states) || (s == 3 && pgq_layout() < PGQ_V12))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot purge jobs in state \"%s\"", state),
				 errdetail("pgq_purge removes jobs in state pending, retry, failed or waiting (1.2)."),
				 errhint("Use pgq_cancel for a job that is scheduled or running.")));
	/*
	 * The ids are kept whenever flows may exist (1.2): whether an edge names
	 * them is known only after the DELETE, which waits for the pushes that
	 * lock them (pgq_flow_cancel looks at pgqueue.job_parents then).
	 */
	flows = pgq_layout() >= PGQ_V12;
	args[3] = BoolGetDatum(flows);

	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_retention,
									   "SELECT s.retention FROM pgqueue.queues s WHERE s.queue = $1",
									   1, &rtype),
						 args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "purge failed");
	if (SPI_processed == 1)
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		retention = pgq_retention_usecs(d, isnull);
	}
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	if (retention > 0)
	{
		args[2] = TimestampTzGetDatum(DatumGetTimestampTz(args[1]) + retention);
		nulls[2] = ' ';
		pgq_archive_cover(DatumGetTimestampTz(args[2]));
	}
	if (pgq_execute_moving(pgq_keep_plan(&plan_purge[s], purge_sql[s], 4, types),
						   args, nulls) != SPI_OK_SELECT)
		elog(ERROR, "purge failed");
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (flows && n > 0)
	{
		/* into the caller's memory, past SPI_finish */
		MemoryContext spicxt = MemoryContextSwitchTo(caller);

		purged = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
		purged = PointerGetDatum(DatumGetArrayTypePCopy(purged));
		MemoryContextSwitchTo(spicxt);
	}
	SPI_finish();
	if (n > 0)
		pgq_bound_hold(PGQ_BOUND_SCHED);	/* ready jobs left (bounds.c, rule 4) */
	/* jobs purged in retry held places of their groups (1.2) */
	if (n > 0 && s == 1)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER | PGQ_WAKE_PLACES);
	if (purged != (Datum) 0)
		pgq_flow_cancel(purged, "purged");
	PG_RETURN_INT64(n);
}

/* ----------------------------------------------------------------
 * pgq_push_periodic
 * ----------------------------------------------------------------
 */

/*
 * The start of the period of length period_usecs that holds t, periods
 * counted from 2000-01-01 00:00 UTC (date_bin with that origin).
 */
static TimestampTz
pgq_period_start(TimestampTz t, int64 period_usecs)
{
	int64		r = t % period_usecs;

	return r < 0 ? t - r - period_usecs : t - r;
}

/* "name@YYYY-MM-DDTHH:MM:SS[.ffffff]Z": the dedup_key of a period (UTC). */
static char *
pgq_period_key(const char *name, TimestampTz start)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (timestamp2tm(start, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	if (fsec != 0)
		return psprintf("%s@%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
						name, tm.tm_year, tm.tm_mon, tm.tm_mday,
						tm.tm_hour, tm.tm_min, tm.tm_sec, fsec);
	return psprintf("%s@%04d-%02d-%02dT%02d:%02d:%02dZ",
					name, tm.tm_year, tm.tm_mon, tm.tm_mday,
					tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/*
 * pgq_push_periodic(queue text, name text, period interval,
 *                   payload jsonb DEFAULT '{}', priority int DEFAULT 0)
 * returns uuid
 *
 * Pushes the job of the current period of the periodic job (queue, name),
 * unless it was pushed already: at most one job per period, however often
 * the period fires (pg_cron calls this on its schedule).  The job's
 * dedup_key is "name@<period start>"; pgqueue.periodic keeps the period
 * last pushed, so that a firing after the period's job has finished does
 * not push it again.  Returns the period's job, or NULL when a later
 * period was pushed already.
 */
Datum
pgq_push_periodic(PG_FUNCTION_ARGS)
{
	Oid			mtypes[3] = {TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Oid			jtypes[4] = {TEXTOID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
	Datum		args[4];
	char	   *queue = pgq_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES);
	char	   *name = pgq_text_arg(fcinfo, 1, "name", PGQ_MAX_PERIODIC_NAME_BYTES);
	int64		period;
	TimestampTz start;
	pg_uuid_t  *job = NULL;
	bool		mine;

	period = pgq_length_arg(fcinfo, 2, "period", USECS_PER_SEC, PGQ_MAX_PERIOD_USECS,
							"1 second and 365 days", "30 days");
	pgq_require(fcinfo, 3, "payload");
	pgq_require(fcinfo, 4, "priority");

	start = pgq_period_start(GetCurrentTransactionStartTimestamp(), period);
	args[0] = CStringGetTextDatum(queue);
	args[1] = CStringGetTextDatum(name);
	args[2] = TimestampTzGetDatum(start);

	/*
	 * Mark the period as pushed.  A concurrent firing of the same period
	 * waits here for this transaction and then finds the mark.
	 */
	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_periodic_mark,
									   "INSERT INTO pgqueue.periodic AS p (queue, name, period_start)"
									   " VALUES ($1, $2, $3)"
									   " ON CONFLICT (queue, name) DO UPDATE"
									   "   SET period_start = excluded.period_start, job = NULL"
									   " WHERE p.period_start < excluded.period_start",
									   3, mtypes),
						 args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "periodic push failed");
	mine = (SPI_processed == 1);
	if (!mine)
	{
		/* pushed already: the job of this period, if it is the last one */
		if (SPI_execute_plan(pgq_keep_plan(&plan_periodic_find,
										   "SELECT p.job FROM pgqueue.periodic p"
										   " WHERE p.queue = $1 AND p.name = $2 AND p.period_start = $3",
										   3, mtypes),
							 args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "periodic push failed");
		if (SPI_processed == 1)
		{
			bool		isnull;
			Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

			if (!isnull)
			{
				job = SPI_palloc(sizeof(pg_uuid_t));
				memcpy(job, DatumGetUUIDP(d), sizeof(pg_uuid_t));
			}
		}
	}
	SPI_finish();

	if (mine)
	{
		LOCAL_FCINFO(push, 5);

		/* pgq_push(queue, payload, NULL, priority, dedup_key) */
		InitFunctionCallInfoData(*push, NULL, 5, InvalidOid, NULL, NULL);
		push->args[0].value = args[0];
		push->args[0].isnull = false;
		push->args[1].value = PG_GETARG_DATUM(3);
		push->args[1].isnull = false;
		push->args[2].value = (Datum) 0;
		push->args[2].isnull = true;
		push->args[3].value = PG_GETARG_DATUM(4);
		push->args[3].isnull = false;
		push->args[4].value = CStringGetTextDatum(pgq_period_key(name, start));
		push->args[4].isnull = false;
		job = DatumGetUUIDP(pgq_push(push));

		args[3] = UUIDPGetDatum(job);
		SPI_connect();
		if (SPI_execute_plan(pgq_keep_plan(&plan_periodic_job,
										   "UPDATE pgqueue.periodic SET job = $4"
										   " WHERE queue = $1 AND name = $2 AND period_start = $3",
										   4, jtypes),
							 args, NULL, false, 0) != SPI_OK_UPDATE || SPI_processed != 1)
			elog(ERROR, "periodic push failed");
		SPI_finish();
	}

	if (job == NULL)
		PG_RETURN_NULL();
	PG_RETURN_UUID_P(job);
}
