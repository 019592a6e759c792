/*-------------------------------------------------------------------------
 *
 * common.c
 *		The helpers of every layer of pgqueue: SPI (kept plans, the settings
 *		of the calls without SET clauses, pgqueue's own DDL), statements
 *		run in a subtransaction (one that met a row being moved, a step of
 *		the upkeep), interval arithmetic, and the checks of the SQL
 *		functions' arguments.
 *
 * Layer 1 of src/README (common helpers), the bottom: it calls no other
 * file of pgqueue.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/int.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "common.h"

/* How long a step of the upkeep waits for a lock, at most (pgq_upkeep_try). */
#define PGQ_UPKEEP_LOCK_TIMEOUT_MS "100"

/* How often a statement that met a moving row runs (pgq_execute_moving). */
#define PGQ_MOVING_ATTEMPTS 10

/*
 * pgqueue.enabled: whether the schedulers schedule; read also where a
 * scheduler that is off is spared work (publish.c), or left it
 * (pgq_schedule in api.c)
 */
bool		pgqueue_enabled = true;

/* Depth of pgq_spi_ddl calls under way in this backend. */
static int	own_ddl_depth = 0;

/* ----------------------------------------------------------------
 * SPI
 * ----------------------------------------------------------------
 */

/*
 * Run one statement of pgqueue's own DDL (a slot or archive partition made,
 * truncated, attached or dropped) through SPI; returns SPI_execute's code.
 * While it runs, the utility hook does not take the statement for a
 * restore (hook.c: pgq_in_own_ddl).  The caller is connected to SPI.
 */
int
pgq_spi_ddl(const char *sql)
{
	int			rc;

	own_ddl_depth++;
	PG_TRY();
	{
		rc = SPI_execute(sql, false, 0);
	}
	PG_FINALLY();
	{
		own_ddl_depth--;
	}
	PG_END_TRY();
	return rc;
}

/* Whether a statement runs for pgq_spi_ddl (the utility hook asks). */
bool
pgq_in_own_ddl(void)
{
	return own_ddl_depth > 0;
}

/*
 * Return the kept plan in *cache, preparing and keeping it first if needed.
 * The caller must be connected to SPI.
 *
 * The plan is always generic (CURSOR_OPT_GENERIC_PLAN): the plan cache would
 * otherwise re-plan these multi-CTE statements on most calls, which costs
 * more than running them.  Every statement is written so that its generic
 * plan is the right one (index probes driven by LIMIT and "= ANY (ARRAY())").
 */
SPIPlanPtr
pgq_keep_plan(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes)
{
	if (*cache == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, argtypes,
											  CURSOR_OPT_GENERIC_PLAN);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*cache = plan;
	}
	return *cache;
}

/*
 * SPI_connect for the functions without SET clauses (the per-job calls,
 * whose C paths resolve no name through search_path; pgqueue--1.1.sql):
 * their SQL statements, which run on rare paths only (a dedup push, a
 * steal), get what the SET clauses give the others: search_path =
 * pg_catalog, pg_temp, so that nothing on the caller's search_path can
 * hijack an operator or function, and the planner settings of their kept
 * plans.  Returns the GUC nest level for pgq_spi_finish.
 */
int
pgq_spi_connect(void)
{
	int			nest;

	SPI_connect();
	nest = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_seqscan", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_bitmapscan", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("jit", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	return nest;
}

/* End what pgq_spi_connect began. */
void
pgq_spi_finish(int nest)
{
	AtEOXact_GUC(true, nest);
	SPI_finish();
}

/* ----------------------------------------------------------------
 * Subtransactions
 * ----------------------------------------------------------------
 */

/*
 * Run fn(arg) in a subtransaction.  Returns NULL when it succeeded.  An
 * error with SQLSTATE catch_code (with 0: any error but a query cancel) is
 * rolled back with the subtransaction and returned, copied; any other is
 * thrown on.  The caller may be connected to SPI: results of statements
 * run by fn survive a successful return.
 */
ErrorData *
pgq_subxact(void (*fn) (void *), void *arg, int catch_code)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	ErrorData  *edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();

		/*
		 * Rolled back before an error is thrown on, as PL/pgSQL's blocks do:
		 * a caller's pgq_subxact that catches it then rolls back its own.
		 */
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		if (catch_code != 0 ? edata->sqlerrcode != catch_code
			: edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
			ReThrowError(edata);
	}
	PG_END_TRY();
	return edata;
}

/*
 * Run a step of a background upkeep (the archive's partitions, the rings
 * of slots) in a subtransaction, waiting at most PGQ_UPKEEP_LOCK_TIMEOUT_MS
 * for any lock (lock_timeout: relations, rows, the catalog alike), so that
 * the scheduler never stalls behind a session that holds one: an error is
 * reported as a WARNING, or at DEBUG1 for a lock not obtained in time or
 * a serialization failure (the next try does not meet them), with hint,
 * and rolled back; the caller goes on.  A query cancel is thrown on.
 */
void
pgq_upkeep_try(void (*fn) (void *), void *arg, const char *what, const char *hint)
{
	int			nest = NewGUCNestLevel();
	ErrorData  *edata;

	(void) set_config_option("lock_timeout", PGQ_UPKEEP_LOCK_TIMEOUT_MS,
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	edata = pgq_subxact(fn, arg, 0);
	AtEOXact_GUC(true, nest);

	if (edata == NULL)
		return;
	ereport(edata->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE ||
			edata->sqlerrcode == ERRCODE_T_R_SERIALIZATION_FAILURE ? DEBUG1 : WARNING,
			(errcode(edata->sqlerrcode),
			 errmsg("could not %s: %s", what, edata->message),
			 errhint("%s", hint)));
	FreeErrorData(edata);
}

static void
pgq_run_plan(void *arg)
{
	PgqStatement *st = (PgqStatement *) arg;

	if (!st->latest)
		st->rc = SPI_execute_plan(st->plan, st->args, st->nulls, false, 0);
	else
		st->rc = SPI_execute_snapshot(st->plan, st->args, st->nulls, GetLatestSnapshot(),
									  st->crosscheck && IsolationUsesXactSnapshot() ?
									  GetTransactionSnapshot() : InvalidSnapshot,
									  false, false, 0);
}

static int
pgq_execute_moving_run(PgqStatement *st)
{
	int			attempt;

	for (attempt = 1; attempt < PGQ_MOVING_ATTEMPTS && !IsolationUsesXactSnapshot(); attempt++)
	{
		ErrorData  *edata = pgq_subxact(pgq_run_plan, st, ERRCODE_T_R_SERIALIZATION_FAILURE);

		if (edata == NULL)
			return st->rc;
		FreeErrorData(edata);
	}
	/* the last try, or the only one: its error is the caller's */
	pgq_run_plan(st);
	return st->rc;
}

/*
 * SPI_execute_plan(plan, args, nulls, false, 0) of a statement on
 * pgqueue.queue through the parent that locks job rows.  When the
 * scheduler moves a job row it meets to slot 0 (ring.c, ring_move_jobs:
 * an UPDATE of its slot, a delete and an insert), PostgreSQL ends the
 * statement with "tuple to be locked was already moved to another
 * partition" (40001) instead of following the row.  Under READ COMMITTED
 * each run takes a new snapshot, which sees the row in slot 0: the
 * statement is run again, in a subtransaction, up to PGQ_MOVING_ATTEMPTS
 * times (a slot's rows are moved once, in one short statement).  Under
 * REPEATABLE READ or SERIALIZABLE the snapshot would not change: the
 * error is the caller's to retry, as any serialization failure.
 */
int
pgq_execute_moving(SPIPlanPtr plan, Datum *args, const char *nulls)
{
	PgqStatement st = {plan, args, nulls, 0, false, false};

	return pgq_execute_moving_run(&st);
}

/*
 * pgq_execute_moving with the latest snapshot, which sees what committed
 * while the caller waited for a row lock even under REPEATABLE READ; with
 * crosscheck, a row that the transaction's snapshot does not see is a
 * serialization failure where the statement writes it (as PostgreSQL's
 * foreign keys check).  For the statements of flow.c.
 */
int
pgq_execute_moving_latest(SPIPlanPtr plan, Datum *args, const char *nulls, bool crosscheck)
{
	PgqStatement st = {plan, args, nulls, 0, true, crosscheck};

	return pgq_execute_moving_run(&st);
}

/* ----------------------------------------------------------------
 * Intervals and deadlines
 * ----------------------------------------------------------------
 */

/*
 * Length of an interval in microseconds, counting a month as 30 days and a
 * day as 24 hours (as justify_interval does); for settings that are not a
 * deadline (a queue's retention).  Returns PG_INT64_MAX (or MIN) when it
 * does not fit.
 */
int64
pgq_interval_usecs(Datum interval)
{
	Interval   *iv = DatumGetIntervalP(interval);
	int64		days;
	int64		usecs;

	days = (int64) iv->month * DAYS_PER_MONTH + iv->day;
	if (pg_mul_s64_overflow(days, USECS_PER_DAY, &usecs) ||
		pg_add_s64_overflow(usecs, iv->time, &usecs))
		return (days < 0 || (days == 0 && iv->time < 0)) ? PG_INT64_MIN : PG_INT64_MAX;
	return usecs;
}

/*
 * from + interval, as SQL's "timestamptz + interval" computes it (calendar
 * months, days that may have 23 or 25 hours): the one arithmetic for every
 * deadline the API sets (leases, retries, waits) and for the checks of the
 * intervals that set them (pgq_interval_arg), so that what passes the check
 * is what is applied.  An interval with a part beyond 1,000 years gives
 * DT_NOEND (or DT_NOBEGIN when that part is negative), which every caller
 * rejects: nothing pgqueue accepts comes near, and timestamp arithmetic
 * would overflow further out.
 */
TimestampTz
pgq_deadline(TimestampTz from, Datum interval)
{
	Interval   *iv = DatumGetIntervalP(interval);
	const int64 max_usecs = INT64CONST(1000) * 366 * USECS_PER_DAY;

	if (iv->month > 12000 || iv->day > 366000 || iv->time > max_usecs)
		return DT_NOEND;
	if (iv->month < -12000 || iv->day < -366000 || iv->time < -max_usecs)
		return DT_NOBEGIN;
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(from),
												   interval));
}

/* ----------------------------------------------------------------
 * Arguments of the SQL functions
 * ----------------------------------------------------------------
 */

/* Raise 22004 when required argument argno is NULL. */
void
pgq_require(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
}

/*
 * A required text argument of 1 to maxbytes bytes, as the text it is (not
 * detoasted beyond a short header: pass it on as a Datum or compare it).
 */
text *
pgq_checked_text_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
					 int maxbytes)
{
	text	   *t;
	int			len;

	pgq_require(fcinfo, argno, argname);
	t = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(t);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", argname)));
	if (len > maxbytes)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", argname),
				 errdetail("It is %d bytes long; the maximum is %d bytes.",
						   len, maxbytes)));
	return t;
}

/* The same, as a C string. */
char *
pgq_text_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
			 int maxbytes)
{
	return text_to_cstring(pgq_checked_text_arg(fcinfo, argno, argname, maxbytes));
}

/*
 * A required interval argument: now + it (pgq_deadline) must lie between
 * now + min_usecs (0, or 1 for "positive") and now + max_usecs (spelt
 * max_text in the error).  Returns the distance in microseconds.
 */
int64
pgq_interval_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
				 int64 min_usecs, int64 max_usecs, const char *max_text)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz deadline;

	pgq_require(fcinfo, argno, argname);
	deadline = pgq_deadline(now, PG_GETARG_DATUM(argno));
	if (TIMESTAMP_NOT_FINITE(deadline) ||
		deadline - now < min_usecs || deadline - now > max_usecs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", argname),
				 errdetail("%s must be %s and at most %s.", argname,
						   min_usecs > 0 ? "positive" : "zero or positive",
						   max_text)));
	return deadline - now;
}

/*
 * A required interval argument that is a length, not a deadline (a period
 * of periodic jobs, a rate limit's window): counted in fixed lengths (a day
 * as 24 hours), so no months or years (example: an interval to suggest
 * instead); between min_usecs and max_usecs (spelt range_text).  Returns
 * its length in microseconds.
 */
int64
pgq_length_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
			   int64 min_usecs, int64 max_usecs, const char *range_text,
			   const char *example)
{
	int64		usecs;

	pgq_require(fcinfo, argno, argname);
	if (DatumGetIntervalP(PG_GETARG_DATUM(argno))->month != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not contain months or years", argname),
				 errdetail("Months differ in length; periods are counted in fixed lengths."),
				 errhint("Use days, for example '%s'.", example)));
	usecs = pgq_interval_usecs(PG_GETARG_DATUM(argno));
	if (usecs < min_usecs || usecs > max_usecs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between %s", argname, range_text)));
	return usecs;
}

/* max_items: required, 1 .. PGQ_MAX_ITEMS (pgq_claim, pgq_schedule). */
int
pgq_max_items_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		n;

	pgq_require(fcinfo, argno, "max_items");
	n = PG_GETARG_INT32(argno);
	if (n < 1 || n > PGQ_MAX_ITEMS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_items must be between 1 and %d", PGQ_MAX_ITEMS),
				 errdetail("max_items was %d.", n)));
	return n;
}

/*
 * Take, without waiting, the transaction-level lock of a queue for one
 * kind of pass work (space: the cap's or the rate limit's, hash: the
 * queue name's hashtext); false when another transaction holds it.  An
 * object lock of this database whose class id is space, not an advisory
 * lock: any role may take any advisory lock from SQL (pg_advisory_lock,
 * for the whole session), and one that held a queue's would stop the
 * passes from scheduling its jobs for as long as it liked; no SQL takes
 * an object lock of a class that is no catalog.
 */
bool
pgq_try_queue_lock(uint32 space, int32 hash)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, MyDatabaseId, (Oid) space, (Oid) (uint32) hash, 0);
	return LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}
