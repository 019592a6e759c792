/*-------------------------------------------------------------------------
 *
 * schedule.c
 *		The scheduling pass: move ready jobs from pgqueue.queue to
 *		pgqueue.work_queue, fairly across queues.
 *
 * A pass takes up to max_items jobs that are pending or retry, due
 * (run_after <= now), in a queue that is not paused and has room under its
 * max_in_flight.  Within a queue jobs go by priority (higher first), then
 * due time, then id.  Across queues the batch is shared by weighted fair
 * queuing: the k-th job of a queue of weight w gets the virtual time k / w
 * and the batch takes the smallest virtual times; batch_order follows them,
 * so claims interleave the queues too.
 *
 * A statement does this in two rounds at most.  The first gives each queue
 * its weighted share of the batch, ceil(max_items * w / sum(w)), so it reads
 * about max_items + (number of queues) rows however many queues are busy.
 * When some queues had fewer ready jobs than their share, a second round
 * offers what is left of the batch to the queues that still have jobs.  A
 * queue with 10 ready jobs is thus never starved by one with a million, and
 * a lone busy queue still fills the whole batch.
 *
 * Ready rows are locked FOR UPDATE SKIP LOCKED and re-checked, so two passes
 * running at once never schedule the same job: the second skips what the
 * first holds.
 *
 * Rows are updated through "id = ANY (ARRAY(...))" rather than a join with
 * the CTE: the planner cannot know how few rows a CTE holds and may pick a
 * hash join over a sequential scan of the whole table; the array form
 * always probes the primary key.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "pgqueue.h"

PG_FUNCTION_INFO_V1(pgq_schedule);

static SPIPlanPtr plan_round[2] = {NULL, NULL};
static SPIPlanPtr plan_busy = NULL;

static ArrayType *pgq_ready_queue_names(void);

/*
 * max_in_flight under concurrent passes: a pass takes a transaction-level
 * advisory lock on every capped queue, in a statement of its own before the
 * rounds, so that their snapshots count what the lock's previous holder
 * committed.  A capped queue locked by another open pass is left out of
 * this pass (never waited for): its room may be in use.  Returns those
 * queues, the $4 of the rounds.
 */
static const char *busy_sql =
"SELECT coalesce(pg_catalog.array_agg(s.queue), '{}'::text[])"
"  FROM pgqueue.queues s"
" WHERE CASE WHEN s.max_in_flight > 0"
"            THEN NOT pg_catalog.pg_try_advisory_xact_lock(1885827445, pg_catalog.hashtext(s.queue))"
"            ELSE false END";

/*
 * One round.  $1 = how many jobs at most, $2 = batch_order of the last job
 * already moved in this pass, $3 = true for the fair-share round, false to
 * offer all of $1 to every queue, $4 = the queues to leave out (busy_sql),
 * ($5, $6) = the SCHED bound (bounds.c): queues are walked from there,
 * $7 = the names of the queues in queue_ready_idx (pgq_ready_queue_names).
 */
#define ROUND_SQL_HEAD \
"WITH" \
" t AS MATERIALIZED (SELECT pg_catalog.clock_timestamp() AS ts)," \
/* queues with ready jobs, and the key of the first (pgq_ready_queue_names) */ \
" active (queue, np, ra) AS (" \
"  SELECT f.queue, f.np, f.ra" \
"    FROM pg_catalog.unnest($7::text[]) AS n (queue) CROSS JOIN LATERAL (" \
"         SELECT q.queue, -(q.priority::bigint) AS np, q.run_after AS ra" \
"           FROM pgqueue.queue q" \
"          WHERE q.queue = n.queue AND q.state IN ('pending', 'retry')" \
"            AND (-(q.priority::bigint), q.run_after) >= ($5, $6)" \
"          ORDER BY -(q.priority::bigint), q.run_after, q.id LIMIT 1) f)," \
/* their settings, and the room each has under max_in_flight */ \
" conf AS (" \
"  SELECT a.queue, coalesce(s.weight, 1) AS weight," \
"         CASE WHEN coalesce(s.max_in_flight, 0) = 0 THEN $1::bigint" \
"              ELSE GREATEST(0, s.max_in_flight -" \
"                   (SELECT count(*) FROM pgqueue.queue c" \
"                     WHERE c.queue = a.queue AND c.state = 'scheduled'))" \
"         END AS room" \
"    FROM active a LEFT JOIN pgqueue.queues s ON s.queue = a.queue" \
"   WHERE NOT coalesce(s.paused, false)" \
"     AND a.queue <> ALL ($4::text[]))," \
" quota AS (" \
"  SELECT c.queue, c.weight, c.room," \
"         LEAST(c.room, CASE WHEN $3" \
"                            THEN ceil($1::numeric * c.weight / sum(c.weight) OVER ())::bigint" \
"                            ELSE $1::bigint END) AS lim" \
"    FROM conf c)," \
/* the best ready jobs of each queue, locked */ \
" cand AS (" \
"  SELECT j.id, j.queue, j.priority, j.run_after," \
"         (row_number() OVER (PARTITION BY j.queue" \
"                             ORDER BY j.priority DESC, j.run_after, j.id))::float8" \
"           / k.weight AS vtime" \
"    FROM quota k CROSS JOIN LATERAL (" \
"         SELECT q.id, q.queue, q.priority, q.run_after FROM pgqueue.queue q" \
"          WHERE q.queue = k.queue AND q.state IN ('pending', 'retry')" \
"            AND (-(q.priority::bigint), q.run_after) >= ($5, $6)" \
"            AND q.run_after <= (SELECT t.ts FROM t)" \
"          ORDER BY -(q.priority::bigint), q.run_after, q.id" \
"          LIMIT k.lim" \
"            FOR UPDATE OF q SKIP LOCKED) j" \
"   WHERE k.lim > 0)," \
/* the batch: smallest virtual times first */ \
" pick AS (" \
"  SELECT c.id, c.queue," \
"         $2 + row_number() OVER (ORDER BY c.vtime, c.priority DESC, c.run_after, c.id) AS batch_order" \
"    FROM cand c" \
"   ORDER BY c.vtime, c.priority DESC, c.run_after, c.id" \
"   LIMIT $1)," \
" upd AS (" \
"  UPDATE pgqueue.queue q SET state = 'scheduled', version = q.version + 1" \
"   WHERE q.id = ANY (ARRAY(SELECT p.id FROM pick p))" \
"  RETURNING q.id, q.tries, q.version),"

/* The rest of round_sql: the insert into work_queue, then the results. */
#define ROUND_RESULT \
" SELECT (SELECT count(*)::int FROM ins)," \
/* queues cut short by their fair share that may have more ready jobs */ \
"        (SELECT count(*)::int" \
"           FROM quota k JOIN (SELECT c.queue, count(*) AS n FROM cand c GROUP BY c.queue) g" \
"             ON g.queue = k.queue" \
"          WHERE k.lim < k.room AND g.n >= k.lim)," \
/* the new bound: the first ready job of all queues, before this pass */ \
"        f.np, f.ra" \
"   FROM (SELECT 1) one LEFT JOIN" \
"        (SELECT a.np, a.ra FROM active a ORDER BY a.np, a.ra LIMIT 1) f ON true"

/*
 * The whole statement for each layout (pgq_layout): from 1.1 on, the job's
 * attempt count and version move into its work_queue row.
 */
static const char *const round_sql[2] = {
	ROUND_SQL_HEAD
	" ins AS ("
	"  INSERT INTO pgqueue.work_queue (id, queue, created, batch_order)"
	"  SELECT p.id, p.queue, (SELECT t.ts FROM t), p.batch_order"
	"    FROM pick p JOIN upd ON upd.id = p.id"
	"  RETURNING 1)"
	ROUND_RESULT,

	ROUND_SQL_HEAD
	" ins AS ("
	"  INSERT INTO pgqueue.work_queue (id, queue, created, batch_order, tries, version)"
	"  SELECT p.id, p.queue, (SELECT t.ts FROM t), p.batch_order, upd.tries, upd.version"
	"    FROM pick p JOIN upd ON upd.id = p.id"
	"  RETURNING 1)"
	ROUND_RESULT
};

/*
 * The names of the queues that have entries in pgqueue.queue_ready_idx,
 * live, dead or marked dead, as a text[] in index order.  They are read
 * from the index tuples alone, one descent per name and no heap fetch: the
 * entries that every scheduled job leaves at the head of its queue's range
 * (dead, but not removable while an old snapshot holds VACUUM back) cost
 * nothing here, where a loose index scan in SQL would have to visit each of
 * their heap tuples to learn that it is gone.  The scheduling pass then
 * probes each name from its bound.
 */
static ArrayType *
pgq_ready_queue_names(void)
{
	Oid			nsp = get_namespace_oid("pgqueue", false);
	Relation	rel = table_open(pgq_relid(nsp, "queue"), AccessShareLock);
	Relation	idx = index_open(pgq_relid(nsp, "queue_ready_idx"), AccessShareLock);
	IndexScanDesc scan;
	ScanKeyData key;
	Datum	   *names;
	int			nnames = 0;
	int			maxnames = 16;

	names = palloc(sizeof(Datum) * maxnames);
	scan = index_beginscan(rel, idx, GetActiveSnapshot(), 1, 0);
	scan->xs_want_itup = true;

	/*
	 * Entries marked dead (LP_DEAD, by scans that found their heap tuples
	 * gone) count too.  Once a long snapshot ends, other scans mark the
	 * hundreds of thousands of entries it kept; skipping them, every
	 * descent here would walk all their leaf pages until VACUUM removes
	 * them (measured after a 60 s hold: 40 % of the scheduler's samples,
	 * its CPU per job 2.5-3 times the normal).
	 */
	scan->ignore_killed_tuples = false;
	for (;;)
	{
		bool		isnull;
		Datum		name;

		/* first every name >= '', then the next one after the last found */
		if (nnames == 0)
			ScanKeyEntryInitialize(&key, 0, 1, BTGreaterEqualStrategyNumber,
								   InvalidOid, idx->rd_indcollation[0],
								   F_TEXT_GE, CStringGetTextDatum(""));
		else
			ScanKeyEntryInitialize(&key, 0, 1, BTGreaterStrategyNumber,
								   InvalidOid, idx->rd_indcollation[0],
								   F_TEXT_GT, names[nnames - 1]);
		index_rescan(scan, &key, 1, NULL, 0);
		if (index_getnext_tid(scan, ForwardScanDirection) == NULL)
			break;
		name = index_getattr(scan->xs_itup, 1, scan->xs_itupdesc, &isnull);
		if (isnull)
			break;				/* queue is NOT NULL; NULLs sort last */
		if (nnames == maxnames)
		{
			maxnames *= 2;
			names = repalloc(names, sizeof(Datum) * maxnames);
		}
		names[nnames++] = PointerGetDatum(PG_DETOAST_DATUM_COPY(name));
		CHECK_FOR_INTERRUPTS();
	}
	index_endscan(scan);
	index_close(idx, NoLock);
	table_close(rel, NoLock);

	return construct_array(names, nnames, TEXTOID, -1, false, TYPALIGN_INT);
}

/*
 * Run one round; returns how many jobs it moved, sets *short_queues to the
 * number of queues that got their whole fair share and may have more, and
 * *found to the key of the first ready job in any queue, as the round's
 * snapshot saw them before its moves (the highest key when there is none).
 */
static int
pgq_schedule_round(PgqLayout layout, int max_items, int order_base, bool fair, Datum busy,
				   const PgqKey *bound, Datum names, int *short_queues,
				   PgqKey *found)
{
	Oid			types[7] = {INT4OID, INT4OID, BOOLOID, TEXTARRAYOID, INT8OID,
	TIMESTAMPTZOID, TEXTARRAYOID};
	Datum		args[7];
	bool		isnull;
	Datum		d;

	args[0] = Int32GetDatum(max_items);
	args[1] = Int32GetDatum(order_base);
	args[2] = BoolGetDatum(fair);
	args[3] = busy;
	args[4] = Int64GetDatum(bound->hi);
	args[5] = TimestampTzGetDatum(bound->lo);
	args[6] = names;

	if (SPI_execute_plan(pgq_keep_plan(&plan_round[layout], round_sql[layout], 7, types),
						 args, NULL, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "scheduling pass failed");
	*short_queues = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
												SPI_tuptable->tupdesc, 2, &isnull));
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull);
	found->hi = isnull ? PG_INT64_MAX : DatumGetInt64(d);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4, &isnull);
	found->lo = isnull ? DT_NOEND : DatumGetTimestampTz(d);
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * One scheduling pass of up to max_items jobs; returns how many it moved.
 * The caller must be connected to SPI inside a transaction; the jobs become
 * claimable, and waiting claims are woken, when that transaction commits.
 */
int
pgq_schedule_pass(int max_items)
{
	Datum		busy;
	Datum		names;
	bool		isnull;
	int			moved;
	int			short_queues;
	TimestampTz start = GetCurrentTimestamp();	/* <= the rows' created */
	PgqScan		scan;
	PgqKey		found;
	PgqLayout	layout = pgq_layout();

	/* read before the snapshot of the first round (bounds.c) */
	pgq_bound_begin(PGQ_BOUND_SCHED, true, &scan);

	if (SPI_execute_plan(pgq_keep_plan(&plan_busy, busy_sql, 0, NULL),
						 NULL, NULL, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "scheduling pass failed");
	busy = PointerGetDatum(DatumGetArrayTypePCopy(SPI_getbinval(SPI_tuptable->vals[0],
																SPI_tuptable->tupdesc, 1, &isnull)));
	names = PointerGetDatum(pgq_ready_queue_names());
	moved = pgq_schedule_round(layout, max_items, 0, true, busy, &scan.start, names,
							   &short_queues, &found);
	pgq_bound_end(&scan, found);
	/* room left, and a queue that may have more than its share: round 2 */
	if (moved < max_items && short_queues > 0)
		moved += pgq_schedule_round(layout, max_items - moved, moved, false, busy,
									&scan.start, names, &short_queues, &found);

	if (moved > 0)
	{
		/* its jobs stop counting for SCHED, its rows count for READY */
		pgq_bound_hold(PGQ_BOUND_SCHED);
		pgq_bound_lower_at_commit(PGQ_BOUND_READY, pgq_time_key(start));
		pgq_count(PGQ_SCHEDULED, moved);
		pgq_claimable_at_commit(moved);
	}
	return moved;
}

/*
 * pgq_schedule(max_items int) returns int
 *
 * One scheduling pass run by the user (the background worker calls
 * pgq_schedule_pass directly).
 */
Datum
pgq_schedule(PG_FUNCTION_ARGS)
{
	int			max_items = pgq_max_items_arg(fcinfo, 0);
	int			moved;

	SPI_connect();
	moved = pgq_schedule_pass(max_items);
	SPI_finish();

	pgq_count_now(PGQ_PASSES, 1);
	PG_RETURN_INT32(moved);
}
