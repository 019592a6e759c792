/*-------------------------------------------------------------------------
 *
 * api.c
 *		The SQL-callable job API: push, claim, extend, ack, nack, release,
 *		configure and stats.
 *
 * Every function runs as SECURITY DEFINER with search_path fixed to
 * pg_catalog, pg_temp (see pgqueue--1.0.sql).  All queries are
 * schema-qualified, take values only as SPI parameters, and are prepared
 * once per backend and kept (pgq_keep_plan).
 *
 * Lock order, to stay free of deadlocks: a function that touches an
 * existing job locks its pgqueue.work_queue row first and its pgqueue.queue
 * row second.  The scheduling pass only locks pgqueue.queue rows that have
 * no work_queue row yet.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "storage/lmgr.h"
#include "utils/uuid.h"

#include "pgqueue.h"

PG_FUNCTION_INFO_V1(pgq_push);
PG_FUNCTION_INFO_V1(pgq_push_batch);
PG_FUNCTION_INFO_V1(pgq_claim);
PG_FUNCTION_INFO_V1(pgq_extend);
PG_FUNCTION_INFO_V1(pgq_ack);
PG_FUNCTION_INFO_V1(pgq_ack_batch);
PG_FUNCTION_INFO_V1(pgq_nack);
PG_FUNCTION_INFO_V1(pgq_release);
PG_FUNCTION_INFO_V1(pgq_configure);
PG_FUNCTION_INFO_V1(pgq_stats);

/* Backoff of pgq_nack without retry_in: 1 s doubling per try, at most 1 h. */
#define PGQ_BACKOFF_BASE_USECS	USECS_PER_SEC
#define PGQ_BACKOFF_CAP_USECS	(INT64CONST(3600) * USECS_PER_SEC)

/* Kept plans, prepared on first use in each backend. */
static SPIPlanPtr plan_push = NULL;
static SPIPlanPtr plan_push_dedup = NULL;
static SPIPlanPtr plan_find_dedup = NULL;
static SPIPlanPtr plan_push_batch = NULL;
static SPIPlanPtr plan_claim_stolen[2] = {NULL, NULL};
static SPIPlanPtr plan_claim_ids_work[2] = {NULL, NULL};
static SPIPlanPtr plan_claim_ids_job[2] = {NULL, NULL};
static SPIPlanPtr plan_next_expiry = NULL;
static SPIPlanPtr plan_extend = NULL;
static SPIPlanPtr plan_ack = NULL;
static SPIPlanPtr plan_ack_batch = NULL;
static SPIPlanPtr plan_nack[2] = {NULL, NULL};
static SPIPlanPtr plan_release[2] = {NULL, NULL};
static SPIPlanPtr plan_configure = NULL;
static SPIPlanPtr plan_stats = NULL;

static char *pgq_text_arg(FunctionCallInfo fcinfo, int argno,
						  const char *argname, int maxbytes);
static void pgq_require(FunctionCallInfo fcinfo, int argno, const char *argname);
static int64 pgq_interval_usecs(Datum interval);
static int64 pgq_interval_arg(FunctionCallInfo fcinfo, int argno,
							  const char *argname, int64 min_usecs,
							  int64 max_usecs, const char *max_text);
static int	pgq_max_items_arg(FunctionCallInfo fcinfo, int argno);
static void pgq_check_payload(Jsonb *payload);
static void pgq_check_run_after(TimestampTz run_after);
static ArrayType *pgq_queues_arg(FunctionCallInfo fcinfo, int argno);
static int	pgq_claim_once(ReturnSetInfo *rsinfo, Datum *args, const char *nulls,
						   int max_items, bool filtered, TimestampTz *next_expiry);
static int	pgq_claim_put(ReturnSetInfo *rsinfo, int64 *failed,
						  TimestampTz *min_lease);

/* ----------------------------------------------------------------
 * Helpers
 * ----------------------------------------------------------------
 */

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
			elog(ERROR, "pgqueue: SPI_prepare failed: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "pgqueue: SPI_keepplan failed");
		*cache = plan;
	}
	return *cache;
}

/*
 * Which layout this database's pgqueue tables have: PGQ_V11 when
 * pgqueue.work_queue has the tries column of version 1.1, else PGQ_V10.  One
 * library serves databases still at 1.0 (packages replace the library before
 * anyone runs ALTER EXTENSION ... UPDATE) and updated ones, and tells them
 * apart per call.  work_queue is locked first (ACCESS SHARE, held to the end
 * of the transaction, which also works on a standby), so a concurrent update
 * is waited for and its new layout seen.
 */
PgqLayout
pgq_layout(void)
{
	Oid			relid = pgq_relid(get_namespace_oid("pgqueue", false), "work_queue");

	LockRelationOid(relid, AccessShareLock);
	return get_attnum(relid, "tries") != InvalidAttrNumber ? PGQ_V11 : PGQ_V10;
}

/*
 * Length of an interval in microseconds, counting a month as 30 days and a
 * day as 24 hours.  Returns PG_INT64_MAX (or MIN) when it does not fit, which
 * every caller rejects as out of range.
 */
static int64
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

/* Raise 22004 when required argument argno is NULL. */
static void
pgq_require(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
}

/*
 * A required text argument of 1 to maxbytes bytes, as a C string.
 */
static char *
pgq_text_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
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
	return text_to_cstring(t);
}

/*
 * A required interval argument between min_usecs (0, or 1 for "positive")
 * and max_usecs (spelt max_text in the error), in microseconds.
 */
static int64
pgq_interval_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
				 int64 min_usecs, int64 max_usecs, const char *max_text)
{
	int64		usecs;

	pgq_require(fcinfo, argno, argname);
	usecs = pgq_interval_usecs(PG_GETARG_DATUM(argno));
	if (usecs < min_usecs || usecs > max_usecs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", argname),
				 errdetail("%s must be %s and at most %s.", argname,
						   min_usecs > 0 ? "positive" : "zero or positive",
						   max_text)));
	return usecs;
}

/* max_items: required, 1 .. PGQ_MAX_ITEMS. */
static int
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

/* Reject payloads over pgqueue.max_payload_size. */
static void
pgq_check_payload(Jsonb *payload)
{
	Size		size = VARSIZE_ANY(payload);

	if (size > (Size) pgqueue_max_payload_kb * 1024)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("payload is too large"),
				 errdetail("The payload takes %zu bytes; pgqueue.max_payload_size allows %d kB.",
						   size, pgqueue_max_payload_kb),
				 errhint("Store large data elsewhere and push a reference to it.")));
}

/* run_after must be a finite time. */
static void
pgq_check_run_after(TimestampTz run_after)
{
	if (TIMESTAMP_NOT_FINITE(run_after))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("run_after must be a finite time")));
}

/*
 * The optional queues filter of pgq_claim: NULL, or a one-dimensional array
 * of 1 to PGQ_MAX_QUEUES_FILTER valid queue names.
 */
static ArrayType *
pgq_queues_arg(FunctionCallInfo fcinfo, int argno)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;

	if (PG_ARGISNULL(argno))
		return NULL;
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("queues must be a one-dimensional array")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	if (n == 0 || n > PGQ_MAX_QUEUES_FILTER)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("queues must name between 1 and %d queues", PGQ_MAX_QUEUES_FILTER),
				 errhint("Pass NULL to claim from every queue.")));
	for (i = 0; i < n; i++)
	{
		int			len;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("queues must not contain null")));
		len = VARSIZE_ANY_EXHDR(DatumGetPointer(elems[i]));
		if (len == 0 || len > PGQ_MAX_NAME_BYTES)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("queue names must be 1 to %d bytes long", PGQ_MAX_NAME_BYTES)));
	}
	return arr;
}

/* ----------------------------------------------------------------
 * pgq_push, pgq_push_batch
 * ----------------------------------------------------------------
 */

/*
 * The jobs pgq_push and pgq_push_batch insert (run_after is argument 2,
 * priority argument 3 of both) are ready below the scheduling bound when
 * they commit: lower it to their key.
 */
static void
pgq_push_lower_at_commit(FunctionCallInfo fcinfo)
{
	pgq_sched_lower_at_commit(-(int64) PG_GETARG_INT32(3),
							  PG_ARGISNULL(2) ? GetCurrentTransactionStartTimestamp()
							  : PG_GETARG_TIMESTAMPTZ(2));
}

/*
 * pgq_push(queue, payload, run_after, priority, dedup_key) returns uuid
 *
 * Inserts a pending job.  With a dedup_key, a live job with the same
 * (queue, dedup_key) wins and its id is returned instead.
 */
Datum
pgq_push(PG_FUNCTION_ARGS)
{
	char	   *queue = pgq_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES);
	Jsonb	   *payload;
	char	   *dedup_key = NULL;
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	pg_uuid_t  *result = NULL;
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	int			attempt;

	pgq_require(fcinfo, 1, "payload");
	payload = PG_GETARG_JSONB_P(1);
	pgq_check_payload(payload);
	if (!PG_ARGISNULL(2))
		pgq_check_run_after(PG_GETARG_TIMESTAMPTZ(2));
	pgq_require(fcinfo, 3, "priority");
	if (!PG_ARGISNULL(4))
		dedup_key = pgq_text_arg(fcinfo, 4, "dedup_key", PGQ_MAX_KEY_BYTES);

	pgq_uuid7(id);
	args[0] = UUIDPGetDatum(id);
	args[1] = CStringGetTextDatum(queue);
	args[2] = JsonbPGetDatum(payload);
	args[3] = PG_GETARG_DATUM(2);
	nulls[3] = PG_ARGISNULL(2) ? 'n' : ' ';
	args[4] = PG_GETARG_DATUM(3);
	args[5] = dedup_key ? CStringGetTextDatum(dedup_key) : (Datum) 0;
	nulls[5] = dedup_key ? ' ' : 'n';

	SPI_connect();

	if (dedup_key == NULL)
	{
		Oid			types[5] = {UUIDOID, TEXTOID, JSONBOID, TIMESTAMPTZOID, INT4OID};
		SPIPlanPtr	plan = pgq_keep_plan(&plan_push,
										 "INSERT INTO pgqueue.queue (id, queue, payload, run_after, priority)"
										 " VALUES ($1, $2, $3, coalesce($4, pg_catalog.now()), $5)",
										 5, types);

		if (SPI_execute_plan(plan, args, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "pgqueue: push failed");
		result = id;
	}
	else
	{
		Oid			types[6] = {UUIDOID, TEXTOID, JSONBOID, TIMESTAMPTZOID, INT4OID, TEXTOID};
		Oid			ftypes[2] = {TEXTOID, TEXTOID};
		SPIPlanPtr	plan = pgq_keep_plan(&plan_push_dedup,
										 "INSERT INTO pgqueue.queue (id, queue, payload, run_after, priority, dedup_key)"
										 " VALUES ($1, $2, $3, coalesce($4, pg_catalog.now()), $5, $6)"
										 " ON CONFLICT (queue, dedup_key)"
										 "   WHERE dedup_key IS NOT NULL AND state <> 'failed'"
										 " DO NOTHING RETURNING id",
										 6, types);
		SPIPlanPtr	find = pgq_keep_plan(&plan_find_dedup,
										 "SELECT id FROM pgqueue.queue"
										 " WHERE queue = $1 AND dedup_key = $2 AND state <> 'failed'",
										 2, ftypes);
		Datum		fargs[2] = {args[1], args[5]};

		/*
		 * Insert, or find the live job that holds the key.  That job can be
		 * finished between the two statements; then insert again.
		 */
		for (attempt = 0; attempt < 10 && result == NULL; attempt++)
		{
			bool		isnull;

			if (SPI_execute_plan(plan, args, nulls, false, 0) != SPI_OK_INSERT_RETURNING)
				elog(ERROR, "pgqueue: push failed");
			if (SPI_processed == 1)
			{
				result = id;
				break;
			}
			if (SPI_execute_plan(find, fargs, NULL, false, 1) != SPI_OK_SELECT)
				elog(ERROR, "pgqueue: dedup lookup failed");
			if (SPI_processed == 1)
			{
				Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull);

				result = SPI_palloc(sizeof(pg_uuid_t));
				memcpy(result, DatumGetUUIDP(d), sizeof(pg_uuid_t));
				/* an existing job: nothing new, no count, no wake-up */
				SPI_finish();
				PG_RETURN_UUID_P(result);
			}
		}
		if (result == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not push job with dedup_key \"%s\": it kept conflicting with a concurrent job",
							dedup_key),
					 errhint("Retry the transaction.")));
	}

	SPI_finish();

	pgq_count(PGQ_PUSHED, 1);
	pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	pgq_push_lower_at_commit(fcinfo);
	PG_RETURN_UUID_P(result);
}

/*
 * pgq_push_batch(queue, payloads jsonb[], run_after, priority) returns
 * setof uuid
 *
 * Inserts one pending job per payload in one statement and returns their
 * ids in the order of the payloads.
 */
Datum
pgq_push_batch(PG_FUNCTION_ARGS)
{
	char	   *queue = pgq_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *payloads;
	ArrayType  *ids;
	Datum	   *elems;
	bool	   *elnulls;
	Datum	   *iddatums;
	pg_uuid_t  *idvals;
	int			n;
	int			i;
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	Oid			types[5] = {UUIDARRAYOID, TEXTOID, JSONBARRAYOID, TIMESTAMPTZOID, INT4OID};
	SPIPlanPtr	plan;

	pgq_require(fcinfo, 1, "payloads");
	payloads = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(payloads) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("payloads must be a one-dimensional array")));
	if (!PG_ARGISNULL(2))
		pgq_check_run_after(PG_GETARG_TIMESTAMPTZ(2));
	pgq_require(fcinfo, 3, "priority");

	deconstruct_array(payloads, JSONBOID, -1, false, TYPALIGN_INT,
					  &elems, &elnulls, &n);
	if (n > PGQ_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("payloads has %d elements; at most %d can be pushed in one call",
						n, PGQ_MAX_BATCH)));
	for (i = 0; i < n; i++)
	{
		if (elnulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("payloads must not contain null"),
					 errdetail("Element %d is null.", i + 1)));
		pgq_check_payload(DatumGetJsonbP(elems[i]));
	}

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (n == 0)
		return (Datum) 0;

	idvals = palloc(sizeof(pg_uuid_t) * n);
	iddatums = palloc(sizeof(Datum) * n);
	for (i = 0; i < n; i++)
	{
		pgq_uuid7(&idvals[i]);
		iddatums[i] = UUIDPGetDatum(&idvals[i]);
	}
	ids = construct_array(iddatums, n, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR);

	args[0] = PointerGetDatum(ids);
	args[1] = CStringGetTextDatum(queue);
	args[2] = PointerGetDatum(payloads);
	args[3] = PG_GETARG_DATUM(2);
	nulls[3] = PG_ARGISNULL(2) ? 'n' : ' ';
	args[4] = PG_GETARG_DATUM(3);

	SPI_connect();
	plan = pgq_keep_plan(&plan_push_batch,
						 "INSERT INTO pgqueue.queue (id, queue, payload, run_after, priority)"
						 " SELECT b.id, $2, b.payload, coalesce($4, pg_catalog.now()), $5"
						 "   FROM unnest($1, $3) AS b (id, payload)",
						 5, types);
	if (SPI_execute_plan(plan, args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "pgqueue: push_batch failed");
	SPI_finish();

	for (i = 0; i < n; i++)
	{
		bool		isnull = false;

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
							 &iddatums[i], &isnull);
	}

	pgq_count(PGQ_PUSHED, n);
	pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	if (n > 0)
		pgq_push_lower_at_commit(fcinfo);
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * pgq_claim
 * ----------------------------------------------------------------
 */

/*
 * Jobs whose lease ran out, oldest deadline first ($4 the queues filter, $5
 * the claim time, $6 the lease bound, $2 how many).  Those on their last try
 * are failed (their work_queue row goes, the job stays as 'failed' with
 * last_error saying so); the others are claimed for $1 under lease $3.  The
 * result always has at least one row, carrying the number failed, with a
 * NULL id when nothing was claimed.
 *
 * Rows are updated through "id = ANY (ARRAY(...))", not a join with a CTE:
 * the planner cannot know how few rows a CTE holds and may choose a hash
 * join over a sequential scan of the table; the array always probes the
 * primary key.
 *
 * Two layouts (pgq_layout): in 1.0 the attempt count and version are the
 * job row's, in 1.1 the work_queue row's while the job is there.
 */
#define CLAIM_STOLEN_EXPIRED(COLUMNS) \
"WITH e AS (" \
"  SELECT w.id, w.queue, w.lock_key AS old_key" COLUMNS \
"    FROM pgqueue.work_queue w" \
"   WHERE w.lock_timeout < $5 AND w.lock_timeout >= $6" \
"     AND ($4::text[] IS NULL OR w.queue = ANY ($4::text[]))" \
"   ORDER BY w.lock_timeout" \
"   LIMIT $2" \
"     FOR UPDATE OF w SKIP LOCKED),"

#define CLAIM_STOLEN_RESULT \
" SELECT x.id, x.queue, x.payload, x.tries, x.version, x.lock_timeout, f.n AS failed" \
"   FROM (SELECT count(*) AS n FROM dq) f" \
"   LEFT JOIN x ON true" \
"  ORDER BY x.created, x.batch_order"

static const char *const claim_stolen_sql[2] = {
	/* 1.0 */
	CLAIM_STOLEN_EXPIRED("")
	" j AS ("
	"  SELECT e.id, e.old_key, q.tries, q.max_tries, q.tries >= q.max_tries AS last_try"
	"    FROM e CROSS JOIN LATERAL ("
	"         SELECT q.tries, coalesce((SELECT s.max_tries FROM pgqueue.queues s"
	"                                    WHERE s.queue = q.queue), 5) AS max_tries"
	"           FROM pgqueue.queue q WHERE q.id = e.id LIMIT 1) q),"
	" dw AS ("
	"  DELETE FROM pgqueue.work_queue w"
	"   WHERE w.id = ANY (ARRAY(SELECT j.id FROM j WHERE j.last_try))"
	"  RETURNING w.id),"
	" dq AS ("
	"  UPDATE pgqueue.queue q"
	"     SET state = 'failed', version = q.version + 1,"
	"         last_error = (SELECT pg_catalog.format('lease of %s expired on try %s of %s',"
	"                                                j.old_key, j.tries, j.max_tries)"
	"                         FROM j WHERE j.id = q.id)"
	"   WHERE q.id = ANY (ARRAY(SELECT dw.id FROM dw))"
	"  RETURNING q.id),"
	" c AS (SELECT j.id FROM j WHERE NOT j.last_try),"
	" cj AS ("
	"  UPDATE pgqueue.queue q SET tries = q.tries + 1, version = q.version + 1"
	"   WHERE q.id = ANY (ARRAY(SELECT c.id FROM c))"
	"  RETURNING q.id, q.queue, q.payload, q.tries, q.version),"
	" cw AS ("
	"  UPDATE pgqueue.work_queue w"
	"     SET lock_key = $1, started = $5, lock_timeout = $5 + $3,"
	"         version = w.version + 1"
	"   WHERE w.id = ANY (ARRAY(SELECT c.id FROM c))"
	"  RETURNING w.id, w.lock_timeout, w.created, w.batch_order),"
	" x AS (SELECT cj.id, cj.queue, cj.payload, cj.tries, cj.version,"
	"              cw.lock_timeout, cw.created, cw.batch_order"
	"         FROM cj JOIN cw ON cw.id = cj.id)"
	CLAIM_STOLEN_RESULT,

	/* 1.1 */
	CLAIM_STOLEN_EXPIRED(", w.tries, w.version")
	" j AS ("
	"  SELECT e.id, e.old_key, e.tries, e.version, coalesce(s.max_tries, 5) AS max_tries,"
	"         e.tries >= coalesce(s.max_tries, 5) AS last_try"
	"    FROM e LEFT JOIN pgqueue.queues s ON s.queue = e.queue),"
	" dw AS ("
	"  DELETE FROM pgqueue.work_queue w"
	"   WHERE w.id = ANY (ARRAY(SELECT j.id FROM j WHERE j.last_try))"
	"  RETURNING w.id),"
	" dq AS ("
	"  UPDATE pgqueue.queue q"
	"     SET state = 'failed', tries = j.tries, version = j.version + 1,"
	"         last_error = pg_catalog.format('lease of %s expired on try %s of %s',"
	"                                        j.old_key, j.tries, j.max_tries)"
	"    FROM j"
	"   WHERE q.id = ANY (ARRAY(SELECT dw.id FROM dw)) AND j.id = q.id"
	"  RETURNING q.id),"
	" cw AS ("
	"  UPDATE pgqueue.work_queue w"
	"     SET lock_key = $1, started = $5, lock_timeout = $5 + $3,"
	"         version = w.version + 1, tries = w.tries + 1"
	"   WHERE w.id = ANY (ARRAY(SELECT j.id FROM j WHERE NOT j.last_try))"
	"  RETURNING w.id, w.tries, w.version, w.lock_timeout, w.created, w.batch_order),"
	" x AS (SELECT cw.id, q.queue, q.payload, cw.tries, cw.version,"
	"              cw.lock_timeout, cw.created, cw.batch_order"
	"         FROM cw JOIN pgqueue.queue q ON q.id = cw.id)"
	CLAIM_STOLEN_RESULT
};

/*
 * Claim the never-claimed (or released) rows that pgq_lock_ready locked,
 * whose ids are in $4 (work_queue) and $1 (queue).  Two plain statements,
 * each a primary-key probe, and the rows are put together in C
 * (pgq_claim_ids): one statement joining them needs a CTE scan, a hash join
 * and a sort on top, which cost more to start up and run than the updates
 * themselves for the usual claim of one job.
 *
 * The work_queue update returns (id, lock_timeout[, tries, version]), the
 * job statement (id, queue, payload[, tries, version]): in 1.0 the attempt
 * count and version are the job row's, in 1.1 the work_queue row's.
 */
static const char *const claim_ids_work_sql[2] = {
	"UPDATE pgqueue.work_queue w"
	"   SET lock_key = $1, started = $2, lock_timeout = $2 + $3,"
	"       version = w.version + 1"
	" WHERE w.id = ANY ($4)"
	" RETURNING w.id, w.lock_timeout",

	"UPDATE pgqueue.work_queue w"
	"   SET lock_key = $1, started = $2, lock_timeout = $2 + $3,"
	"       version = w.version + 1, tries = w.tries + 1"
	" WHERE w.id = ANY ($4)"
	" RETURNING w.id, w.lock_timeout, w.tries, w.version"
};

static const char *const claim_ids_job_sql[2] = {
	"UPDATE pgqueue.queue q SET tries = q.tries + 1, version = q.version + 1"
	" WHERE q.id = ANY ($1)"
	" RETURNING q.id, q.queue, q.payload, q.tries, q.version",

	"SELECT q.id, q.queue, q.payload FROM pgqueue.queue q WHERE q.id = ANY ($1)"
};

/*
 * Copy the rows of the last claim statement into the result set; returns
 * how many jobs it holds, adds the number failed to *failed and lowers
 * *min_lease to the earliest lease deadline it set.
 */
static int
pgq_claim_put(ReturnSetInfo *rsinfo, int64 *failed, TimestampTz *min_lease)
{
	int			n = 0;
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		Datum		values[6];
		bool		isnull[6];
		bool		fnull;
		int			col;

		if (i == 0)
			*failed += DatumGetInt64(SPI_getbinval(tup, desc, 7, &fnull));
		for (col = 0; col < 6; col++)
			values[col] = SPI_getbinval(tup, desc, col + 1, &isnull[col]);
		if (isnull[0])
			continue;			/* the stolen-claim row that only counts */
		if (!isnull[5] && DatumGetTimestampTz(values[5]) < *min_lease)
			*min_lease = DatumGetTimestampTz(values[5]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
		n++;
	}
	return n;
}

/* A row of an SPI result by the uuid in its first column. */
typedef struct PgqRowById
{
	pg_uuid_t  *id;
	HeapTuple	tup;
} PgqRowById;

static int
pgq_row_by_id_cmp(const void *a, const void *b)
{
	return memcmp(((const PgqRowById *) a)->id->data,
				  ((const PgqRowById *) b)->id->data, UUID_LEN);
}

/*
 * The rows of tuptable sorted by the uuid in their first column, for
 * pgq_find_by_id: a claim may return up to PGQ_MAX_ITEMS rows.
 */
static PgqRowById *
pgq_rows_by_id(SPITupleTable *tuptable, uint64 ntuples)
{
	PgqRowById *rows = palloc(sizeof(PgqRowById) * Max(ntuples, 1));
	uint64		i;

	for (i = 0; i < ntuples; i++)
	{
		bool		isnull;

		rows[i].id = DatumGetUUIDP(SPI_getbinval(tuptable->vals[i],
												 tuptable->tupdesc, 1, &isnull));
		rows[i].tup = tuptable->vals[i];
	}
	qsort(rows, ntuples, sizeof(PgqRowById), pgq_row_by_id_cmp);
	return rows;
}

static HeapTuple
pgq_find_by_id(PgqRowById *rows, uint64 nrows, Datum id)
{
	PgqRowById	key;
	PgqRowById *found;

	key.id = DatumGetUUIDP(id);
	found = bsearch(&key, rows, nrows, sizeof(PgqRowById), pgq_row_by_id_cmp);
	return found ? found->tup : NULL;
}

/*
 * Lease and claim the work_queue rows with the given ids (locked by
 * pgq_lock_ready, in claim order) and put them into the result set in that
 * order; returns how many.  args are pgq_claim_once's parameters: $1
 * lock_key, $3 lease, $5 the claim time.
 */
static int
pgq_claim_ids(ReturnSetInfo *rsinfo, PgqLayout layout, ArrayType *ids,
			  Datum *args, TimestampTz *min_lease)
{
	Oid			wtypes[4] = {TEXTOID, TIMESTAMPTZOID, INTERVALOID, UUIDARRAYOID};
	Oid			jtype = UUIDARRAYOID;
	Datum		wargs[4];
	Datum		jarg = PointerGetDatum(ids);
	SPITupleTable *wtab;
	uint64		nw;
	SPITupleTable *jtab;
	uint64		nj;
	PgqRowById *wrows;
	PgqRowById *jrows;
	Datum	   *idv;
	int			nids;
	int			i;
	int			n = 0;

	wargs[0] = args[0];
	wargs[1] = args[4];
	wargs[2] = args[2];
	wargs[3] = PointerGetDatum(ids);
	if (SPI_execute_plan(pgq_keep_plan(&plan_claim_ids_work[layout], claim_ids_work_sql[layout],
									   4, wtypes),
						 wargs, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "claim failed");
	wtab = SPI_tuptable;		/* kept until SPI_finish */
	nw = SPI_processed;
	if (SPI_execute_plan(pgq_keep_plan(&plan_claim_ids_job[layout], claim_ids_job_sql[layout],
									   1, &jtype),
						 &jarg, NULL, false, 0) < 0)
		elog(ERROR, "claim failed");
	jtab = SPI_tuptable;
	nj = SPI_processed;
	wrows = pgq_rows_by_id(wtab, nw);
	jrows = pgq_rows_by_id(jtab, nj);

	deconstruct_array(ids, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR,
					  &idv, NULL, &nids);
	for (i = 0; i < nids; i++)
	{
		HeapTuple	wt = pgq_find_by_id(wrows, nw, idv[i]);
		HeapTuple	jt = pgq_find_by_id(jrows, nj, idv[i]);
		Datum		values[6];
		bool		isnull[6];
		int			col;

		/*
		 * Both exist: the work_queue row is locked, and a job leaves
		 * pgqueue.queue only after its work_queue row (1.0: ON DELETE
		 * CASCADE too).
		 */
		if (wt == NULL || jt == NULL)
			continue;
		/* id, queue, payload; tries, version; lock_timeout */
		for (col = 0; col < 3; col++)
			values[col] = SPI_getbinval(jt, jtab->tupdesc, col + 1, &isnull[col]);
		for (col = 3; col < 5; col++)
			values[col] = layout == PGQ_V11
				? SPI_getbinval(wt, wtab->tupdesc, col, &isnull[col])
				: SPI_getbinval(jt, jtab->tupdesc, col + 1, &isnull[col]);
		values[5] = SPI_getbinval(wt, wtab->tupdesc, 2, &isnull[5]);
		if (!isnull[5] && DatumGetTimestampTz(values[5]) < *min_lease)
			*min_lease = DatumGetTimestampTz(values[5]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
		n++;
	}
	return n;
}

/*
 * One claim attempt: steal expired leases first, then take never-claimed
 * rows.  args and nulls are ($1 lock_key, $2 max_items, $3 lease,
 * $4 queues).  When
 * nothing was claimable and next_expiry is not NULL, sets *next_expiry to
 * the earliest live lease deadline (or 0 when there is none), so that a
 * waiting claim knows when a steal becomes possible.
 */
static int
pgq_claim_once(ReturnSetInfo *rsinfo, Datum *args, const char *nulls,
			   int max_items, bool filtered, TimestampTz *next_expiry)
{
	PgqLayout	layout = pgq_layout();
	Oid			types[6] = {TEXTOID, INT4OID, INTERVALOID, TEXTARRAYOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID};
	Datum		a[6];
	char		n[6];
	int64		failed = 0;
	int			stolen;
	int			fresh = 0;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz lease_bound;
	TimestampTz min_lease = DT_NOEND;
	uint64		lease_epoch;
	bool		lease_hinted;
	TimestampTz deadline;
	bool		expired;

	/* $1 .. $4 as given, $5 the claim time, $6 the lease bound */
	memcpy(a, args, sizeof(Datum) * 4);
	memcpy(n, nulls, 4);
	a[4] = TimestampTzGetDatum(now);
	n[4] = ' ';
	n[5] = ' ';

	SPI_connect();

	/*
	 * Expired leases are rare: look for one with a single probe of
	 * work_queue_lease_idx, from the PGQ_HINT_LEASE bound up to now, before
	 * running the statement that steals (or fails) them.  The bound is read
	 * before the probe's snapshot (a new one, as a non-read-only SPI
	 * statement takes); it moves up to the first expired lease, or to now
	 * when there is none (see shmem.c).
	 */
	lease_hinted = pgq_hint_get(PGQ_HINT_LEASE, &lease_bound, &lease_epoch, true);
	deadline = pgq_first_expired(lease_bound, now, &expired);
	pgq_hint_set(PGQ_HINT_LEASE, expired ? deadline : now, lease_epoch, !lease_hinted);
	a[5] = TimestampTzGetDatum(expired ? deadline : lease_bound);

	/*
	 * Jobs failed on their last try do not fill the claim: while some were
	 * failed and there is room, look for more expired leases.
	 */
	stolen = 0;
	while (expired)
	{
		int64		failed_before = failed;

		a[1] = Int32GetDatum(max_items - stolen);
		if (SPI_execute_plan(pgq_keep_plan(&plan_claim_stolen[layout], claim_stolen_sql[layout],
										   6, types),
							 a, n, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "pgqueue: claim of expired leases failed");
		stolen += pgq_claim_put(rsinfo, &failed, &min_lease);
		if (failed == failed_before || stolen >= max_items)
			break;
	}

	if (stolen < max_items)
	{
		ArrayType  *ids = pgq_lock_ready(max_items - stolen,
										 filtered ? DatumGetArrayTypeP(args[3]) : NULL);

		if (ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids)) > 0)
			fresh = pgq_claim_ids(rsinfo, layout, ids, a, &min_lease);
	}

	if (stolen + fresh == 0 && next_expiry != NULL)
	{
		Datum		d;
		bool		isnull;

		if (SPI_execute_plan(pgq_keep_plan(&plan_next_expiry,
										   "SELECT min(w.lock_timeout) FROM pgqueue.work_queue w"
										   " WHERE w.lock_timeout IS NOT NULL"
										   "   AND ($1::text[] IS NULL OR w.queue = ANY ($1::text[]))",
										   1, &types[3]),
							 &a[3], &nulls[3], false, 1) != SPI_OK_SELECT)
			elog(ERROR, "pgqueue: lease lookup failed");
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		*next_expiry = isnull ? 0 : DatumGetTimestampTz(d);
	}

	SPI_finish();

	pgq_count(PGQ_CLAIMED, stolen + fresh);
	pgq_count(PGQ_STOLEN, stolen);
	pgq_count(PGQ_FAILED, failed);
	if (stolen + fresh + failed > 0)
		pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
	if (stolen + fresh > 0)
	{
		pgq_hint_lower_at_commit(PGQ_HINT_LEASE, min_lease);
		pgq_hint_hold();
	}
	return stolen + fresh;
}

/*
 * pgq_claim(lock_key, max_items, lease, queues, wait) returns table
 *
 * Claims up to max_items jobs for lock_key.  With wait > 0 and nothing to
 * claim it sleeps until work arrives (see pgq_wait_for_work) or wait ends.
 * Waiting needs a fresh snapshot for each try, so it only happens under
 * READ COMMITTED.
 */
Datum
pgq_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *lock_key = pgq_text_arg(fcinfo, 0, "lock_key", PGQ_MAX_KEY_BYTES);
	int			max_items = pgq_max_items_arg(fcinfo, 1);
	ArrayType  *queues;
	int64		wait_usecs;
	TimestampTz deadline;
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	pgq_interval_arg(fcinfo, 2, "lease", 1, PGQ_MAX_LEASE_USECS, "7 days");
	queues = pgq_queues_arg(fcinfo, 3);
	wait_usecs = pgq_interval_arg(fcinfo, 4, "wait", 0, PGQ_MAX_WAIT_USECS, "60 seconds");

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	args[0] = CStringGetTextDatum(lock_key);
	args[1] = Int32GetDatum(max_items);
	args[2] = PG_GETARG_DATUM(2);
	args[3] = queues ? PointerGetDatum(queues) : (Datum) 0;
	nulls[3] = queues ? ' ' : 'n';

	deadline = GetCurrentTimestamp() + wait_usecs;
	if (wait_usecs == 0 || IsolationUsesXactSnapshot())
	{
		pgq_claim_once(rsinfo, args, nulls, max_items, queues != NULL, NULL);
		return (Datum) 0;
	}

	/*
	 * Wait for work: get on the condition variable's list before each look,
	 * so that a wake-up between the look and the sleep is not lost.
	 */
	pgq_prepare_wait(queues != NULL);
	PG_TRY();
	{
		for (;;)
		{
			TimestampTz next_expiry = 0;
			TimestampTz now;
			TimestampTz until;

			if (pgq_claim_once(rsinfo, args, nulls, max_items, queues != NULL,
							   &next_expiry) > 0)
				break;
			now = GetCurrentTimestamp();
			if (now >= deadline)
				break;

			/*
			 * Sleep until new work is published, the next lease of our
			 * queues runs out (1 ms late, so that it has), or the deadline.
			 */
			until = deadline;
			if (next_expiry > now && next_expiry + 1000 < until)
				until = next_expiry + 1000;
			pgq_wait_for_work(until);
		}
	}
	PG_FINALLY();
	{
		pgq_end_wait(queues != NULL);
	}
	PG_END_TRY();

	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * pgq_extend, pgq_ack, pgq_ack_batch, pgq_nack, pgq_release
 * ----------------------------------------------------------------
 */

/*
 * pgq_extend(id, lock_key, lease) returns timestamptz
 *
 * Moves the lease deadline to now + lease while lock_key holds the job;
 * NULL when it does not.
 */
Datum
pgq_extend(PG_FUNCTION_ARGS)
{
	Oid			types[3] = {UUIDOID, TEXTOID, INTERVALOID};
	Datum		args[3];
	TimestampTz result = 0;
	bool		found = false;

	pgq_require(fcinfo, 0, "id");
	args[0] = PG_GETARG_DATUM(0);
	args[1] = CStringGetTextDatum(pgq_text_arg(fcinfo, 1, "lock_key", PGQ_MAX_KEY_BYTES));
	pgq_interval_arg(fcinfo, 2, "lease", 1, PGQ_MAX_LEASE_USECS, "7 days");
	args[2] = PG_GETARG_DATUM(2);

	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_extend,
									   "UPDATE pgqueue.work_queue"
									   "   SET lock_timeout = pg_catalog.clock_timestamp() + $3"
									   " WHERE id = $1 AND lock_key = $2"
									   " RETURNING lock_timeout",
									   3, types),
						 args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "pgqueue: extend failed");
	if (SPI_processed == 1)
	{
		bool		isnull;

		result = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
												   SPI_tuptable->tupdesc, 1, &isnull));
		found = true;
		pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
		pgq_hint_lower_at_commit(PGQ_HINT_LEASE, result);
		pgq_hint_hold();
	}
	SPI_finish();

	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(result);
}

/*
 * Wake the scheduler at commit when a finished job frees a place of a queue
 * with max_in_flight (capped is the second column of the statement).
 */
static void
pgq_wake_if_capped(void)
{
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		capped = SPI_getbinval(SPI_tuptable->vals[i],
										   SPI_tuptable->tupdesc, 2, &isnull);

		if (!isnull && DatumGetBool(capped))
		{
			pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
			break;
		}
	}
}

/*
 * Delete the jobs of the work_queue rows in CTE "w"; second column says
 * whether the job's queue has max_in_flight.
 */
#define ACK_TAIL \
	" DELETE FROM pgqueue.queue q WHERE q.id = ANY (ARRAY(SELECT w.id FROM w))" \
	" RETURNING q.id, EXISTS (SELECT 1 FROM pgqueue.queues s" \
	"                          WHERE s.queue = q.queue AND s.max_in_flight > 0)"

/*
 * pgq_ack(id, lock_key) returns boolean
 *
 * Finishes the job (it leaves both tables) if lock_key holds it.
 */
Datum
pgq_ack(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {UUIDOID, TEXTOID};
	Datum		args[2];
	bool		done;

	pgq_require(fcinfo, 0, "id");
	args[0] = PG_GETARG_DATUM(0);
	args[1] = CStringGetTextDatum(pgq_text_arg(fcinfo, 1, "lock_key", PGQ_MAX_KEY_BYTES));

	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_ack,
									   "WITH w AS (DELETE FROM pgqueue.work_queue"
									   "            WHERE id = $1 AND lock_key = $2 RETURNING id)"
									   ACK_TAIL,
									   2, types),
						 args, NULL, false, 0) != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "pgqueue: ack failed");
	done = (SPI_processed == 1);
	pgq_wake_if_capped();
	SPI_finish();

	if (done)
	{
		pgq_count(PGQ_ACKED, 1);
		pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
	}
	PG_RETURN_BOOL(done);
}

/*
 * pgq_ack_batch(ids uuid[], lock_key) returns int
 *
 * pgq_ack for many jobs in one statement; returns how many were acked
 * (ids not held by lock_key are skipped).
 */
Datum
pgq_ack_batch(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {UUIDARRAYOID, TEXTOID};
	Datum		args[2];
	ArrayType  *ids;
	int			n;

	pgq_require(fcinfo, 0, "ids");
	ids = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_NDIM(ids) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("ids must be a one-dimensional array")));
	if (ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids)) > PGQ_MAX_ITEMS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("at most %d ids can be acked in one call", PGQ_MAX_ITEMS)));
	args[0] = PointerGetDatum(ids);
	args[1] = CStringGetTextDatum(pgq_text_arg(fcinfo, 1, "lock_key", PGQ_MAX_KEY_BYTES));

	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_ack_batch,
									   "WITH w AS (DELETE FROM pgqueue.work_queue"
									   "            WHERE id = ANY ($1) AND lock_key = $2 RETURNING id)"
									   ACK_TAIL,
									   2, types),
						 args, NULL, false, 0) != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "pgqueue: ack failed");
	n = (int) SPI_processed;
	pgq_wake_if_capped();
	SPI_finish();

	pgq_count(PGQ_ACKED, n);
	if (n > 0)
		pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
	PG_RETURN_INT32(n);
}

/*
 * The statement of pgq_nack: delete the work_queue row held by $2, and set
 * the job to 'retry' (run_after: now + $4, or the backoff from base $5,
 * jitter $6 and cap $7 when $4 is NULL) or 'failed' (out of tries) with
 * last_error $3.  Returns the new state, whether the queue has a cap, and
 * the job's key in queue_ready_idx.  In 1.1 the attempt count and version
 * come from the work_queue row and are written back to the job row.
 */
#define NACK_SET(T) \
"    SET state = CASE WHEN " T " >= m.max_tries" \
"                     THEN 'failed' ELSE 'retry' END::pgqueue.job_state," \
"        run_after = CASE WHEN " T " >= m.max_tries THEN q.run_after" \
"                    ELSE pg_catalog.clock_timestamp() + coalesce($4," \
"                         $6 * LEAST($5::float8 * 2.0::float8 ^ (LEAST(" T ", 40) - 1)," \
"                                    $7::float8) * interval '1 microsecond') END," \
"        last_error = $3,"

#define NACK_RETURNING \
" RETURNING q.state::text, EXISTS (SELECT 1 FROM pgqueue.queues s" \
"                   WHERE s.queue = q.queue AND s.max_in_flight > 0)," \
"           -(q.priority::bigint), q.run_after"

static const char *const nack_sql[2] = {
	"WITH w AS (DELETE FROM pgqueue.work_queue"
	"            WHERE id = $1 AND lock_key = $2 RETURNING id)"
	" UPDATE pgqueue.queue q"
	NACK_SET("q.tries")
	"        version = q.version + 1"
	"   FROM (SELECT w.id, coalesce(s.max_tries, 5) AS max_tries"
	"           FROM w JOIN pgqueue.queue j ON j.id = w.id"
	"           LEFT JOIN pgqueue.queues s ON s.queue = j.queue) m"
	"  WHERE q.id = m.id"
	NACK_RETURNING,

	"WITH w AS (DELETE FROM pgqueue.work_queue"
	"            WHERE id = $1 AND lock_key = $2 RETURNING id, queue, tries, version)"
	" UPDATE pgqueue.queue q"
	NACK_SET("m.tries")
	"        tries = m.tries, version = m.version + 1"
	"   FROM (SELECT w.id, w.tries, w.version, coalesce(s.max_tries, 5) AS max_tries"
	"           FROM w LEFT JOIN pgqueue.queues s ON s.queue = w.queue) m"
	"  WHERE q.id = m.id"
	NACK_RETURNING
};

/*
 * pgq_nack(id, lock_key, error, retry_in) returns text
 *
 * Gives the job back after a failure.  It goes to 'retry' with run_after =
 * now + retry_in (or an exponential backoff with jitter: base * 2^(tries-1),
 * capped, times a random factor in [0.5, 1]), or to 'failed' when its
 * tries are used up.  NULL when lock_key does not hold the job.
 */
Datum
pgq_nack(PG_FUNCTION_ARGS)
{
	Oid			types[7] = {UUIDOID, TEXTOID, TEXTOID, INTERVALOID, INT8OID, FLOAT8OID, INT8OID};
	Datum		args[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	char	   *state = NULL;
	bool		due_now = false;
	PgqLayout	layout;

	pgq_require(fcinfo, 0, "id");
	args[0] = PG_GETARG_DATUM(0);
	args[1] = CStringGetTextDatum(pgq_text_arg(fcinfo, 1, "lock_key", PGQ_MAX_KEY_BYTES));
	args[2] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	nulls[2] = PG_ARGISNULL(2) ? 'n' : ' ';
	if (PG_ARGISNULL(3))
	{
		args[3] = (Datum) 0;
		nulls[3] = 'n';
	}
	else
	{
		int64		usecs = pgq_interval_arg(fcinfo, 3, "retry_in", 0, PGQ_MAX_RETRY_USECS, "365 days");

		args[3] = PG_GETARG_DATUM(3);
		due_now = (usecs == 0);
	}
	args[4] = Int64GetDatum(PGQ_BACKOFF_BASE_USECS);
	args[5] = Float8GetDatum(0.5 + 0.5 * pg_prng_double(&pg_global_prng_state));
	args[6] = Int64GetDatum(PGQ_BACKOFF_CAP_USECS);

	layout = pgq_layout();
	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_nack[layout], nack_sql[layout], 7, types),
						 args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "nack failed");
	if (SPI_processed == 1)
	{
		char	   *s = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		state = SPI_palloc(strlen(s) + 1);
		strcpy(state, s);
		if (strcmp(state, "retry") == 0)
		{
			HeapTuple	tup = SPI_tuptable->vals[0];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;

			/* the job is ready again (key columns 3, 4) when this commits */
			pgq_sched_lower_at_commit(DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull)),
									  DatumGetTimestampTz(SPI_getbinval(tup, desc, 4, &isnull)));
		}
		pgq_wake_if_capped();
	}
	SPI_finish();

	if (state == NULL)
		PG_RETURN_NULL();
	pgq_count(PGQ_NACKED, 1);
	pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
	if (strcmp(state, "failed") == 0)
		pgq_count(PGQ_FAILED, 1);
	else if (due_now)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	PG_RETURN_TEXT_P(cstring_to_text(state));
}

/*
 * The statement of pgq_release: every work_queue row held by $1 is released
 * (claimable at once), or, on its last try, deleted and its job failed.
 * Returns how many of each.  In 1.1 the job rows of released jobs get their
 * attempt count and version back from work_queue too.
 */
#define RELEASE_TAIL(TRIES, VERSION) \
" rel AS (" \
"  UPDATE pgqueue.work_queue w" \
"     SET lock_key = NULL, lock_timeout = NULL, started = NULL" \
"   WHERE w.id = ANY (ARRAY(SELECT r.id FROM r WHERE NOT r.last_try))" \
"  RETURNING w.id)," \
" dw AS (" \
"  DELETE FROM pgqueue.work_queue w" \
"   WHERE w.id = ANY (ARRAY(SELECT r.id FROM r WHERE r.last_try))" \
"  RETURNING w.id)," \
" dq AS (" \
"  UPDATE pgqueue.queue q" \
"     SET state = 'failed', tries = " TRIES ", version = " VERSION "," \
"         last_error = pg_catalog.format('released by %s on try %s of %s'," \
"                                        $1, r.tries, r.max_tries)" \
"    FROM r" \
"   WHERE q.id = ANY (ARRAY(SELECT dw.id FROM dw)) AND r.id = q.id" \
"  RETURNING q.id)"

static const char *const release_sql[2] = {
	"WITH r AS ("
	"  SELECT w.id, q.tries, q.max_tries, q.tries >= q.max_tries AS last_try"
	"    FROM pgqueue.work_queue w CROSS JOIN LATERAL ("
	"         SELECT q.tries, coalesce((SELECT s.max_tries FROM pgqueue.queues s"
	"                                    WHERE s.queue = q.queue), 5) AS max_tries"
	"           FROM pgqueue.queue q WHERE q.id = w.id LIMIT 1) q"
	"   WHERE w.lock_key = $1"
	"     FOR UPDATE OF w),"
	RELEASE_TAIL("q.tries", "q.version + 1")
	" SELECT (SELECT count(*) FROM rel)::int, (SELECT count(*) FROM dq)::int",

	"WITH r AS ("
	"  SELECT w.id, w.tries, w.version, coalesce(s.max_tries, 5) AS max_tries,"
	"         w.tries >= coalesce(s.max_tries, 5) AS last_try"
	"    FROM pgqueue.work_queue w LEFT JOIN pgqueue.queues s ON s.queue = w.queue"
	"   WHERE w.lock_key = $1"
	"     FOR UPDATE OF w),"
	RELEASE_TAIL("r.tries", "r.version + 1") ","
	" sync AS ("
	"  UPDATE pgqueue.queue q SET tries = r.tries, version = r.version"
	"    FROM r"
	"   WHERE q.id = ANY (ARRAY(SELECT rel.id FROM rel)) AND r.id = q.id)"
	" SELECT (SELECT count(*) FROM rel)::int, (SELECT count(*) FROM dq)::int"
};

/*
 * pgq_release(lock_key) returns int
 *
 * Gives back every job lock_key holds: they become claimable at once (in
 * their original scheduling order).  A job that was on its last try is
 * failed instead, as if its lease had run out.  Returns how many jobs
 * lock_key held.
 */
Datum
pgq_release(PG_FUNCTION_ARGS)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	int			released;
	int			failed;
	bool		isnull;
	PgqLayout	layout;

	args[0] = CStringGetTextDatum(pgq_text_arg(fcinfo, 0, "lock_key", PGQ_MAX_KEY_BYTES));

	layout = pgq_layout();
	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_release[layout], release_sql[layout], 1, types),
						 args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "release failed");
	released = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	failed = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	SPI_finish();

	pgq_count(PGQ_FAILED, failed);
	if (released > 0)
	{
		pgq_wake_at_commit(PGQ_WAKE_CLAIMERS | PGQ_WAKE_ON_ABORT);
		pgq_hint_lower_at_commit(PGQ_HINT_READY, DT_NOBEGIN);
	}
	if (failed > 0)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);	/* places freed */
	PG_RETURN_INT32(released + failed);
}

/* ----------------------------------------------------------------
 * pgq_configure, pgq_stats
 * ----------------------------------------------------------------
 */

/* An optional int argument: NULL, or between min and max. */
static void
pgq_optional_int_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
					 int32 min, int32 max, Datum *value, char *null)
{
	if (PG_ARGISNULL(argno))
	{
		*value = (Datum) 0;
		*null = 'n';
		return;
	}
	if (PG_GETARG_INT32(argno) < min || PG_GETARG_INT32(argno) > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between %d and %d", argname, min, max),
				 errdetail("%s was %d.", argname, PG_GETARG_INT32(argno))));
	*value = PG_GETARG_DATUM(argno);
	*null = ' ';
}

/*
 * pgq_configure(queue, weight, max_in_flight, max_tries, paused) returns void
 *
 * Creates or updates the queue's settings row; NULL keeps a setting.
 */
Datum
pgq_configure(PG_FUNCTION_ARGS)
{
	Oid			types[5] = {TEXTOID, INT4OID, INT4OID, INT4OID, BOOLOID};
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	args[0] = CStringGetTextDatum(pgq_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES));
	pgq_optional_int_arg(fcinfo, 1, "weight", 1, 10000, &args[1], &nulls[1]);
	pgq_optional_int_arg(fcinfo, 2, "max_in_flight", 0, PG_INT32_MAX, &args[2], &nulls[2]);
	pgq_optional_int_arg(fcinfo, 3, "max_tries", 1, PG_INT32_MAX, &args[3], &nulls[3]);
	args[4] = PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4);
	nulls[4] = PG_ARGISNULL(4) ? 'n' : ' ';

	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_configure,
									   "INSERT INTO pgqueue.queues AS s (queue, weight, max_in_flight, max_tries, paused)"
									   " VALUES ($1, coalesce($2, 1), coalesce($3, 0), coalesce($4, 5), coalesce($5, false))"
									   " ON CONFLICT (queue) DO UPDATE"
									   "   SET weight = coalesce($2, s.weight),"
									   "       max_in_flight = coalesce($3, s.max_in_flight),"
									   "       max_tries = coalesce($4, s.max_tries),"
									   "       paused = coalesce($5, s.paused)",
									   5, types),
						 args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "pgqueue: configure failed");
	SPI_finish();

	/* unpausing or raising a cap can make jobs schedulable */
	pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	PG_RETURN_VOID();
}

/*
 * pgq_stats() returns table
 *
 * One row per queue that has jobs or settings.  scheduled counts
 * work_queue rows not held by a live lease, in_flight those held by one;
 * oldest_ready is the earliest due time of a job that is ready and not in
 * flight.
 */
Datum
pgq_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	uint64		i;

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_stats,
									   "WITH t AS MATERIALIZED (SELECT pg_catalog.clock_timestamp() AS ts),"
									   " j AS ("
									   "  SELECT q.queue,"
									   "         count(*) FILTER (WHERE q.state = 'pending') AS pending,"
									   "         count(*) FILTER (WHERE q.state = 'retry') AS retry,"
									   "         count(*) FILTER (WHERE q.state = 'failed') AS failed,"
									   "         min(q.run_after) FILTER (WHERE q.state IN ('pending', 'retry')"
									   "                                    AND q.run_after <= t.ts) AS oldest"
									   "    FROM pgqueue.queue q, t GROUP BY q.queue),"
									   " w AS ("
									   "  SELECT w.queue,"
									   "         count(*) FILTER (WHERE w.lock_timeout IS NULL OR w.lock_timeout < t.ts) AS scheduled,"
									   "         count(*) FILTER (WHERE w.lock_timeout >= t.ts) AS in_flight,"
									   "         min(q.run_after) FILTER (WHERE w.lock_timeout IS NULL OR w.lock_timeout < t.ts) AS oldest"
									   "    FROM pgqueue.work_queue w JOIN pgqueue.queue q ON q.id = w.id, t"
									   "   GROUP BY w.queue),"
									   " n AS (SELECT j.queue FROM j UNION SELECT w.queue FROM w"
									   "       UNION SELECT s.queue FROM pgqueue.queues s)"
									   " SELECT n.queue, coalesce(j.pending, 0), coalesce(j.retry, 0),"
									   "        coalesce(w.scheduled, 0), coalesce(w.in_flight, 0),"
									   "        coalesce(j.failed, 0), LEAST(j.oldest, w.oldest)"
									   "   FROM n LEFT JOIN j ON j.queue = n.queue LEFT JOIN w ON w.queue = n.queue"
									   "  ORDER BY n.queue",
									   0, NULL),
						 NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "pgqueue: stats failed");

	for (i = 0; i < SPI_processed; i++)
	{
		Datum		values[7];
		bool		isnull[7];
		int			col;

		for (col = 0; col < 7; col++)
			values[col] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										col + 1, &isnull[col]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}
	SPI_finish();

	return (Datum) 0;
}
