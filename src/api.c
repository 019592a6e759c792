/*-------------------------------------------------------------------------
 *
 * api.c
 *		The SQL-callable job API (push, push_batch, schedule, claim,
 *		extend, ack, ack_batch, nack, release, configure, stats): argument
 *		checking, then the work in jobs.c (per-job writes), claim.c
 *		(claims), schedule.c (the scheduling pass), or here through SPI for
 *		the calls that are not per job.
 *
 * Every function runs as SECURITY DEFINER, but not every one fixes
 * search_path (pgqueue--1.1.sql).  pgq_push_batch, pgq_schedule,
 * pgq_release, pgq_configure and pgq_stats are declared with SET
 * search_path = pg_catalog, pg_temp (and, but for pgq_stats, the planner
 * settings: enable_seqscan, enable_bitmapscan and jit off).  The per-job
 * calls, pgq_push, pgq_claim, pgq_extend, pgq_ack, pgq_ack_batch and
 * pgq_nack, carry no SET clause from 1.1 on: their C paths resolve no name
 * through search_path, and the SQL they run on rare paths (a push with a
 * dedup_key, the steal of expired leases, the look for a job row not found
 * in its slots) connects with pgq_spi_connect, which sets the same
 * search_path and planner settings for it.  (In a 1.0 database every
 * function keeps its SET clauses.)  All queries are schema-qualified, take
 * values only as SPI parameters, and are prepared once per backend and
 * kept (pgq_keep_plan).
 *
 * Lock order, to stay free of deadlocks: a function that touches an
 * existing job locks its pgqueue.work_queue row first and its pgqueue.queue
 * row second.  The scheduling pass only locks pgqueue.queue rows that have
 * no work_queue row yet.
 *
 * Layer 5 of src/README (SQL entry points): it may call the other file of
 * its layer, the job operations (jobs.c, claim.c, schedule.c, archive.c)
 * and every layer below them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
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
#include "utils/uuid.h"

#include "api.h"

PG_FUNCTION_INFO_V1(pgq_push);
PG_FUNCTION_INFO_V1(pgq_push_batch);
PG_FUNCTION_INFO_V1(pgq_schedule);
PG_FUNCTION_INFO_V1(pgq_claim);
PG_FUNCTION_INFO_V1(pgq_extend);
PG_FUNCTION_INFO_V1(pgq_ack);
PG_FUNCTION_INFO_V1(pgq_ack_batch);
PG_FUNCTION_INFO_V1(pgq_nack);
PG_FUNCTION_INFO_V1(pgq_release);
PG_FUNCTION_INFO_V1(pgq_configure);
PG_FUNCTION_INFO_V1(pgq_stats);

/* pgqueue.max_payload_size (kB): the largest payload a push takes */
int			pgqueue_max_payload_kb = 16 * 1024;

/* Kept plans, prepared on first use in each backend. */
static SPIPlanPtr plan_push_dedup[PGQ_NUM_LAYOUTS];	/* by layout */
static SPIPlanPtr plan_find_dedup[2];	/* by slotted (1.1) or not (1.0) */
static SPIPlanPtr plan_release[PGQ_NUM_LAYOUTS];
static SPIPlanPtr plan_configure[PGQ_NUM_LAYOUTS];
static SPIPlanPtr plan_stats[2] = {NULL, NULL};

static text *pgq_key_arg(FunctionCallInfo fcinfo, int argno, const char *argname);
static void pgq_check_payload(Jsonb *payload);
static void pgq_check_run_after(TimestampTz run_after);
static ArrayType *pgq_queues_arg(FunctionCallInfo fcinfo, int argno);
static Datum *pgq_ids_arg(FunctionCallInfo fcinfo, int argno, int *n);
static bool pgq_user_upkeep(void);

/* ----------------------------------------------------------------
 * Helpers
 * ----------------------------------------------------------------
 */

/* A required lock_key argument (1 .. PGQ_MAX_KEY_BYTES bytes) as text. */
static text *
pgq_key_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	return pgq_checked_text_arg(fcinfo, argno, argname, PGQ_MAX_KEY_BYTES);
}

/*
 * A required uuid[] argument of at most PGQ_MAX_ITEMS ids, as datums (NULL
 * elements dropped: no job has a NULL id).
 */
static Datum *
pgq_ids_arg(FunctionCallInfo fcinfo, int argno, int *n)
{
	ArrayType  *ids;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	int			i;

	pgq_require(fcinfo, argno, "ids");
	ids = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(ids) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("ids must be a one-dimensional array")));
	if (ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids)) > PGQ_MAX_ITEMS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("at most %d ids can be acked in one call", PGQ_MAX_ITEMS)));
	deconstruct_array(ids, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR,
					  &elems, &nulls, &nelems);
	*n = 0;
	for (i = 0; i < nelems; i++)
		if (!nulls[i])
			elems[(*n)++] = elems[i];
	return elems;
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
 * The jobs pgq_push and pgq_push_batch insert (queue is argument 0,
 * run_after argument 2, priority argument 3 of both) are ready when they
 * commit (publish.c).
 */
static void
pgq_push_lower_at_commit(FunctionCallInfo fcinfo, int32 slot)
{
	PgqKey		k;

	k.hi = -(int64) PG_GETARG_INT32(3);
	k.lo = PG_ARGISNULL(2) ? GetCurrentTransactionStartTimestamp() : PG_GETARG_TIMESTAMPTZ(2);
	pgq_ready_at_commit(PG_GETARG_TEXT_PP(0), k, PGQ_SLOT_BIT(slot));
}

/*
 * A job's own max_tries (1.2: argument argno of pgq_push and pgq_push_batch;
 * the 1.1 functions have no such argument): 0 when absent or NULL, the
 * queue's then applies.
 */
static int32
pgq_max_tries_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		max_tries;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return 0;
	max_tries = PG_GETARG_INT32(argno);
	if (max_tries < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_tries must be at least 1"),
				 errdetail("max_tries was %d.", max_tries),
				 errhint("Pass NULL to use the queue's max_tries (pgq_configure).")));
	return max_tries;
}

/*
 * A job's parents (1.2: argument argno of pgq_push and pgq_push_batch):
 * NULL when absent, NULL or empty; else a one-dimensional array of at
 * most PGQ_MAX_PARENTS ids without null.
 */
static ArrayType *
pgq_after_arg(FunctionCallInfo fcinfo, int argno)
{
	ArrayType  *after;
	int			n;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	after = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(after) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("after must be a one-dimensional array")));
	n = ArrayGetNItems(ARR_NDIM(after), ARR_DIMS(after));
	if (n == 0)
		return NULL;
	if (n > PGQ_MAX_PARENTS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("after names %d jobs; a job can wait for at most %d",
						n, PGQ_MAX_PARENTS),
				 errhint("Make a job that waits for some of them, and wait for it.")));
	if (array_contains_nulls(after))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("after must not contain null")));
	return after;
}

/*
 * A job's group (1.2: argument argno of pgq_push and pgq_push_batch):
 * NULL when absent or NULL.  At most
 * PGQ_MAX_GROUP_BYTES bytes, not empty (an empty key is almost surely a
 * caller's bug: NULL is "no group").
 */
static text *
pgq_group_key_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	return pgq_checked_text_arg(fcinfo, argno, "group_key", PGQ_MAX_GROUP_BYTES);
}

/* The dedup push's INSERT, by layout: 1.0 into the table, 1.1 and 1.2 slot 0 */
#define PUSH_DEDUP_SQL(TABLE, COLS, VALUES) \
	"INSERT INTO pgqueue." TABLE " (id, queue, payload, run_after, priority, dedup_key" COLS ")" \
	" VALUES ($1, $2, $3, coalesce($4, pg_catalog.now()), $5, $6" VALUES ")" \
	" ON CONFLICT (queue, dedup_key)" \
	"   WHERE dedup_key IS NOT NULL AND state <> 'failed'" \
	" DO NOTHING RETURNING id"

static const char *const push_dedup_sql[PGQ_NUM_LAYOUTS] = {
	PUSH_DEDUP_SQL("queue", "", ""),
	PUSH_DEDUP_SQL("queue_0", "", ""),
	PUSH_DEDUP_SQL("queue_0", ", max_tries, waiting_for, state, group_key",
				   ", $7, $8, $9::pgqueue.job_state, $10")
};

/*
 * pgq_push(queue, payload, run_after, priority, dedup_key, max_tries, after,
 *          group_key) returns uuid (1.1: the first five)
 *
 * Inserts a pending job, of group group_key when not NULL, or a waiting
 * one when some job of after is unfinished (flow.c).  With a dedup_key, a
 * live job with the same
 * (queue, dedup_key) wins and its id is returned instead (its own
 * max_tries and parents unchanged).
 */
Datum
pgq_push(PG_FUNCTION_ARGS)
{
	text	   *queue = pgq_checked_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES);
	Jsonb	   *payload;
	text	   *dedup_key = NULL;
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	pg_uuid_t  *result = NULL;
	int32		slot = 0;		/* where it went: jobs with a dedup_key, slot 0 */
	int32		max_tries = pgq_max_tries_arg(fcinfo, 5);
	ArrayType  *after = pgq_after_arg(fcinfo, 6);
	text	   *group_key = pgq_group_key_arg(fcinfo, 7);
	ArrayType  *parents = NULL;
	int			nparents = 0;
	Datum		args[10];
	char		nulls[10] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int			attempt;

	pgq_require(fcinfo, 1, "payload");
	payload = PG_GETARG_JSONB_P(1);
	pgq_check_payload(payload);
	if (!PG_ARGISNULL(2))
		pgq_check_run_after(PG_GETARG_TIMESTAMPTZ(2));
	pgq_require(fcinfo, 3, "priority");
	if (!PG_ARGISNULL(4))
		dedup_key = pgq_checked_text_arg(fcinfo, 4, "dedup_key", PGQ_MAX_KEY_BYTES);

	pgq_uuid7(id);
	args[0] = UUIDPGetDatum(id);
	args[1] = PointerGetDatum(queue);
	args[2] = JsonbPGetDatum(payload);
	args[3] = PG_GETARG_DATUM(2);
	nulls[3] = PG_ARGISNULL(2) ? 'n' : ' ';
	args[4] = PG_GETARG_DATUM(3);
	args[5] = PointerGetDatum(dedup_key);
	nulls[5] = dedup_key ? ' ' : 'n';
	args[6] = Int32GetDatum(max_tries);
	nulls[6] = max_tries > 0 ? ' ' : 'n';

	/* the parents still unfinished, locked until the job's edges commit */
	if (after != NULL)
		parents = pgq_flow_lock_parents(after, &nparents);
	args[7] = Int32GetDatum(nparents);
	nulls[7] = nparents > 0 ? ' ' : 'n';
	/*
	 * The state, as text: the label 'waiting' in the statement would be
	 * read when it is planned, which fails in the transaction of CREATE
	 * EXTENSION (see STATS_WAITING_COUNT).
	 */
	args[8] = CStringGetTextDatum(nparents > 0 ? "waiting" : "pending");
	args[9] = PointerGetDatum(group_key);
	nulls[9] = group_key ? ' ' : 'n';

	if (dedup_key == NULL)
	{
		slot = pgq_push_job(id, queue, payload, !PG_ARGISNULL(2),
					 PG_ARGISNULL(2) ? 0 : PG_GETARG_TIMESTAMPTZ(2),
					 PG_GETARG_INT32(3), max_tries, nparents, group_key);
		result = id;
	}
	else
	{
		Oid			types[10] = {UUIDOID, TEXTOID, JSONBOID, TIMESTAMPTZOID, INT4OID, TEXTOID,
		INT4OID, INT4OID, TEXTOID, TEXTOID};
		Oid			ftypes[2] = {TEXTOID, TEXTOID};
		SPIPlanPtr	plan;
		SPIPlanPtr	find;
		Datum		fargs[2] = {args[1], args[5]};
		int			nest = pgq_spi_connect();

		/*
		 * In 1.1 the unique index is the slot's (a partitioned table has
		 * none to infer the arbiter from): insert into the slot.
		 */
		bool		slotted = get_rel_relkind(pgq_relid(get_namespace_oid("pgqueue", false),
														"queue")) == RELKIND_PARTITIONED_TABLE;
		PgqLayout	layout = !slotted ? PGQ_V10 :
			get_attnum(pgq_relid(get_namespace_oid("pgqueue", false), "queue"),
					   "max_tries") != InvalidAttrNumber ? PGQ_V12 : PGQ_V11;

		/*
		 * Jobs with a dedup_key go to slot 0, queue's cold slot, and stay
		 * there (ring.c moves rows into it, never out): its unique index
		 * covers every one of them.
		 */
		if ((max_tries > 0 || nparents > 0 || group_key != NULL) && layout < PGQ_V12)
			elog(ERROR, "pgqueue.queue has no max_tries, waiting_for or group_key column");
		plan = pgq_keep_plan(&plan_push_dedup[layout], push_dedup_sql[layout],
							 layout == PGQ_V12 ? 10 : 6, types);
		find = pgq_keep_plan(&plan_find_dedup[slotted],
							 slotted ?
							 "SELECT id FROM pgqueue.queue_0"
							 " WHERE queue = $1 AND dedup_key = $2 AND state <> 'failed'" :
							 "SELECT id FROM pgqueue.queue"
							 " WHERE queue = $1 AND dedup_key = $2 AND state <> 'failed'",
							 2, ftypes);

		/*
		 * Insert, or find the live job that holds the key.  That job can be
		 * finished between the two statements; then insert again.
		 */
		for (attempt = 0; attempt < 10 && result == NULL; attempt++)
		{
			bool		isnull;

			if (SPI_execute_plan(plan, args, nulls, false, 0) != SPI_OK_INSERT_RETURNING)
				elog(ERROR, "push failed");
			if (SPI_processed == 1)
			{
				result = id;
				break;
			}
			if (SPI_execute_plan(find, fargs, NULL, false, 1) != SPI_OK_SELECT)
				elog(ERROR, "dedup lookup failed");
			if (SPI_processed == 1)
			{
				Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull);

				result = SPI_palloc(sizeof(pg_uuid_t));
				memcpy(result, DatumGetUUIDP(d), sizeof(pg_uuid_t));
				/* an existing job: nothing new, no count, no wake-up */
				pgq_spi_finish(nest);
				PG_RETURN_UUID_P(result);
			}
		}
		if (result == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not push job with dedup_key \"%s\": it kept conflicting with a concurrent job",
							text_to_cstring(dedup_key)),
					 errhint("Retry the transaction.")));
		pgq_spi_finish(nest);
	}

	pgq_count(PGQ_PUSHED, 1);
	if (nparents > 0)
	{
		/* waiting: its last parent's ack makes it ready (flow.c) */
		pgq_flow_link(parents, result, 1);
		PG_RETURN_UUID_P(result);
	}
	pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	pgq_push_lower_at_commit(fcinfo, slot);
	PG_RETURN_UUID_P(result);
}

/*
 * pgq_push_batch(queue, payloads jsonb[], run_after, priority, max_tries,
 *                after, group_key) returns setof uuid (1.1: the first four)
 *
 * Inserts one job per payload (jobs.c, in one write), each waiting for the
 * unfinished jobs of after (flow.c), and returns their ids in the order of
 * the payloads.
 */
Datum
pgq_push_batch(PG_FUNCTION_ARGS)
{
	text	   *queue = pgq_checked_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *payloads;
	Datum	   *elems;
	bool	   *elnulls;
	Datum	   *iddatums;
	pg_uuid_t  *idvals;
	int			n;
	int			i;
	int32		slot;
	int32		max_tries = pgq_max_tries_arg(fcinfo, 4);
	ArrayType  *after = pgq_after_arg(fcinfo, 5);
	ArrayType  *parents = NULL;
	int			nparents = 0;
	text	   *group_key = pgq_group_key_arg(fcinfo, 6);

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
	if (after != NULL)
		parents = pgq_flow_lock_parents(after, &nparents);
	slot = pgq_push_jobs(idvals, elems, n, queue, !PG_ARGISNULL(2),
						 PG_ARGISNULL(2) ? 0 : PG_GETARG_TIMESTAMPTZ(2),
						 PG_GETARG_INT32(3), max_tries, nparents, group_key);
	if (nparents > 0)
		pgq_flow_link(parents, idvals, n);

	for (i = 0; i < n; i++)
	{
		bool		isnull = false;

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
							 &iddatums[i], &isnull);
	}

	pgq_count(PGQ_PUSHED, n);
	if (nparents > 0)
		return (Datum) 0;		/* waiting (flow.c) */
	pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	pgq_push_lower_at_commit(fcinfo, slot);
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * pgq_schedule
 * ----------------------------------------------------------------
 */

/*
 * Whether a user's pgq_schedule runs the upkeep of the archive (archive.c,
 * retire.c) now.  Its DDL takes ACCESS EXCLUSIVE on pgqueue.archive, held
 * to the end of the transaction: in the caller's open transaction it
 * would make every ack, cancel and purge on a queue with a retention wait
 * for the caller's commit.  So it never runs in a transaction that goes
 * on after the statement: not in a transaction block (BEGIN, or several
 * statements sent as one), nor in a pipeline of the extended protocol
 * (PreventInTransactionBlock's test); the statement's transaction is then
 * made to commit with it (as CREATE DATABASE does).  And not when a
 * scheduler runs for this database with pgqueue.enabled on: it runs the
 * upkeep in transactions of its own.  What is left is a server without
 * the preloaded library, or with the scheduler off, where the cron that
 * calls pgq_schedule() runs the upkeep.
 */
static bool
pgq_user_upkeep(void)
{
	if (pgqueue_enabled && pgq_scheduler_attached())
		return false;
	if (IsTransactionBlock() || (MyXactFlags & XACT_FLAGS_PIPELINING))
		return false;
	if (!pgq_archive_maintain_wanted() && !pgq_retired_drop_wanted())
		return false;
	MyXactFlags |= XACT_FLAGS_NEEDIMMEDIATECOMMIT;
	return true;
}

/*
 * pgq_schedule(max_items int) returns int
 *
 * One scheduling pass run by the user (the background worker calls
 * pgq_schedule_pass directly), with the archive's upkeep when
 * pgq_user_upkeep says so.
 */
Datum
pgq_schedule(PG_FUNCTION_ARGS)
{
	int			max_items = pgq_max_items_arg(fcinfo, 0);
	int			moved;

	if (pgq_user_upkeep())
	{
		if (pgq_archive_maintain_wanted())
			pgq_archive_maintain();
		if (pgq_retired_drop_wanted())
			pgq_retired_drop();
	}
	moved = pgq_schedule_pass(max_items);

	pgq_count_now(PGQ_PASSES, 1);
	PG_RETURN_INT32(moved);
}

/* ----------------------------------------------------------------
 * pgq_claim
 * ----------------------------------------------------------------
 */

/*
 * pgq_claim(lock_key, max_items, lease, queues, wait) returns table
 *
 * Claims up to max_items jobs for lock_key (claim.c).
 */
Datum
pgq_claim(PG_FUNCTION_ARGS)
{
	text	   *lock_key = pgq_key_arg(fcinfo, 0, "lock_key");
	int			max_items = pgq_max_items_arg(fcinfo, 1);
	ArrayType  *queues;
	int64		wait_usecs;

	pgq_interval_arg(fcinfo, 2, "lease", 1, PGQ_MAX_LEASE_USECS, "7 days");
	queues = pgq_queues_arg(fcinfo, 3);
	wait_usecs = pgq_interval_arg(fcinfo, 4, "wait", 0, PGQ_MAX_WAIT_USECS, "60 seconds");

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	pgq_claim_jobs((ReturnSetInfo *) fcinfo->resultinfo, lock_key, max_items,
				   PG_GETARG_DATUM(2), queues, GetCurrentTimestamp() + wait_usecs);
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
	text	   *lock_key;
	TimestampTz deadline;

	pgq_require(fcinfo, 0, "id");
	lock_key = pgq_key_arg(fcinfo, 1, "lock_key");
	pgq_interval_arg(fcinfo, 2, "lease", 1, PGQ_MAX_LEASE_USECS, "7 days");

	if (!pgq_extend_job(PG_GETARG_DATUM(0), lock_key, PG_GETARG_DATUM(2), &deadline))
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(deadline);
}

/*
 * pgq_ack(id, lock_key) returns boolean
 *
 * Finishes the job (it leaves both tables) if lock_key holds it.
 */
Datum
pgq_ack(PG_FUNCTION_ARGS)
{
	Datum		id;
	text	   *lock_key;

	pgq_require(fcinfo, 0, "id");
	id = PG_GETARG_DATUM(0);
	lock_key = pgq_key_arg(fcinfo, 1, "lock_key");
	PG_RETURN_BOOL(pgq_ack_jobs(&id, 1, lock_key) == 1);
}

/*
 * pgq_ack_batch(ids uuid[], lock_key) returns int
 *
 * pgq_ack for many jobs in one call; returns how many were acked (ids not
 * held by lock_key are skipped).
 */
Datum
pgq_ack_batch(PG_FUNCTION_ARGS)
{
	int			n;
	Datum	   *ids = pgq_ids_arg(fcinfo, 0, &n);
	text	   *lock_key = pgq_key_arg(fcinfo, 1, "lock_key");

	PG_RETURN_INT32(pgq_ack_jobs(ids, n, lock_key));
}

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
	text	   *lock_key;
	const char *state;

	pgq_require(fcinfo, 0, "id");
	lock_key = pgq_key_arg(fcinfo, 1, "lock_key");
	if (!PG_ARGISNULL(3))
		pgq_interval_arg(fcinfo, 3, "retry_in", 0, PGQ_MAX_RETRY_USECS, "365 days");

	state = pgq_nack_job(PG_GETARG_DATUM(0), lock_key,
						 PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2),
						 !PG_ARGISNULL(3), PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3));
	if (state == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(state));
}

/*
 * The statement of pgq_release: every work_queue row held by $1 is released
 * (claimable at once), or, on its last try, deleted and its job failed.
 * Returns how many of each, and the earliest created of the rows released.
 * In 1.1 the job rows of released jobs get their attempt count and version
 * back from work_queue too.
 */
#define RELEASE_REST \
" rel AS (" \
"  UPDATE pgqueue.work_queue w" \
"     SET lock_key = NULL, lock_timeout = NULL, started = NULL" \
"   WHERE w.id = ANY (ARRAY(SELECT j.id FROM j WHERE NOT j.last_try))" \
"  RETURNING w.id, w.created),"

#define RELEASE_REASON \
"pg_catalog.format('released by %s on try %s of %s', $1, j.tries, j.max_tries)"

/* 1.1 and 1.2 (MAX_TRIES: a job's max_tries in SQL) */
#define RELEASE_11(MAX_TRIES) \
	"WITH j0 AS (" \
	"  SELECT w.id, w.tries, w.version, " MAX_TRIES " AS max_tries," \
	"         w.tries >= " MAX_TRIES " AS last_try" \
	"    FROM pgqueue.work_queue w LEFT JOIN pgqueue.queues s ON s.queue = w.queue" \
	"   WHERE w.lock_key = $1" \
	"     FOR UPDATE OF w)," \
	" j AS (SELECT j.*, " RELEASE_REASON " AS reason FROM j0 j)," \
	RELEASE_REST \
	PGQ_SQL_FAIL_LAST_TRIES("j.tries", "j.version + 1") "," \
	" sync AS (" \
	"  UPDATE pgqueue.queue q SET tries = j.tries, version = j.version" \
	"    FROM j" \
	"   WHERE q.id = ANY (ARRAY(SELECT rel.id FROM rel)) AND j.id = q.id)" \
	" SELECT (SELECT count(*) FROM rel)::int, (SELECT count(*) FROM dq)::int," \
	"        (SELECT min(rel.created) FROM rel)"

static const char *const release_sql[PGQ_NUM_LAYOUTS] = {
	/* 1.0 */
	"WITH l AS ("
	"  SELECT w.id FROM pgqueue.work_queue w WHERE w.lock_key = $1 FOR UPDATE OF w),"
	" j0 AS ("
	"  SELECT l.id, q.tries, NULL::int AS version, q.max_tries,"
	"         q.tries >= q.max_tries AS last_try"
	"    FROM l " PGQ_SQL_JOB_TRIES_10("l") "),"
	" j AS (SELECT j.*, " RELEASE_REASON " AS reason FROM j0 j),"
	RELEASE_REST
	PGQ_SQL_FAIL_LAST_TRIES("q.tries", "q.version + 1")
	" SELECT (SELECT count(*) FROM rel)::int, (SELECT count(*) FROM dq)::int,"
	"        (SELECT min(rel.created) FROM rel)",

	/* 1.1 */
	RELEASE_11(PGQ_SQL_MAX_TRIES),
	/* 1.2 */
	RELEASE_11(PGQ_SQL_JOB_MAX_TRIES("w"))
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
	TimestampTz first = 0;
	bool		isnull;
	PgqLayout	layout;

	args[0] = PointerGetDatum(pgq_checked_text_arg(fcinfo, 0, "lock_key", PGQ_MAX_KEY_BYTES));

	layout = pgq_layout();
	SPI_connect();
	if (pgq_execute_moving(pgq_keep_plan(&plan_release[layout], release_sql[layout], 1, types),
						   args, NULL) != SPI_OK_SELECT)
		elog(ERROR, "release failed");
	released = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	failed = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	if (released > 0)
		first = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
												  SPI_tuptable->tupdesc, 3, &isnull));
	SPI_finish();

	pgq_count(PGQ_FAILED, failed);
	if (released + failed > 0)
	{
		/* work_queue rows changed: LEASE rows left, READY rows came (bounds.c) */
		pgq_bound_hold(PGQ_BOUND_LEASE);
		pgq_bound_hold(PGQ_BOUND_READY);
	}
	if (released > 0)
	{
		pgq_wake_at_commit(PGQ_WAKE_CLAIMERS | PGQ_WAKE_ON_ABORT);
		pgq_bound_lower_at_commit(PGQ_BOUND_READY, pgq_time_key(first));
	}
	if (failed > 0)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER | PGQ_WAKE_PLACES);	/* places freed */
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
 * The statement of pgq_configure: 1.0 has no retention ($6), 1.1 no
 * rate_limit ($7) and rate_period ($8).
 */
#define CONFIGURE_SQL(COLS, VALUES, SET) \
	"INSERT INTO pgqueue.queues AS s (queue, weight, max_in_flight, max_tries, paused" COLS ")" \
	" VALUES ($1, coalesce($2, 1), coalesce($3, 0)," \
	"         coalesce($4, " CppAsString2(PGQ_DEFAULT_MAX_TRIES) "), coalesce($5, false)" VALUES ")" \
	" ON CONFLICT (queue) DO UPDATE" \
	"   SET weight = coalesce($2, s.weight)," \
	"       max_in_flight = coalesce($3, s.max_in_flight)," \
	"       max_tries = coalesce($4, s.max_tries)," \
	"       paused = coalesce($5, s.paused)" SET

static const char *const configure_sql[PGQ_NUM_LAYOUTS] = {
	CONFIGURE_SQL("", "", ""),
	CONFIGURE_SQL(", retention", ", coalesce($6, '0')", ", retention = coalesce($6, s.retention)"),
	CONFIGURE_SQL(", retention, rate_limit, rate_period, group_max_in_flight",
				  ", coalesce($6, '0'), coalesce($7, 0), coalesce($8, '1 second'),"
				  "  coalesce($9, 0)",
				  ", retention = coalesce($6, s.retention),"
				  "  rate_limit = coalesce($7, s.rate_limit),"
				  "  rate_period = coalesce($8, s.rate_period),"
				  "  group_max_in_flight = coalesce($9, s.group_max_in_flight)")
};

/* Bounds of rate_period (pgq_configure, 1.2). */
#define PGQ_MIN_RATE_PERIOD_USECS	(10 * INT64CONST(1000))
#define PGQ_MAX_RATE_PERIOD_USECS	USECS_PER_DAY

/*
 * pgq_configure(queue, weight, max_in_flight, max_tries, paused
 *               [, retention [, rate_limit, rate_period, group_max_in_flight]])
 * returns void
 *
 * Creates or updates the queue's settings row; NULL keeps a setting.  The
 * 1.1 function has a sixth argument, retention (0 to 365 days), and makes
 * the archive partitions its jobs will go to over the next day.  The 1.2
 * function has rate_limit (0: none) and rate_period (10 ms to 1 day, no
 * months): the scheduler releases at most rate_limit jobs of the queue in
 * any window of rate_period (rate.c), and group_max_in_flight (0: none):
 * at most that many jobs of one group of the queue in flight (schedule.c).
 */
Datum
pgq_configure(PG_FUNCTION_ARGS)
{
	Oid			types[9] = {TEXTOID, INT4OID, INT4OID, INT4OID, BOOLOID, INTERVALOID,
	INT4OID, INTERVALOID, INT4OID};
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', 'n', 'n', 'n', 'n'};
	PgqLayout	layout = PG_NARGS() > 7 ? PGQ_V12 : PG_NARGS() > 5 ? PGQ_V11 : PGQ_V10;
	int64		retention = 0;

	args[0] = PointerGetDatum(pgq_checked_text_arg(fcinfo, 0, "queue", PGQ_MAX_NAME_BYTES));
	pgq_optional_int_arg(fcinfo, 1, "weight", 1, 10000, &args[1], &nulls[1]);
	pgq_optional_int_arg(fcinfo, 2, "max_in_flight", 0, PG_INT32_MAX, &args[2], &nulls[2]);
	pgq_optional_int_arg(fcinfo, 3, "max_tries", 1, PG_INT32_MAX, &args[3], &nulls[3]);
	args[4] = PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4);
	nulls[4] = PG_ARGISNULL(4) ? 'n' : ' ';
	args[5] = (Datum) 0;
	if (layout >= PGQ_V11 && !PG_ARGISNULL(5))
	{
		retention = pgq_interval_arg(fcinfo, 5, "retention", 0, PGQ_MAX_RETENTION_USECS,
									 "365 days");
		args[5] = PG_GETARG_DATUM(5);
		nulls[5] = ' ';
	}
	if (layout >= PGQ_V12)
	{
		pgq_optional_int_arg(fcinfo, 6, "rate_limit", 0, PG_INT32_MAX, &args[6], &nulls[6]);
		if (!PG_ARGISNULL(7))
		{
			(void) pgq_length_arg(fcinfo, 7, "rate_period", PGQ_MIN_RATE_PERIOD_USECS,
								  PGQ_MAX_RATE_PERIOD_USECS, "10 milliseconds and 1 day",
								  "1 day");
			args[7] = PG_GETARG_DATUM(7);
			nulls[7] = ' ';
		}
		if (PG_NARGS() > 8)
			pgq_optional_int_arg(fcinfo, 8, "group_max_in_flight", 0, PG_INT32_MAX,
								 &args[8], &nulls[8]);
	}

	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_configure[layout], configure_sql[layout],
									   layout == PGQ_V12 ? 9 : layout == PGQ_V11 ? 6 : 5,
									   types),
						 args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "configure failed");
	SPI_finish();
	pgq_archive_prepare(retention);

	/* unpausing or raising a cap (a group's too) can make jobs schedulable */
	pgq_settings_changed_at_commit();
	pgq_wake_at_commit(PGQ_WAKE_SCHEDULER | PGQ_WAKE_PLACES);
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
#define STATS_SQL(WAITING_COUNT, WAITING_COL) \
	"WITH t AS MATERIALIZED (SELECT pg_catalog.clock_timestamp() AS ts)," \
	" j AS (" \
	"  SELECT q.queue," \
	"         count(*) FILTER (WHERE q.state = 'pending') AS pending," \
	"         count(*) FILTER (WHERE q.state = 'retry') AS retry," \
	"         count(*) FILTER (WHERE q.state = 'failed') AS failed," \
	WAITING_COUNT \
	"         min(q.run_after) FILTER (WHERE q.state IN ('pending', 'retry')" \
	"                                    AND q.run_after <= t.ts) AS oldest" \
	"    FROM pgqueue.queue q, t GROUP BY q.queue)," \
	" w AS (" \
	"  SELECT w.queue," \
	"         count(*) FILTER (WHERE w.lock_timeout IS NULL OR w.lock_timeout < t.ts) AS scheduled," \
	"         count(*) FILTER (WHERE w.lock_timeout >= t.ts) AS in_flight," \
	"         min(q.run_after) FILTER (WHERE w.lock_timeout IS NULL OR w.lock_timeout < t.ts) AS oldest" \
	"    FROM pgqueue.work_queue w JOIN pgqueue.queue q ON q.id = w.id, t" \
	"   GROUP BY w.queue)," \
	" n AS (SELECT j.queue FROM j UNION SELECT w.queue FROM w" \
	"       UNION SELECT s.queue FROM pgqueue.queues s)" \
	" SELECT n.queue, coalesce(j.pending, 0), coalesce(j.retry, 0)," \
	"        coalesce(w.scheduled, 0), coalesce(w.in_flight, 0)," \
	"        coalesce(j.failed, 0), LEAST(j.oldest, w.oldest)" WAITING_COL \
	"   FROM n LEFT JOIN j ON j.queue = n.queue LEFT JOIN w ON w.queue = n.queue" \
	"  ORDER BY n.queue"
/*
 * 1.2: waiting jobs (flow.c), the last column.  Counted as the jobs in no
 * other state: the label 'waiting' is not written in the statement, as a
 * label added by ALTER TYPE cannot be read in the transaction that added it
 * (CREATE EXTENSION of 1.2 runs the update from 1.1), where pgq_stats()
 * works all the same.
 */
#define STATS_WAITING_COUNT \
	"         count(*) FILTER (WHERE q.state NOT IN ('pending', 'retry', 'scheduled', 'failed'))" \
	" AS waiting,"
#define STATS_WAITING_COL ", coalesce(j.waiting, 0)"

Datum
pgq_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	uint64		i;
	int			ncols;
	int			waiting;

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	/* 1.1's function has 7 columns, 1.2's 8 (waiting) */
	ncols = rsinfo->setDesc->natts;
	if (ncols != 7 && ncols != 8)
		elog(ERROR, "pgq_stats() returns %d columns", ncols);
	waiting = ncols == 8;

	/*
	 * Not read-only: the statement takes a snapshot of its own after its
	 * plan has locked the slots, as a statement sent by a client does; the
	 * caller's may be older than a slot truncated before those locks
	 * (ring.c).
	 */
	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_stats[waiting],
									   waiting ? STATS_SQL(STATS_WAITING_COUNT, STATS_WAITING_COL) :
									   STATS_SQL("", ""),
									   0, NULL),
						 NULL, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "stats failed");

	for (i = 0; i < SPI_processed; i++)
	{
		Datum		values[8];
		bool		isnull[8];
		int			col;

		for (col = 0; col < ncols; col++)
			values[col] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										col + 1, &isnull[col]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}
	SPI_finish();

	return (Datum) 0;
}
