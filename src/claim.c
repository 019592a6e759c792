/*-------------------------------------------------------------------------
 *
 * claim.c
 *		Claiming jobs: the expired-lease probe and steal, the walk that finds
 *		and locks never-claimed rows of pgqueue.work_queue in scheduling
 *		order, leasing the rows taken, and the wait of a blocking claim.
 *		pgq_claim (api.c) checks the arguments and calls pgq_claim_jobs.
 *
 * Why the walk is in C rather than "SELECT ... FOR UPDATE SKIP LOCKED":
 * under READ COMMITTED a row whose visible version was updated by a
 * transaction that committed after the statement's snapshot (another claim
 * that just took it) is not skipped but followed to its latest version,
 * which is locked and only then re-checked.  The re-check fails (the row is
 * claimed) and the row is left out, yet it stays locked until the claiming
 * transaction ends, and the worker that really holds the job then waits
 * for that stranger's commit when it acks.  Here
 * each candidate is locked as the version the snapshot sees, without
 * following updates: a row that changed since, or that another transaction
 * holds, is skipped and never locked.  The rows locked are then leased by a
 * direct update (tables.c), and their jobs' payloads read by primary key.
 *
 * Unfiltered claims walk work_queue_ready_idx (created, batch_order); claims
 * filtered by queue walk work_queue_queue_ready_idx once per queue and
 * merge the walks in (created, batch_order) order, so exactly the first
 * max_items claimable rows of those queues are taken.  Walks start at the
 * PGQ_BOUND_READY bound (bounds.c), not at the left end of the index, where
 * the entries of claimed rows pile up until VACUUM removes them; a filtered
 * claim first probes work_queue_ready_idx for the first claimable row of
 * any queue, which keeps the bound up to date where every claim is
 * filtered.
 *
 * Jobs whose lease ran out are rare: one probe of work_queue_lease_idx
 * (from the PGQ_BOUND_LEASE bound up to now) decides whether the statement
 * that steals (or fails, on their last try) them runs at all.
 *
 * Layer 4 of src/README (job operations): it may call the other files of
 * its layer, storage (tables.c, ring.c, retire.c, uuid7.c), shared memory
 * and wake-ups (shmem.c, publish.c, bounds.c), and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/uuid.h"

#include "jobs.h"

static SPIPlanPtr plan_claim_stolen[PGQ_NUM_LAYOUTS];

static void pgq_slots_by_low(PgqWrite *w, int *order);

/* One index walk: its scan and the ready row it stands on. */
typedef struct ReadyWalk
{
	PgqTable   *t;				/* the slot of work_queue it walks */
	Relation	idx;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		valid;			/* slot holds a ready row */
	TimestampTz created;
	int32		batch_order;
} ReadyWalk;

/* What one claim call needs through its attempts. */
typedef struct ClaimCall
{
	ReturnSetInfo *rsinfo;
	text	   *key;
	int			max_items;
	Datum		lease;			/* interval */
	ArrayType  *queues;			/* NULL: every queue */
} ClaimCall;

/* A row locked by a claim: its slot and where it is. */
typedef struct LockedRow
{
	PgqTable   *t;
	ItemPointerData tid;
} LockedRow;

/* Arguments of pgq_lease_build: the new lease of a claimed row. */
typedef struct LeaseArgs
{
	text	   *key;
	TimestampTz now;
	TimestampTz deadline;
	bool		count_try;		/* bump tries too (1.1 work_queue, 1.0 job) */
} LeaseArgs;

/* ----------------------------------------------------------------
 * Stealing expired leases (SQL: rare, and it joins three tables)
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

/* 1.1 and 1.2: COLUMNS of work_queue, MAX_TRIES a job's max_tries in SQL */
#define CLAIM_STOLEN_11(COLUMNS, MAX_TRIES) \
	CLAIM_STOLEN_EXPIRED(COLUMNS) \
	" j AS (" \
	"  SELECT e.id, e.tries, e.version, " MAX_TRIES " AS max_tries," \
	"         e.tries >= " MAX_TRIES " AS last_try," \
	"         pg_catalog.format('lease of %s expired on try %s of %s'," \
	"                           e.old_key, e.tries, " MAX_TRIES ") AS reason" \
	"    FROM e LEFT JOIN pgqueue.queues s ON s.queue = e.queue)," \
	PGQ_SQL_FAIL_LAST_TRIES("j.tries", "j.version + 1") "," \
	" cw AS (" \
	"  UPDATE pgqueue.work_queue w" \
	"     SET lock_key = $1, started = $5, lock_timeout = $5 + $3," \
	"         version = w.version + 1, tries = w.tries + 1" \
	"   WHERE w.id = ANY (ARRAY(SELECT j.id FROM j WHERE NOT j.last_try))" \
	"  RETURNING w.id, w.tries, w.version, w.lock_timeout, w.created, w.batch_order)," \
	" x AS (SELECT cw.id, q.queue, q.payload, cw.tries, cw.version," \
	"              cw.lock_timeout, cw.created, cw.batch_order" \
	"         FROM cw JOIN pgqueue.queue q ON q.id = cw.id)" \
	CLAIM_STOLEN_RESULT

static const char *const claim_stolen_sql[PGQ_NUM_LAYOUTS] = {
	/* 1.0 */
	CLAIM_STOLEN_EXPIRED("")
	" j AS ("
	"  SELECT e.id, q.tries, NULL::int AS version, q.max_tries,"
	"         q.tries >= q.max_tries AS last_try,"
	"         pg_catalog.format('lease of %s expired on try %s of %s',"
	"                           e.old_key, q.tries, q.max_tries) AS reason"
	"    FROM e " PGQ_SQL_JOB_TRIES_10("e") "),"
	PGQ_SQL_FAIL_LAST_TRIES("q.tries", "q.version + 1") ","
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
	CLAIM_STOLEN_11(", w.tries, w.version", PGQ_SQL_MAX_TRIES),
	/* 1.2 */
	CLAIM_STOLEN_11(", w.tries, w.version, w.max_tries", PGQ_SQL_JOB_MAX_TRIES("e"))
};

/*
 * Copy the rows of the steal statement into the result set; returns how
 * many jobs it holds, adds the number failed to *failed and lowers
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
			continue;			/* the row that only counts the failed */
		if (!isnull[5] && DatumGetTimestampTz(values[5]) < *min_lease)
			*min_lease = DatumGetTimestampTz(values[5]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
		n++;
	}
	return n;
}

/* Whether the row in t->found belongs to one of queues (NULL: every queue). */
static bool
pgq_in_queues(PgqTable *t, ArrayType *queues)
{
	Datum	   *names;
	int			n;
	int			i;
	bool		isnull;
	Datum		queue;

	if (queues == NULL)
		return true;
	queue = pgq_get(t, t->found, PGQ_COL_QUEUE, &isnull);
	deconstruct_array(queues, TEXTOID, -1, false, TYPALIGN_INT, &names, NULL, &n);
	for (i = 0; i < n; i++)
		if (DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, queue, names[i])))
			return true;
	return false;
}

/* how many live leases of other queues a waiting claim's walk passes */
#define PGQ_NEXT_EXPIRY_WALK 64

/*
 * Walk each slot's work_queue_lease_idx over lock_timeout in [from, until),
 * as w's snapshot sees it: *first is the earliest deadline of any row in
 * that range, and the return value the earliest of a row of queues (NULL:
 * any), or DT_NOEND when there is none (*first too); *next is the earliest
 * deadline at or after until (DT_NOEND: none), where the walks stop;
 * *passed (when not NULL) the rows of other queues passed.  A claim makes
 * this probe (from the LEASE bound to now: expired leases, which are rare)
 * when the bound has passed; a waiting claim also walks from now on for
 * the next lease to run out, with give_up > 0: a slot's walk that passed
 * that many rows of other queues stops, and the deadline it stands on
 * counts as the claim's (no lease of its queues in that slot runs out
 * earlier: the waiting claim looks again then, instead of walking every
 * live lease of busy queues at each wake-up).
 */
static TimestampTz
pgq_lease_walk(PgqWrite *w, TimestampTz from, TimestampTz until,
			   ArrayType *queues, TimestampTz *first, TimestampTz *next,
			   int64 *passed, int give_up)
{
	TimestampTz mine = DT_NOEND;
	int			i;

	*first = DT_NOEND;
	*next = DT_NOEND;
	if (passed)
		*passed = 0;
	for (i = 0; i < w->works_view.n; i++)
	{
		PgqTable   *t = pgq_work_slot(w, i);
		Relation	idx = index_open(pgq_slot_index_relid(t->rel, "lease_idx"),
									 AccessShareLock);
		IndexScanDesc scan;
		ScanKeyData keys[2];
		int			nkeys = 0;
		int			others = 0;

		if (from != DT_NOBEGIN)
			ScanKeyEntryInitialize(&keys[nkeys++], 0, 1, BTGreaterEqualStrategyNumber,
								   InvalidOid, InvalidOid, F_TIMESTAMPTZ_GE,
								   TimestampTzGetDatum(from));
		scan = pgq_index_beginscan(t->rel, idx, w->snapshot, nkeys, 0);
		index_rescan(scan, keys, nkeys, NULL, 0);

		/* the heap version is re-checked: the entry may lead through a HOT chain */
		while (index_getnext_slot(scan, ForwardScanDirection, t->found))
		{
			bool		isnull;
			TimestampTz ts = DatumGetTimestampTz(pgq_get(t, t->found, PGQ_COL_LOCK_TIMEOUT,
														 &isnull));

			if (isnull || ts < from)
				continue;
			if (ts >= until)
			{
				/* the first deadline still to come: the slot's walk ends */
				if (ts < *next)
					*next = ts;
				break;
			}
			if (ts < *first)
				*first = ts;
			/* a slot's later rows cannot be earlier than what it found */
			if (ts >= mine)
				break;
			if (pgq_in_queues(t, queues) || (give_up > 0 && others == give_up))
			{
				mine = ts;
				break;
			}
			others++;
			if (passed)
				(*passed)++;
			CHECK_FOR_INTERRUPTS();
		}
		ExecClearTuple(t->found);
		index_endscan(scan);
		index_close(idx, NoLock);
	}
	return mine;
}

/* ----------------------------------------------------------------
 * Never-claimed rows: the walk
 * ----------------------------------------------------------------
 */

/*
 * Advance a walk to the next row its snapshot sees as ready.  The index is
 * partial on "lock_timeout IS NULL", but an entry can lead through a HOT
 * chain to a version that is no longer ready, so the column is re-checked.
 */
static void
pgq_walk_next(ReadyWalk *w)
{
	PgqTable   *t = w->t;

	while (index_getnext_slot(w->scan, ForwardScanDirection, w->slot))
	{
		bool		isnull;

		(void) pgq_get(t, w->slot, PGQ_COL_LOCK_TIMEOUT, &isnull);
		if (!isnull)
			continue;
		w->created = DatumGetTimestampTz(pgq_get(t, w->slot, PGQ_COL_CREATED, &isnull));
		w->batch_order = DatumGetInt32(pgq_get(t, w->slot, PGQ_COL_BATCH_ORDER, &isnull));
		w->valid = true;
		return;
	}
	w->valid = false;
}

/*
 * The created of the first never-claimed row of any queue from start on
 * (DT_NOBEGIN: the left end), as w's snapshot sees it, in any slot;
 * DT_NOEND when there is none.  A walk of work_queue_ready_idx that locks
 * nothing: it passes only entries whose rows are claimed or gone, so it
 * may raise the READY bound (bounds.c, rule 1), which the walks of claims
 * filtered by queue cannot.
 */
static TimestampTz
pgq_ready_probe(PgqWrite *w, TimestampTz start)
{
	TimestampTz first = DT_NOEND;
	int			order[PGQ_MAX_SLOTS];
	int			i;

	pgq_slots_by_low(w, order);
	for (i = 0; i < w->works_view.n && w->works_view.low[order[i]] <= first; i++)
	{
		PgqTable   *t = pgq_work_slot(w, order[i]);
		Relation	idx = index_open(pgq_slot_index_relid(t->rel, "ready_idx"),
									 AccessShareLock);
		ReadyWalk	rw;
		ScanKeyData key;

		ScanKeyEntryInitialize(&key, 0, 1, BTGreaterEqualStrategyNumber,
							   InvalidOid, InvalidOid, F_TIMESTAMPTZ_GE,
							   TimestampTzGetDatum(start));
		memset(&rw, 0, sizeof(rw));
		rw.t = t;
		rw.scan = pgq_index_beginscan(t->rel, idx, w->snapshot, start != DT_NOBEGIN ? 1 : 0, 0);
		index_rescan(rw.scan, &key, start != DT_NOBEGIN ? 1 : 0, NULL, 0);
		rw.slot = t->found;
		pgq_walk_next(&rw);
		if (rw.valid && rw.created < first)
			first = rw.created;
		ExecClearTuple(t->found);
		index_endscan(rw.scan);
		index_close(idx, NoLock);
	}
	return first;
}

/*
 * The walks of a claim: one per slot, or with queues one per slot and
 * distinct queue name, begun lazily.  Slots are filled in scheduling order,
 * and no row of a slot has a created older than its low (ring.c), so a
 * slot's walks are begun only once the merge reaches its low: with a
 * backlog spread over many slots, a claim walks the oldest one or two.
 */
typedef struct ClaimWalks
{
	ReadyWalk  *walks;
	int			nwalks;
	int			order[PGQ_MAX_SLOTS];	/* slots by low, oldest first */
	int			nslots;
	int			next;			/* the next slot of order[] to begin */
	ArrayType  *queues;			/* NULL: every queue */
	Datum	   *names;
	int			nnames;
	TimestampTz start;			/* where the walks start (DT_NOBEGIN: left end) */
} ClaimWalks;

/* w's slots of work_queue (indexes into works_view) into order[], oldest low first. */
static void
pgq_slots_by_low(PgqWrite *w, int *order)
{
	int			i;
	int			j;

	for (i = 0; i < w->works_view.n; i++)
	{
		for (j = i; j > 0 && w->works_view.low[order[j - 1]] > w->works_view.low[i]; j--)
			order[j] = order[j - 1];
		order[j] = i;
	}
}

static void
pgq_walks_init(PgqWrite *w, ClaimWalks *cw, ArrayType *queues, TimestampTz start)
{
	memset(cw, 0, sizeof(ClaimWalks));
	cw->queues = queues;
	cw->start = start;
	cw->nnames = 1;
	if (queues != NULL)
	{
		bool	   *nulls;

		deconstruct_array(queues, TEXTOID, -1, false, TYPALIGN_INT,
						  &cw->names, &nulls, &cw->nnames);
	}
	cw->nslots = w->works_view.n;
	pgq_slots_by_low(w, cw->order);
	cw->walks = palloc0(sizeof(ReadyWalk) * cw->nnames * cw->nslots);
}

/*
 * Begin the walks of the next slot from cw->start: one of
 * work_queue_ready_idx, or with queues one of work_queue_queue_ready_idx
 * per distinct queue name, each standing on its first ready row.
 */
static void
pgq_walks_begin_next(PgqWrite *w, ClaimWalks *cw)
{
	PgqTable   *t = pgq_work_slot(w, cw->order[cw->next++]);
	Relation	idx = index_open(pgq_slot_index_relid(t->rel,
													 cw->queues ? "queue_ready_idx" : "ready_idx"),
								 AccessShareLock);
	ScanKeyData keys[2];
	int			nstart = cw->start != DT_NOBEGIN ? 1 : 0;
	int			i;

	for (i = 0; i < cw->nnames; i++)
	{
		ReadyWalk  *rw = &cw->walks[cw->nwalks];

		if (cw->queues == NULL)
		{
			ScanKeyEntryInitialize(&keys[0], 0, 1, BTGreaterEqualStrategyNumber,
								   InvalidOid, InvalidOid, F_TIMESTAMPTZ_GE,
								   TimestampTzGetDatum(cw->start));
			rw->scan = pgq_index_beginscan(t->rel, idx, w->snapshot, nstart, 0);
			index_rescan(rw->scan, keys, nstart, NULL, 0);
		}
		else
		{
			int			j;
			bool		dup = false;

			/* the caller rejected NULL elements; skip repeated names */
			for (j = 0; j < i && !dup; j++)
				dup = DatumGetBool(DirectFunctionCall2Coll(texteq,
														  idx->rd_indcollation[0],
														  cw->names[i], cw->names[j]));
			if (dup)
				continue;
			ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber,
								   InvalidOid, idx->rd_indcollation[0],
								   F_TEXTEQ, cw->names[i]);
			ScanKeyEntryInitialize(&keys[1], 0, 2, BTGreaterEqualStrategyNumber,
								   InvalidOid, InvalidOid, F_TIMESTAMPTZ_GE,
								   TimestampTzGetDatum(cw->start));
			rw->scan = pgq_index_beginscan(t->rel, idx, w->snapshot, 1 + nstart, 0);
			index_rescan(rw->scan, keys, 1 + nstart, NULL, 0);
		}
		rw->t = t;
		rw->idx = index_open(RelationGetRelid(idx), AccessShareLock);
		rw->slot = table_slot_create(t->rel, NULL);
		pgq_walk_next(rw);
		cw->nwalks++;
	}
	index_close(idx, NoLock);
}

static void
pgq_walks_end(ClaimWalks *cw)
{
	int			i;

	for (i = 0; i < cw->nwalks; i++)
	{
		ExecDropSingleTupleTableSlot(cw->walks[i].slot);
		index_endscan(cw->walks[i].scan);
		index_close(cw->walks[i].idx, NoLock);
	}
}

/*
 * The walk standing on the first ready row in (created, batch_order) order
 * of all of cw's slots, beginning the walks of slots as the merge reaches
 * their low; NULL when they have all run out.
 */
static ReadyWalk *
pgq_walks_best(PgqWrite *w, ClaimWalks *cw)
{
	for (;;)
	{
		ReadyWalk  *best = NULL;
		int			i;

		for (i = 0; i < cw->nwalks; i++)
		{
			ReadyWalk  *rw = &cw->walks[i];

			if (rw->valid &&
				(best == NULL || rw->created < best->created ||
				 (rw->created == best->created && rw->batch_order < best->batch_order)))
				best = rw;
		}
		if (cw->next < cw->nslots &&
			(best == NULL || w->works_view.low[cw->order[cw->next]] <= best->created))
		{
			pgq_walks_begin_next(w, cw);
			continue;
		}
		return best;
	}
}

/*
 * Merge the walks in (created, batch_order) order and lock up to max_items
 * of their rows, each as the version the snapshot sees (never following it
 * to a newer one), skipping rows changed since or held by another
 * transaction; put the rows into rows[] and return how many.  *stop is the
 * created of the first row not passed (bounds.c, rule 1): taken here, or
 * held by another transaction; DT_NOEND when the walks ran out.
 */
static int
pgq_lock_merged(PgqWrite *w, ClaimWalks *cw, int max_items,
				LockedRow *rows, TimestampTz *stop)
{
	int			ntids = 0;

	*stop = DT_NOEND;
	while (ntids < max_items)
	{
		ReadyWalk  *best = pgq_walks_best(w, cw);
		TM_FailureData tmfd;
		TM_Result	res;

		if (best == NULL)
			break;

		res = table_tuple_lock(best->t->rel, &best->slot->tts_tid, w->snapshot,
							   best->t->found, w->cid, LockTupleExclusive,
							   LockWaitSkip, 0, &tmfd);

		/* rows changed since the snapshot (claimed, gone) may be passed */
		if (res != TM_Updated && res != TM_Deleted && *stop == DT_NOEND)
			*stop = best->created;
		if (res == TM_Ok)
		{
			rows[ntids].t = best->t;
			rows[ntids].tid = best->t->found->tts_tid;
			ntids++;
		}
		ExecClearTuple(best->t->found);
		pgq_walk_next(best);
	}
	return ntids;
}

/*
 * Lock up to max_items never-claimed (or released) rows of
 * pgqueue.work_queue, of the given queues when queues is not NULL, in
 * scheduling order, and put their tids into tids[]; returns how many.  The
 * rows stay locked until the transaction ends.  The walks start at the
 * PGQ_BOUND_READY bound, read before w's snapshot is taken anew
 * (bounds.c).  A walk of some queues cannot raise the bound (it does not
 * see the others): a probe of every queue's index does, and the walks of
 * the claim's queues start at what it found.
 */
static int
pgq_lock_ready(PgqWrite *w, int max_items, ArrayType *queues, LockedRow *rows)
{
	ClaimWalks	cw;
	int			ntids;
	PgqScan		bscan;
	TimestampTz start;
	TimestampTz stop;

	pgq_bound_begin(PGQ_BOUND_READY, true, &bscan);
	pgq_write_new_snapshot(w);
	start = bscan.start.hi == 0 ? bscan.start.lo : DT_NOBEGIN;	/* not the lowest key */
	if (queues != NULL)
	{
		start = pgq_ready_probe(w, start);
		pgq_bound_end(&bscan, pgq_time_key(start));
	}

	pgq_walks_init(w, &cw, queues, start);
	ntids = pgq_lock_merged(w, &cw, max_items, rows, &stop);
	pgq_walks_end(&cw);
	if (queues == NULL)
		pgq_bound_end(&bscan, pgq_time_key(stop));
	return ntids;
}

/* ----------------------------------------------------------------
 * Leasing the rows locked
 * ----------------------------------------------------------------
 */

/* The work_queue row under its new lease (and, in 1.1, one more try). */
static void
pgq_lease_build(PgqTable *t, void *arg)
{
	LeaseArgs  *a = (LeaseArgs *) arg;
	bool		isnull;
	int32		version = DatumGetInt32(pgq_get(t, t->found, PGQ_COL_VERSION, &isnull));

	pgq_set(t, PGQ_COL_LOCK_KEY, PointerGetDatum(a->key), false);
	pgq_set(t, PGQ_COL_STARTED, TimestampTzGetDatum(a->now), false);
	pgq_set(t, PGQ_COL_LOCK_TIMEOUT, TimestampTzGetDatum(a->deadline), false);
	pgq_set(t, PGQ_COL_VERSION, Int32GetDatum(version + 1), false);
	if (a->count_try)
	{
		int32		tries = DatumGetInt32(pgq_get(t, t->found, PGQ_COL_TRIES, &isnull));

		pgq_set(t, PGQ_COL_TRIES, Int32GetDatum(tries + 1), false);
	}
}

/* 1.0: the job row counts the try. */
static void
pgq_count_try_build(PgqTable *t, void *arg)
{
	bool		isnull;
	int32		tries = DatumGetInt32(pgq_get(t, t->found, PGQ_COL_TRIES, &isnull));
	int32		version = DatumGetInt32(pgq_get(t, t->found, PGQ_COL_VERSION, &isnull));

	pgq_set(t, PGQ_COL_TRIES, Int32GetDatum(tries + 1), false);
	pgq_set(t, PGQ_COL_VERSION, Int32GetDatum(version + 1), false);
}

/*
 * Lease the locked work_queue rows at tids[0 .. n-1] to c->key and put
 * their jobs into the result set in that order; returns how many.  A row
 * whose job is gone (removed behind the API's back: there is no foreign
 * key; the parent, not only the slots, says so) is deleted instead.
 * Lowers *min_lease to the earliest deadline set.
 */
static int
pgq_lease_rows(PgqWrite *w, ClaimCall *c, LockedRow *rows, int n,
			   TimestampTz now, TimestampTz *min_lease)
{
	PgqTable   *job;
	LeaseArgs	a;
	int			done = 0;
	int			i;
	static const PgqCol work_changes[] = {PGQ_COL_LOCK_KEY, PGQ_COL_STARTED,
	PGQ_COL_LOCK_TIMEOUT, PGQ_COL_VERSION, PGQ_COL_TRIES};
	static const PgqCol job_changes[] = {PGQ_COL_TRIES, PGQ_COL_VERSION};

	a.key = c->key;
	a.now = now;
	a.deadline = pgq_deadline(now, c->lease);
	a.count_try = (w->layout >= PGQ_V11);
	for (i = 0; i < w->works_view.n; i++)
		if (w->works_open & (UINT64CONST(1) << i))
			pgq_write_changes(w, &w->works[i], work_changes, lengthof(work_changes));
	if (w->layout == PGQ_V10)
		pgq_write_changes(w, pgq_write_job(w), job_changes, lengthof(job_changes));

	for (i = 0; i < n; i++)
	{
		PgqTable   *work = rows[i].t;
		Datum		values[6];
		bool		isnull[6];
		Datum		id;
		PgqTable   *counted;
		bool		fnull;

		/* the version locked by pgq_lock_ready, still ours */
		if (!table_tuple_fetch_row_version(work->rel, &rows[i].tid, SnapshotAny, work->found))
			elog(ERROR, "locked row of \"pgqueue.work_queue\" is missing");
		id = pgq_get(work, work->found, PGQ_COL_ID, &fnull);
		if ((job = pgq_find_job(w, id)) == NULL)
		{
			/* removed behind the API's back (the parent agrees) */
			pgq_job_row_missing(id);
			ereport(WARNING,
					(errcode(ERRCODE_WARNING),
					 errmsg("job %s has no row in pgqueue.queue: its work_queue row is deleted",
							DatumGetCString(DirectFunctionCall1(uuid_out, id))),
					 errdetail("The job row was removed other than by pgqueue's functions.")));
			(void) pgq_delete_found(w, work, NULL, NULL);
			continue;
		}
		if (!pgq_update_found(w, work, NULL, pgq_lease_build, &a))
			elog(ERROR, "could not lease a locked row of \"pgqueue.work_queue\"");
		pgq_work_slot_used(work);
		counted = work;
		if (w->layout == PGQ_V10)
		{
			if (!pgq_update_found(w, job, NULL, pgq_count_try_build, NULL))
				continue;
			counted = job;
		}

		/* id, queue, payload; tries, version; lock_timeout */
		values[0] = id;
		isnull[0] = false;
		values[1] = pgq_get(job, job->found, PGQ_COL_QUEUE, &isnull[1]);
		values[2] = pgq_get(job, job->found, PGQ_COL_PAYLOAD, &isnull[2]);
		values[3] = pgq_get(counted, counted->next, PGQ_COL_TRIES, &isnull[3]);
		values[4] = pgq_get(counted, counted->next, PGQ_COL_VERSION, &isnull[4]);
		values[5] = TimestampTzGetDatum(a.deadline);
		isnull[5] = false;
		tuplestore_putvalues(c->rsinfo->setResult, c->rsinfo->setDesc, values, isnull);
		done++;
	}
	if (done > 0 && a.deadline < *min_lease)
		*min_lease = a.deadline;
	return done;
}

/* ----------------------------------------------------------------
 * A claim
 * ----------------------------------------------------------------
 */

/*
 * One claim attempt: steal expired leases first, then take never-claimed
 * rows.  When nothing was claimable and next_expiry is not NULL, sets
 * *next_expiry to the earliest live lease deadline of the claim's queues,
 * or an earlier one (pgq_lease_walk's give_up), or 0 when there is none, so
 * that a waiting claim knows when to look for a steal.
 */
static int
pgq_claim_once(ClaimCall *c, TimestampTz *next_expiry)
{
	PgqWrite	w;
	Oid			types[6] = {TEXTOID, INT4OID, INTERVALOID, TEXTARRAYOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID};
	Datum		a[6];
	char		n[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	int64		failed = 0;
	int			stolen = 0;
	int			fresh = 0;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz min_lease = DT_NOEND;
	TimestampTz first_expired;
	TimestampTz expired;
	PgqScan		lscan;
	int			nest;

	pgq_write_begin(&w, "pgq_claim", PGQ_OPEN_WORK);

	/*
	 * Expired leases: the bound is read before the probe's snapshot
	 * (bounds.c); it moves up to the first expired lease of any queue, or to
	 * now when there is none.  expired: the first of the claim's queues.
	 */
	pgq_bound_begin(PGQ_BOUND_LEASE, true, &lscan);
	if (!lscan.full && lscan.start.hi == 0 && lscan.start.lo > now)
	{
		/* no lease runs out before the bound: no walk (of every slot) */
		expired = DT_NOEND;
		pgq_bound_end(&lscan, lscan.start);
	}
	else
	{
		TimestampTz next_live;
		int64		passed;

		/* bounds.c, rule 8: a claim of some queues may start further on */
		if (c->queues != NULL)
			pgq_bound_memo_apply(&lscan, c->queues);
		pgq_write_new_snapshot(&w);
		expired = pgq_lease_walk(&w, lscan.start.hi == 0 ? lscan.start.lo : DT_NOBEGIN,
								 now, c->queues, &first_expired, &next_live, &passed, 0);
		if (c->queues != NULL)
			pgq_bound_memo_store(&lscan, c->queues, pgq_time_key(Min(expired, now)), passed);

		/*
		 * Up to the first expired lease, or to the first deadline to come
		 * (the claims until then need no walk).
		 */
		pgq_bound_end(&lscan, pgq_time_key(first_expired != DT_NOEND ? first_expired : next_live));
	}

	/*
	 * Jobs failed on their last try do not fill the claim: while some were
	 * failed and there is room, look for more expired leases.
	 */
	if (expired != DT_NOEND)
	{
		/* $1 lock_key, $2 how many, $3 lease, $4 queues, $5 now, $6 from */
		a[0] = PointerGetDatum(c->key);
		a[2] = c->lease;
		a[3] = c->queues ? PointerGetDatum(c->queues) : (Datum) 0;
		n[3] = c->queues ? ' ' : 'n';
		a[4] = TimestampTzGetDatum(now);
		a[5] = TimestampTzGetDatum(expired);
		nest = pgq_spi_connect();
		for (;;)
		{
			int64		failed_before = failed;

			a[1] = Int32GetDatum(c->max_items - stolen);
			if (pgq_execute_moving(pgq_keep_plan(&plan_claim_stolen[w.layout],
												 claim_stolen_sql[w.layout], 6, types),
								   a, n) != SPI_OK_SELECT)
				elog(ERROR, "claim of expired leases failed");
			stolen += pgq_claim_put(c->rsinfo, &failed, &min_lease);
			if (failed == failed_before || stolen >= c->max_items)
				break;
		}
		pgq_spi_finish(nest);
	}

	if (stolen < c->max_items)
	{
		LockedRow  *rows = palloc(sizeof(LockedRow) * (c->max_items - stolen));
		int			nrows = pgq_lock_ready(&w, c->max_items - stolen, c->queues, rows);

		if (nrows > 0)
			fresh = pgq_lease_rows(&w, c, rows, nrows, now, &min_lease);
	}

	/* nothing to claim: when does the next lease of our queues run out? */
	if (stolen + fresh == 0 && next_expiry != NULL)
	{
		TimestampTz any;
		TimestampTz none;

		pgq_write_new_snapshot(&w);
		*next_expiry = pgq_lease_walk(&w, now, DT_NOEND, c->queues, &any, &none, NULL,
									  PGQ_NEXT_EXPIRY_WALK);
		if (*next_expiry == DT_NOEND)
			*next_expiry = 0;	/* none */
	}
	pgq_write_end(&w);

	pgq_count(PGQ_CLAIMED, stolen + fresh);
	pgq_count(PGQ_STOLEN, stolen);
	pgq_count(PGQ_FAILED, failed);
	if (stolen + fresh + failed > 0)
	{
		pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
		/* the steal statement's writes (tables.c holds for the others) */
		pgq_bound_hold(PGQ_BOUND_READY);
		pgq_bound_hold(PGQ_BOUND_LEASE);
	}
	if (stolen + fresh > 0)
		pgq_bound_lower_at_commit(PGQ_BOUND_LEASE, pgq_time_key(min_lease));
	/* jobs failed on their last try free places (max_in_flight, groups) */
	if (failed > 0)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER | PGQ_WAKE_PLACES);
	return stolen + fresh;
}

/*
 * Claim up to max_items jobs for key under lease (an interval), of the given
 * queues (NULL: all), into rsinfo's result set.  With wait_until later than
 * now and nothing to claim, sleep until work arrives (pgq_wait_for_work) or
 * wait_until.  Waiting needs a fresh snapshot for each try, so it only
 * happens under READ COMMITTED.
 */
void
pgq_claim_jobs(ReturnSetInfo *rsinfo, text *key, int max_items, Datum lease,
			   ArrayType *queues, TimestampTz wait_until)
{
	ClaimCall	c;

	c.rsinfo = rsinfo;
	c.key = key;
	c.max_items = max_items;
	c.lease = lease;
	c.queues = queues;

	if (wait_until <= GetCurrentTimestamp() || IsolationUsesXactSnapshot())
	{
		pgq_claim_once(&c, NULL);
		return;
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

			if (pgq_claim_once(&c, &next_expiry) > 0)
				break;
			now = GetCurrentTimestamp();
			if (now >= wait_until)
				break;

			/*
			 * Sleep until new work is published, the next lease of our
			 * queues runs out (1 ms late, so that it has), or the deadline.
			 */
			until = wait_until;
			if (next_expiry > now && next_expiry + 1000 < until)
				until = next_expiry + 1000;
			pgq_wait_for_work(until);
		}
	}
	PG_CATCH();
	{
		pgq_end_wait(false);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pgq_end_wait(true);
}
