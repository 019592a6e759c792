/*-------------------------------------------------------------------------
 *
 * flow.c
 *		Flows (1.2): jobs that wait for other jobs.  A job pushed with
 *		"after" (its parents) is made 'waiting', with waiting_for = the
 *		number of its parents that were unfinished jobs at push time, and
 *		one row of pgqueue.job_parents per such parent; the ack of a parent
 *		removes its rows and counts each child down, and a child whose
 *		count reaches 0 becomes 'pending' in that same transaction.  A
 *		cancel or purge of a job cancels its waiting descendants.
 *
 * Why nothing is lost between a push and an ack of its parent: before it
 * writes the edge, the push sets the parent's has_children (an UPDATE,
 * once per parent: it locks the row FOR NO KEY UPDATE) or, when it is set
 * already, locks the row FOR KEY SHARE.  An ack deletes the row, which
 * conflicts with either lock: an ack that comes first makes the push wait
 * for its commit and then find no parent (done); a push that comes first
 * makes the ack's delete wait for the push's commit and then delete the
 * latest version, whose has_children is set, and the ack reads the edges
 * with a snapshot taken then (the latest), and finds the edge.  Either
 * lock holds the parent back from the scheduling passes (which update a
 * row without waiting, and so skip one with a locker in progress, even a
 * KEY SHARE one) and from the ring's moves (FOR UPDATE SKIP LOCKED) until
 * the push commits: the usual case is a parent pushed in the same
 * transaction, not committed yet anyway.
 *
 * Two parents of one child acked at once by two transactions update the
 * child's row one after the other (a row lock; READ COMMITTED re-reads
 * it): its count goes down twice and it becomes pending exactly once.
 * Under REPEATABLE READ the statements read with the latest snapshot and
 * check against the transaction's (as PostgreSQL's foreign keys do): an
 * edge or child the transaction cannot see is a serialization failure
 * (40001), never a child left waiting.
 *
 * A job without children pays nothing: its ack reads has_children in the
 * row it deletes, and looks no further.  A cancel or purge looks at the
 * size of pgqueue.job_parents first: an empty table (no block) has no edge,
 * and an edge's push extends it before it commits.
 *
 * Layer 4 of src/README (job operations): it may call the other files of
 * its layer, storage, shared memory and wake-ups, and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/uuid.h"

#include "jobs.h"

static SPIPlanPtr plan_mark_parents = NULL;
static SPIPlanPtr plan_lock_parents = NULL;
static SPIPlanPtr plan_link = NULL;
static SPIPlanPtr plan_release = NULL;
static SPIPlanPtr plan_cancel = NULL;

/*
 * Whether pgqueue.job_parents may hold an edge: it exists (1.2) and has a
 * block.  The caller has finished the writes whose edges it looks for.
 */
bool
pgq_flows_exist(void)
{
	Oid			nsp = get_namespace_oid("pgqueue", true);
	Oid			relid;
	Relation	rel;
	BlockNumber nblocks;

	if (!OidIsValid(nsp) || !OidIsValid(relid = get_relname_relid("job_parents", nsp)))
		return false;
	rel = table_open(relid, AccessShareLock);
	nblocks = RelationGetNumberOfBlocks(rel);
	table_close(rel, NoLock);
	return nblocks > 0;
}

/*
 * The parents named in after (a checked uuid[]) that are unfinished jobs
 * now, marked (has_children) and locked until the end of the transaction;
 * NULL when none is.  *n: how many.
 */
ArrayType *
pgq_flow_lock_parents(ArrayType *after, int *n)
{
	Oid			type = UUIDARRAYOID;
	Datum		arg = PointerGetDatum(after);
	MemoryContext caller = CurrentMemoryContext;
	int			nest = pgq_spi_connect();
	ArrayType  *found = NULL;
	bool		isnull;

	/* the parents not marked yet: marked, and so locked */
	if (pgq_execute_moving_latest(pgq_keep_plan(&plan_mark_parents,
												"UPDATE pgqueue.queue q SET has_children = true"
												" WHERE q.id = ANY ($1) AND q.has_children IS NOT TRUE",
												1, &type),
								  &arg, NULL, false) != SPI_OK_UPDATE)
		elog(ERROR, "mark of parents failed");
	/* all of them, locked (again) FOR KEY SHARE: those marked before too */
	if (pgq_execute_moving_latest(pgq_keep_plan(&plan_lock_parents,
								   "SELECT pg_catalog.count(*)::int, pg_catalog.array_agg(p.id)"
								   "  FROM (SELECT q.id FROM pgqueue.queue q"
								   "         WHERE q.id = ANY ($1) FOR KEY SHARE OF q) p",
								   1, &type),
					 &arg, NULL, false) != SPI_OK_SELECT)
		elog(ERROR, "lookup of parents failed");
	*n = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (*n > 0)
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);

		/* into the caller's memory: SPI's goes with pgq_spi_finish */
		MemoryContext spicxt = MemoryContextSwitchTo(caller);

		found = DatumGetArrayTypePCopy(d);
		MemoryContextSwitchTo(spicxt);
	}
	pgq_spi_finish(nest);
	return found;
}

/* The edges from every parent in parents to each of the n children. */
void
pgq_flow_link(ArrayType *parents, pg_uuid_t *children, int n)
{
	Oid			types[2] = {UUIDARRAYOID, UUIDARRAYOID};
	Datum		args[2];
	Datum	   *c = palloc(sizeof(Datum) * n);
	int			nest;
	int			i;

	for (i = 0; i < n; i++)
		c[i] = UUIDPGetDatum(&children[i]);
	args[0] = PointerGetDatum(parents);
	args[1] = PointerGetDatum(construct_array(c, n, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR));
	nest = pgq_spi_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_link,
									   "INSERT INTO pgqueue.job_parents (parent, child)"
									   " SELECT p, c FROM pg_catalog.unnest($1) p, pg_catalog.unnest($2) c",
									   2, types),
						 args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "link of a flow failed");
	pgq_spi_finish(nest);
}

/*
 * The jobs ids[0 .. n-1], each with has_children set, were acked by this
 * transaction: their edges go,
 * each child is counted down once per acked parent, and those that reach
 * 0 become pending (ready at commit, as a push's).  Returns how many
 * became pending.
 */
int
pgq_flow_release(Datum *ids, int n)
{
	Oid			type = UUIDARRAYOID;
	Datum		arg;
	int			nest;
	int			ready = 0;
	uint64		i;

	if (n == 0)
		return 0;
	arg = PointerGetDatum(construct_array(ids, n, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR));
	nest = pgq_spi_connect();
	if (pgq_execute_moving_latest(pgq_keep_plan(&plan_release,
								   "WITH e AS (DELETE FROM pgqueue.job_parents e WHERE e.parent = ANY ($1)"
								   "           RETURNING e.child),"
								   " n AS (SELECT e.child, pg_catalog.count(*)::int AS n FROM e GROUP BY e.child)"
								   " UPDATE pgqueue.queue q"
								   "    SET waiting_for = q.waiting_for - n.n,"
								   "        state = CASE WHEN q.waiting_for <= n.n THEN 'pending'"
								   "                     ELSE 'waiting' END::pgqueue.job_state"
								   "   FROM n"
								   "  WHERE q.id = n.child AND q.state = 'waiting'"
								   " RETURNING q.queue, q.state = 'pending', -(q.priority::bigint),"
								   "           q.run_after, q.slot",
								   1, &type),
					 &arg, NULL, true) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "release of a flow's children failed");
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		PgqKey		key;

		if (!DatumGetBool(SPI_getbinval(tup, desc, 2, &isnull)))
			continue;
		key.hi = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
		key.lo = DatumGetTimestampTz(SPI_getbinval(tup, desc, 4, &isnull));
		pgq_ready_at_commit(DatumGetTextPCopy(SPI_getbinval(tup, desc, 1, &isnull)),
							key,
							PGQ_SLOT_BIT(DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull))));
		ready++;
	}
	pgq_spi_finish(nest);
	if (ready > 0)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	return ready;
}

/*
 * The jobs ids (a uuid[]) were removed by a cancel or purge of this
 * transaction (how: "cancelled", "purged"): their waiting descendants are
 * cancelled, recursively (archived as 'cancelled' when their queue keeps
 * an archive, last_error "parent job <id> was <how>", the parent through
 * which the cascade reached it: a root (how) or a descendant (cancelled)),
 * and the edges of all of them go.  Returns how many descendants.  The
 * walk follows edges (one row an edge, whatever the number of roots that
 * reach it).
 *
 * In passes: a push that names a descendant holds its row FOR KEY SHARE,
 * so the DELETE of that descendant waits for the push to commit, but the
 * statement's snapshot was taken before, and does not see the push's edge
 * nor its child.  The next pass, from the descendants just cancelled, takes
 * a new snapshot and finds them; the passes end when one cancels nothing.
 * (A push that locks a descendant after its DELETE waits for this
 * transaction and then finds it gone.)
 *
 * The edges go before the jobs (the DELETE of the jobs reads the counts of
 * the edges' DELETEs first: a data-modifying CTE that nothing reads runs
 * after the main statement), in the order of an ack's release, which
 * deletes its parents' edges and then updates their children: in the
 * other order, a cancel holding a child and waiting for an edge that an
 * ack of the child's other parent holds, while the ack waits for the
 * child, was a deadlock (40P01).
 */
uint64
pgq_flow_cancel(Datum ids, const char *how)
{
	Oid			types[2] = {UUIDARRAYOID, TEXTOID};
	Datum		args[2];
	MemoryContext caller = CurrentMemoryContext;
	uint64		total = 0;

	if (!pgq_flows_exist())
		return 0;
	args[0] = ids;
	args[1] = CStringGetTextDatum(how);
	for (;;)
	{
		int			nest;
		uint64		n;
		uint64		i;
		Datum	   *next;

		/*
		 * The slots attached since this transaction locked pgqueue.queue:
		 * its locks are held already, so the kept plan is checked against
		 * the invalidations read so far only, and a child pushed into a
		 * slot attached since (a turn of the ring while a pass waited)
		 * would be missed by the DELETE while its edges go (ring.c's rule).
		 */
		AcceptInvalidationMessages();
		nest = pgq_spi_connect();

		if (pgq_execute_moving_latest(pgq_keep_plan(&plan_cancel,
									   "WITH RECURSIVE d(id, parent) AS ("
									   "    SELECT e.child, e.parent FROM pgqueue.job_parents e"
									   "     WHERE e.parent = ANY ($1)"
									   "  UNION"
									   "    SELECT e.child, e.parent FROM pgqueue.job_parents e JOIN d ON e.parent = d.id),"
									   " o AS (SELECT DISTINCT ON (d.id) d.id, d.parent FROM d ORDER BY d.id, d.parent),"
									   " a AS (SELECT pg_catalog.unnest($1) AS id UNION SELECT o.id FROM o),"
									   " ep AS (DELETE FROM pgqueue.job_parents e"
									   "         WHERE e.parent IN (SELECT a.id FROM a) RETURNING 1),"
									   " ec AS (DELETE FROM pgqueue.job_parents e"
									   "         WHERE e.child IN (SELECT a.id FROM a) RETURNING 1)"
									   " DELETE FROM pgqueue.queue q USING o"
									   "  WHERE q.id = o.id AND q.state = 'waiting'"
									   "    AND (SELECT pg_catalog.count(*) FROM ep) >= 0"
									   "    AND (SELECT pg_catalog.count(*) FROM ec) >= 0"
									   " RETURNING (SELECT s.retention FROM pgqueue.queues s WHERE s.queue = q.queue),"
									   "   q.id, q.queue, q.priority, q.tries, q.created,"
									   "   'parent job ' || o.parent::text || ' was '"
									   "     || CASE WHEN o.parent = ANY ($1) THEN $2 ELSE 'cancelled' END,"
									   "   q.payload",
									   2, types),
						 args, NULL, true) != SPI_OK_DELETE_RETURNING)
			elog(ERROR, "cancel of a flow's descendants failed");
		n = SPI_processed;
		if (n == 0)
		{
			pgq_spi_finish(nest);
			break;
		}
		pgq_archive_spi_rows(SPI_tuptable, n, 1, PGQ_OUTCOME_CANCELLED);

		/* the roots of the next pass, in the caller's memory */
		next = MemoryContextAlloc(caller, sizeof(Datum) * n);
		for (i = 0; i < n; i++)
		{
			bool		isnull;
			Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull);
			pg_uuid_t  *u = MemoryContextAlloc(caller, sizeof(pg_uuid_t));

			memcpy(u, DatumGetUUIDP(d), sizeof(pg_uuid_t));
			next[i] = UUIDPGetDatum(u);
		}
		pgq_spi_finish(nest);
		total += n;
		args[0] = PointerGetDatum(construct_array(next, (int) n, UUIDOID, UUID_LEN, false,
												  TYPALIGN_CHAR));
		args[1] = CStringGetTextDatum("cancelled");	/* the roots: cancelled here */
		CHECK_FOR_INTERRUPTS();
	}
	return total;
}
