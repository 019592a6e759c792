/*-------------------------------------------------------------------------
 *
 * tables.c
 *		Direct access to pgqueue's tables for the per-job calls (push,
 *		claim, extend, ack, nack): find a row by its primary key and insert,
 *		update or delete it through the table access method, as logical
 *		replication's apply worker does (execReplication.c), without
 *		planning or starting an executor for an SQL statement.
 *
 * A call is a few primary-key probes and row writes; through SPI each of
 * them cost a plan-cache lookup and an executor start-up larger than the
 * work itself.
 *
 * The writes behave as the SQL statements they replace ("DELETE ... WHERE
 * id = $1 AND lock_key = $2" and the like): a row is found with a new
 * snapshot of the statement (the transaction's own changes included); if
 * another transaction changed it meanwhile, under READ COMMITTED the
 * latest version is locked and the caller's condition checked again on it
 * (what EvalPlanQual does), under REPEATABLE READ and SERIALIZABLE the call
 * fails with a serialization error.  Index entries are made for the new
 * version when the update is not HOT; predicate locks and serialization
 * conflicts are taken by the access methods, as for SQL.
 *
 * What SQL would do and this does not: fire triggers.  pgqueue's tables
 * carry none (1.0's foreign key triggers aside, which have nothing to do
 * after the API removed both rows of a job), and triggers added to them by
 * hand are not run by these calls.
 *
 * Layer 3 of src/README (storage): it may call the other files of its
 * layer, those of shared memory and wake-ups (shmem.c, publish.c,
 * bounds.c), and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_index.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "storage.h"

/* Column names by PgqCol; a table has a subset of them. */
static const char *const pgq_col_names[PGQ_NUM_COLS] = {
	"id", "queue", "created", "version", "tries", "state", "priority",
	"run_after", "payload", "dedup_key", "last_error", "batch_order",
	"started", "lock_key", "lock_timeout", "slot", "max_tries",
	"waiting_for", "has_children", "group_key"
};

/*
 * The RTEs of pgq_write_rtable's range table given a relation since it was
 * last reset: a bit per slot, work_queue's then queue's.
 */
static uint64 rte_set[2];

static void pgq_table_open(PgqWrite *w, PgqTable *t, Oid relid, Index rti,
						   LOCKMODE lockmode);
static void pgq_table_close(PgqTable *t);
static bool pgq_write_result(PgqWrite *w, PgqTable *t, TM_Result res,
							 TM_FailureData *tmfd, const char *what);
static void pgq_write_done(PgqWrite *w, PgqTable *t);
static Oid	pgq_slot_cache_get(Oid parent, const char *role);
static void pgq_slot_cache_put(Oid parent, const char *role, Oid part);

/*
 * Open the table and its indexes for writing (range table index rti of
 * w's executor state) and look up its columns.
 */
static void
pgq_table_open(PgqWrite *w, PgqTable *t, Oid relid, Index rti, LOCKMODE lockmode)
{
	TupleDesc	desc;
	int			c;
	int			k;
	int			from = 0;

	t->rel = table_open(relid, lockmode);
	desc = RelationGetDescr(t->rel);

	/*
	 * Each column is looked for from the attribute after the one the last
	 * column was found at: where the table's columns are in the order of
	 * pgq_col_names (every table made by the install and update scripts,
	 * but for a few columns of work_queue), the first comparison finds it.
	 */
	for (c = 0; c < PGQ_NUM_COLS; c++)
	{
		t->att[c] = InvalidAttrNumber;
		for (k = 0; k < desc->natts; k++)
		{
			int			i = (from + k) % desc->natts;
			Form_pg_attribute a = TupleDescAttr(desc, i);

			if (!a->attisdropped && strcmp(NameStr(a->attname), pgq_col_names[c]) == 0)
			{
				t->att[c] = a->attnum;
				from = i + 1;
				break;
			}
		}
	}
	if (t->att[PGQ_COL_ID] == InvalidAttrNumber ||
		!OidIsValid(pgq_primary_key_index(t->rel)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relation \"pgqueue.%s\" has no primary key on id",
						RelationGetRelationName(t->rel)),
				 errhint("Reinstall the extension: DROP EXTENSION pgqueue; CREATE EXTENSION pgqueue;")));
	t->pkey = index_open(pgq_primary_key_index(t->rel), lockmode);

	pgq_rte_set_relid(pgq_estate_perminfos(w->estate), exec_rt_fetch(rti, w->estate), relid);
	rte_set[(rti - 1) / PGQ_MAX_SLOTS] |= UINT64CONST(1) << ((rti - 1) % PGQ_MAX_SLOTS);
	t->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(t->rri, t->rel, rti, NULL, 0);
	t->indexes_open = false;	/* pgq_table_indexes: deletes need none */
	t->group_idx = InvalidOid;
	t->group_idx_last = false;
	t->found = table_slot_create(t->rel, &w->estate->es_tupleTable);
	t->next = table_slot_create(t->rel, &w->estate->es_tupleTable);
}

/*
 * The OID of slot rel's group_idx (1.2), or InvalidOid: the partial index
 * named <slot>_group_idx (ring.c, the update script), in the slots' cache
 * of index OIDs.  An index of another name, or one of that name without a
 * predicate, is never taken for it: the rows without a group_key leave it
 * out.
 */
static Oid
pgq_group_index_of(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			idx = pgq_slot_cache_get(relid, "group_idx");
	char	   *name;
	HeapTuple	tup;
	bool		partial;

	if (OidIsValid(idx))
		return idx;
	name = psprintf("%s_group_idx", RelationGetRelationName(rel));
	idx = get_relname_relid(name, RelationGetNamespace(rel));
	pfree(name);
	if (!OidIsValid(idx))
		return InvalidOid;
	tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(idx));
	if (!HeapTupleIsValid(tup))
		return InvalidOid;
	partial = !heap_attisnull(tup, Anum_pg_index_indpred, NULL);
	ReleaseSysCache(tup);
	if (!partial)
		return InvalidOid;
	pgq_slot_cache_put(relid, "group_idx", idx);
	return idx;
}

/*
 * Open t's indexes, for an insert or a non-HOT update.
 *
 * A slot of pgqueue.queue (1.2) has a group_idx, a partial index that
 * never holds a row without a group_key (WHERE group_key IS NOT NULL):
 * it is left out here, as ExecOpenIndices would open it, and opened last
 * by the first row with a group_key (pgq_table_index_row), so that a call
 * that writes only jobs without a group neither builds its IndexInfo (a
 * copy of its expressions and predicate) nor evaluates its predicate.
 */
void
pgq_table_indexes(PgqTable *t)
{
	ResultRelInfo *rri = t->rri;
	List	   *oids;
	ListCell   *lc;
	int			n = 0;
	Oid			group_idx;

	if (t->indexes_open)
		return;
	t->indexes_open = true;
	t->group_idx = InvalidOid;
	t->group_idx_last = false;
	if (t->att[PGQ_COL_GROUP_KEY] == InvalidAttrNumber)
	{
		ExecOpenIndices(rri, false);
		return;
	}

	/* ExecOpenIndices (without speculative insertion), but group_idx */
	rri->ri_NumIndices = 0;
	if (!RelationGetForm(t->rel)->relhasindex)
		return;
	oids = RelationGetIndexList(t->rel);
	if (oids == NIL)
		return;
	group_idx = pgq_group_index_of(t->rel);
	rri->ri_IndexRelationDescs = palloc(list_length(oids) * sizeof(Relation));
	rri->ri_IndexRelationInfo = palloc(list_length(oids) * sizeof(IndexInfo *));
	foreach(lc, oids)
	{
		Oid			oid = lfirst_oid(lc);
		Relation	idx;

		if (oid == group_idx)
		{
			t->group_idx = oid;
			continue;
		}
		idx = index_open(oid, RowExclusiveLock);
		rri->ri_IndexRelationDescs[n] = idx;
		rri->ri_IndexRelationInfo[n] = BuildIndexInfo(idx);
		n++;
	}
	rri->ri_NumIndices = n;
	list_free(oids);
}

/*
 * Make the index entries of the version in t->next (inserted, or the new
 * version of an update): those of every index, but group_idx's only when
 * the row has a group_key (see pgq_table_indexes).
 */
void
pgq_table_index_row(PgqWrite *w, PgqTable *t, bool update, bool only_summarizing)
{
	ResultRelInfo *rri = t->rri;
	bool		isnull = true;

	if (OidIsValid(t->group_idx))
		(void) slot_getattr(t->next, t->att[PGQ_COL_GROUP_KEY], &isnull);
	if (!isnull && !t->group_idx_last)
	{
		/* the first row with a group: its index, last (see above) */
		Relation	idx = index_open(t->group_idx, RowExclusiveLock);

		rri->ri_IndexRelationDescs[rri->ri_NumIndices] = idx;
		rri->ri_IndexRelationInfo[rri->ri_NumIndices] = BuildIndexInfo(idx);
		rri->ri_NumIndices++;
		t->group_idx_last = true;
	}
	/* a row without a group: group_idx, opened, is left out */
	isnull = isnull && t->group_idx_last;
	if (isnull)
		rri->ri_NumIndices--;
	PG_TRY();
	{
		list_free(pgq_insert_index_tuples(rri, t->next, w->estate, update, only_summarizing));
	}
	PG_FINALLY();
	{
		if (isnull)
			rri->ri_NumIndices++;
	}
	PG_END_TRY();
}

static void
pgq_table_close(PgqTable *t)
{
	if (t->indexes_open)
		ExecCloseIndices(t->rri);
	index_close(t->pkey, NoLock);
	table_close(t->rel, NoLock);
}

/*
 * The RTE of w's range table for slot i of work_queue's view (queue's: i +
 * PGQ_MAX_SLOTS): fixed, so that slots added to the views by
 * pgq_write_refresh_views get theirs.
 */
#define PGQ_WORK_RTI(i) ((Index) (i) + 1)
#define PGQ_JOB_RTI(i) ((Index) (i) + PGQ_MAX_SLOTS + 1)

/*
 * The range table of a call: work_queue's slots, then queue's, at fixed
 * places (PGQ_WORK_RTI, PGQ_JOB_RTI), telling which columns an update
 * changes (pgq_write_changes); each RTE gets its relation when its slot
 * is opened.  Made once per backend and reset for each call (the executor
 * state only points to it), with the list of its entries'
 * RTEPermissionInfos (*perminfos; NIL in 15, see pgq_compat.h).
 */
static List *
pgq_write_rtable(List **perminfos)
{
	static List *rtable = NIL;
	static List *rtable_perminfos = NIL;
	int			r;

	if (rtable == NIL)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		int			i;

		for (i = 0; i < 2 * PGQ_MAX_SLOTS; i++)
			rtable = lappend(rtable, pgq_make_rte(&rtable_perminfos, RowExclusiveLock));
		MemoryContextSwitchTo(old);
		rte_set[0] = rte_set[1] = 0;
	}

	/*
	 * Only the RTEs that were given a relation (pgq_table_open) can have
	 * changed columns (pgq_write_changes, on opened tables): a call opens
	 * a few of the 128, and resetting all of them was a measurable part
	 * of every call.
	 */
	for (r = 0; r < 2; r++)
		while (rte_set[r] != 0)
		{
			int			i = pg_rightmost_one_pos64(rte_set[r]);
			RangeTblEntry *rte = list_nth_node(RangeTblEntry, rtable, r * PGQ_MAX_SLOTS + i);

			pgq_rte_set_relid(rtable_perminfos, rte, InvalidOid);
			/* a call's own, freed with it */
			pgq_rte_set_updated_cols(rtable_perminfos, rte, NULL);
			rte_set[r] &= ~(UINT64CONST(1) << i);
		}
	*perminfos = rtable_perminfos;
	return rtable;
}

/* Close the tables w opened and free its executor state. */
static void
pgq_write_close(PgqWrite *w)
{
	int			i;

	for (i = 0; i < w->works_view.n; i++)
		if (w->works_open & (UINT64CONST(1) << i))
			pgq_table_close(&w->works[i]);
	for (i = 0; i < w->jobs_view.n; i++)
		if (w->jobs_open & (UINT64CONST(1) << i))
			pgq_table_close(&w->jobs[i]);
	w->works_open = w->jobs_open = 0;
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
}

/*
 * Begin a call that writes pgqueue's tables: fn names the SQL function (for
 * the read-only error); open (PGQ_OPEN_WORK, PGQ_OPEN_JOB) says which
 * tables to open now: work_queue's current slot, queue's.  Other slots of
 * work_queue are opened on demand (pgq_work_slot), queue's by
 * pgq_write_job.  w->layout tells 1.0 from 1.1 (with work_queue open) and
 * 1.1 from 1.2 (from the table opened: both get max_tries in one update).
 * Tables are opened ROW EXCLUSIVE, so an ALTER EXTENSION ... UPDATE in
 * progress is waited for and its layout seen.
 *
 * The views are read at every call (ring.c: the invalidations sent so far
 * are read first), and read again once the current slots are locked: a
 * slot the scheduler stopped using in between (a turn, or one drained and
 * truncated, which it does under a lock that conflicts with ours) is not
 * written, the call begins again with the new views.  So a row is only
 * ever inserted into a slot that calls visit (ring.c, the rule).
 */
void
pgq_write_begin(PgqWrite *w, const char *fn, int open)
{
	Oid			nsp;
	int			attempt;

	PreventCommandIfReadOnly(fn);
	PreventCommandIfParallelMode(fn);
	pgq_call_begin();			/* before any snapshot (shmem.c) */
	nsp = get_namespace_oid("pgqueue", false);

	for (attempt = 0;; attempt++)
	{
		PgqRingView again;
		List	   *rtable;
		List	   *perminfos;
		bool		moved = false;

		memset(w, 0, offsetof(PgqWrite, works));
		w->work = NULL;
		w->job = NULL;
		w->row_gone = false;
		pgq_ring_view(nsp, "work_queue", &w->works_view);
		pgq_ring_view(nsp, "queue", &w->jobs_view);

		w->estate = CreateExecutorState();
		rtable = pgq_write_rtable(&perminfos);
		pgq_init_range_table(w->estate, rtable, perminfos);

		w->layout = PGQ_V11;
		if (open & PGQ_OPEN_WORK)
		{
			w->work = pgq_work_slot(w, 0);
			if (w->work->att[PGQ_COL_TRIES] == InvalidAttrNumber)
				w->layout = PGQ_V10;
			else if (w->work->att[PGQ_COL_MAX_TRIES] != InvalidAttrNumber)
				w->layout = PGQ_V12;
			pgq_ring_view(nsp, "work_queue", &again);
			moved |= again.relid[0] != w->works_view.relid[0];
		}
		if (open & PGQ_OPEN_JOB)
		{
			(void) pgq_write_job(w);
			if (!(open & PGQ_OPEN_WORK) &&
				w->job->att[PGQ_COL_MAX_TRIES] != InvalidAttrNumber)
				w->layout = PGQ_V12;
			pgq_ring_view(nsp, "queue", &again);
			moved |= again.relid[0] != w->jobs_view.relid[0];
		}
		if (!moved)
			break;
		/* the ring turned meanwhile: begin again with the new views */
		pgq_write_close(w);
		if (attempt == 10)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not begin %s: the slots of pgqueue's tables kept changing", fn),
					 errhint("Retry the transaction.")));
	}

	/* what a new statement would see: the transaction's changes so far */
	CommandCounterIncrement();
	w->cid = GetCurrentCommandId(true);
	w->snapshot = RegisterSnapshot(GetTransactionSnapshot());
	w->estate->es_snapshot = w->snapshot;
	w->estate->es_output_cid = w->cid;
}

/*
 * Add to w's views the slots the ring's state now has that they lack (a
 * turn, or a slot made, since the call began; ring.c).  The slots w has
 * keep their places, so walks and opened tables stay valid.  Returns how
 * many were added: a row not found, or found moved, is looked for again
 * in them (pgq_find_in, pgq_write_row).
 */
static int
pgq_write_refresh_views(PgqWrite *w)
{
	Oid			nsp = get_namespace_oid("pgqueue", false);
	PgqRingView *have[2] = {&w->works_view, &w->jobs_view};
	const char *const names[2] = {"work_queue", "queue"};
	int			added = 0;
	int			r;

	for (r = 0; r < 2; r++)
	{
		PgqRingView now;
		int			i;
		int			j;

		pgq_ring_view(nsp, names[r], &now);
		for (i = 0; i < now.n; i++)
		{
			PgqRingView *v = have[r];

			for (j = 0; j < v->n && v->relid[j] != now.relid[i]; j++)
				;
			if (j < v->n)
				continue;
			if (v->n == PGQ_MAX_SLOTS)
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("the slots of pgqueue.%s changed too much during the call", names[r]),
						 errhint("Retry the transaction.")));
			v->relid[v->n] = now.relid[i];
			v->slot[v->n] = now.slot[i];
			v->low[v->n] = now.low[i];
			v->since[v->n] = now.since[i];
			v->n++;
			added++;
		}
	}
	return added;
}

/*
 * Slot i of work_queue's slots as w sees them (0: the current one), opened
 * now if it was not.
 */
PgqTable *
pgq_work_slot(PgqWrite *w, int i)
{
	PgqTable   *t = &w->works[i];

	Assert(i < w->works_view.n);
	if (!(w->works_open & (UINT64CONST(1) << i)))
	{
		pgq_table_open(w, t, w->works_view.relid[i], PGQ_WORK_RTI(i), RowExclusiveLock);
		t->slot = w->works_view.slot[i];
		w->works_open |= UINT64CONST(1) << i;
	}
	return t;
}

/* Slot i of queue's slots as w sees them (0: the current one), opened now. */
PgqTable *
pgq_job_slot(PgqWrite *w, int i)
{
	PgqTable   *t = &w->jobs[i];

	Assert(i < w->jobs_view.n);
	if (!(w->jobs_open & (UINT64CONST(1) << i)))
	{
		pgq_table_open(w, t, w->jobs_view.relid[i], PGQ_JOB_RTI(i), RowExclusiveLock);
		t->slot = w->jobs_view.slot[i];
		w->jobs_open |= UINT64CONST(1) << i;
	}
	return t;
}

/*
 * The slot (table OID) where this backend last claimed or found a
 * work_queue row: a worker acks what it claimed, so its acks look there
 * first (in a drain, the rows taken are in the oldest slot, not the
 * current one).
 */
static Oid	last_work_slot = InvalidOid;

/* Note that a claim took a row of slot t. */
void
pgq_work_slot_used(PgqTable *t)
{
	last_work_slot = RelationGetRelid(t->rel);
}

/*
 * Probe the primary keys of the slots of view v (their tables opened by
 * open) for the row of job id: slot hint (an index in v, or -1) first,
 * then the others in v's order, then the slots the ring has made since
 * the call read its views (pgq_write_refresh_views: a row not found in a
 * view that is out of date is not gone).  Returns the slot's table, the
 * row in its found slot, or NULL.
 */
static PgqTable *
pgq_find_in(PgqWrite *w, PgqRingView *v, PgqTable *(*open) (PgqWrite *, int),
			int hint, Datum id)
{
	int			i;

	for (i = -1;; i++)
	{
		PgqTable   *t;

		if (i == v->n)
		{
			(void) pgq_write_refresh_views(w);
			if (i == v->n)
				break;			/* none added to this view (maybe to the other's) */
		}
		if (i == hint || (i < 0 && hint < 0))
			continue;			/* the hint is probed first, once */
		t = open(w, i < 0 ? hint : i);
		if (pgq_find(w, t, id))
			return t;
	}
	return NULL;
}

/*
 * Find the work_queue row of job id, probing the slots' primary keys: the
 * one this backend last used first, then newest first.  Returns the slot's
 * table, with the row in its found slot, and makes it w->work; NULL when no
 * slot holds the job.
 */
PgqTable *
pgq_find_work(PgqWrite *w, Datum id)
{
	int			hint = -1;
	int			i;
	PgqTable   *t;

	for (i = 0; i < w->works_view.n && hint < 0; i++)
		if (w->works_view.relid[i] == last_work_slot)
			hint = i;
	t = pgq_find_in(w, &w->works_view, pgq_work_slot, hint, id);
	if (t != NULL)
	{
		pgq_work_slot_used(t);
		w->work = t;
	}
	return t;
}

/*
 * Find the job row of id, probing the slots' primary keys: first the slot
 * that was current when the id was made (a job id begins with the
 * milliseconds of its making, uuid7.c, and a push inserts into the slot it
 * sees current), then the others, newest first.  Returns the slot's table,
 * with the row in its found slot, and makes it w->job; NULL when no slot
 * holds the job.
 */
PgqTable *
pgq_find_job(PgqWrite *w, Datum id)
{
	const unsigned char *u = DatumGetUUIDP(id)->data;
	int64		ms = 0;
	TimestampTz made;
	int			hint = -1;
	int			i;
	PgqTable   *t;

	if (w->jobs_view.n > 1)
	{
		for (i = 0; i < 6; i++)
			ms = (ms << 8) | u[i];
		made = ms * 1000 - (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
		for (i = 0; i < w->jobs_view.n; i++)
			if (w->jobs_view.since[i] <= made &&
				(hint < 0 || w->jobs_view.since[i] > w->jobs_view.since[hint]))
				hint = i;
	}
	t = pgq_find_in(w, &w->jobs_view, pgq_job_slot, hint, id);
	if (t != NULL)
		w->job = t;
	return t;
}

/*
 * Delete (build NULL) or update the row of job id found by find (in
 * work_queue or queue: w->work or w->job is where) if check(row, arg), as
 * pgq_delete_found and pgq_update_found do; changes names the columns an
 * update changes.  A row that another transaction deleted meanwhile may
 * have been moved to another slot (ring.c: a delete and an insert, or an
 * update of its slot): under READ COMMITTED it is looked for again with a
 * new snapshot.  Returns whether the row was written.
 */
static bool
pgq_write_row(PgqWrite *w, Datum id, PgqTable *(*find) (PgqWrite *, Datum),
			  PgqRowCheck check, PgqRowBuild build, void *arg,
			  const PgqCol *changes, int nchanges)
{
	int			attempt;

	for (attempt = 0;; attempt++)
	{
		PgqTable   *t;
		bool		done;

		w->row_gone = false;
		if ((t = find(w, id)) == NULL)
			return false;
		if (build == NULL)
			done = pgq_delete_found(w, t, check, arg);
		else
		{
			pgq_write_changes(w, t, changes, nchanges);
			done = pgq_update_found(w, t, check, build, arg);
		}
		if (done || !w->row_gone)
			return done;
		if (attempt == 3)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not write the row of job %s: it kept moving between slots",
							DatumGetCString(DirectFunctionCall1(uuid_out, id))),
					 errhint("Retry the transaction.")));
		/* moved meanwhile (ring.c), maybe to a slot made after the call began */
		pgq_write_new_snapshot(w);
	}
}

/* pgq_write_row of the work_queue row of job id; w->work is its slot. */
bool
pgq_write_work(PgqWrite *w, Datum id, PgqRowCheck check, PgqRowBuild build,
			   void *arg, const PgqCol *changes, int nchanges)
{
	return pgq_write_row(w, id, pgq_find_work, check, build, arg, changes, nchanges);
}

/* pgq_write_row of the job row of id; w->job is its slot. */
bool
pgq_write_job_row(PgqWrite *w, Datum id, PgqRowCheck check, PgqRowBuild build,
				  void *arg, const PgqCol *changes, int nchanges)
{
	return pgq_write_row(w, id, pgq_find_job, check, build, arg, changes, nchanges);
}

static Oid pgq_job_row_scan(Datum id);

/*
 * A call holds the work_queue row of job id (locked, or deleted) and did
 * not find the job row in the slots of pgqueue.queue, those made since
 * the call began included.  The lock order (work_queue row first) keeps
 * every other API call from removing the job meanwhile, so it was removed
 * behind the API's back, and the caller may go on as for a job that is
 * gone (a claim deletes the orphan work_queue row).  Unless the parent,
 * read by SQL (every partition of its plan, not the slots of a view), or
 * else every partition the catalog lists, read whole, still has it: then
 * the call fails, rather than take a job for gone on the word of its
 * slots and leave it scheduled without a work_queue row.
 */
void
pgq_job_row_missing(Datum id)
{
	static SPIPlanPtr plan = NULL;
	Oid			type = UUIDOID;
	int			nest = pgq_spi_connect();
	bool		found;
	Oid			scanned;

	if (SPI_execute_plan(pgq_keep_plan(&plan, "SELECT 1 FROM pgqueue.queue q WHERE q.id = $1",
									   1, &type),
						 &id, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "lookup of a job in pgqueue.queue failed");
	found = (SPI_processed > 0);
	pgq_spi_finish(nest);
	if (found)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("job %s was not found in the slots of pgqueue.queue",
						DatumGetCString(DirectFunctionCall1(uuid_out, id))),
				 errhint("Retry the transaction; report it if it happens again.")));

	/*
	 * Gone for the statement too.  It found the row through the same
	 * primary keys, and a plan made from this backend's list of partitions:
	 * before the caller takes the job for gone (a claim deletes its work
	 * row, and a job left 'scheduled' without one is lost), every partition
	 * the catalog lists now is read whole (rare: a job removed behind the
	 * API's back).
	 */
	if (OidIsValid(scanned = pgq_job_row_scan(id)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("job %s was not found in the slots of pgqueue.queue",
						DatumGetCString(DirectFunctionCall1(uuid_out, id))),
				 errdetail("A scan of \"%s\" found it; its primary key did not.",
						   get_rel_name(scanned)),
				 errhint("Retry the transaction; report it if it happens again.")));
}

/*
 * The rows of relid that match (every row when match is NULL), counted up
 * to max + 1, read whole: first with SnapshotDirty (row versions whose
 * insert committed or is in progress and whose delete is not committed),
 * then, when that found none and snap is given, with snap.  A dirty scan
 * alone can miss a row that an update moves behind it (to a page it
 * passed, one added after it began, or a partition read before) and
 * commits before the scan reaches the old version; a snapshot registered
 * before the first scan began still sees that old version, in place (not
 * pruned while the snapshot holds this backend's xmin).
 */
int
pgq_rel_rows(Oid relid, Snapshot snap, PgqRowMatch match, void *arg, int max)
{
	Relation	rel = table_open(relid, AccessShareLock);
	SnapshotData dirty;
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	int			n = 0;

	InitDirtySnapshot(dirty);
	for (int pass = 0; pass < 2 && n == 0; pass++)
	{
		TableScanDesc scan;

		if (pass == 1 && snap == NULL)
			break;
		scan = table_beginscan(rel, pass == 0 ? &dirty : snap, 0, NULL);
		while (n <= max && table_scan_getnextslot(scan, ForwardScanDirection, slot))
			if (match == NULL || match(rel, slot, arg))
				n++;
		table_endscan(scan);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
	return n;
}

/* pgq_rel_rows' match for pgq_job_row_scan: the row of a job */
typedef struct PgqJobMatch
{
	Datum		id;
	Oid			relid;			/* the relation att was looked up for */
	AttrNumber	att;			/* its column "id" */
} PgqJobMatch;

static bool
pgq_row_is_job(Relation rel, TupleTableSlot *slot, void *arg)
{
	PgqJobMatch *m = (PgqJobMatch *) arg;
	bool		isnull;
	Datum		d;

	if (m->relid != RelationGetRelid(rel))
	{
		m->relid = RelationGetRelid(rel);
		m->att = get_attnum(m->relid, "id");
	}
	if (m->att == InvalidAttrNumber)
		return false;
	d = slot_getattr(slot, m->att, &isnull);
	return !isnull && DatumGetBool(DirectFunctionCall2(uuid_eq, d, m->id));
}

/*
 * The partition of pgqueue.queue (or the table, in 1.0) that holds a row
 * of job id that some transaction may still see, read whole, in the
 * partitions the catalog lists now (pgq_rel_rows, with a snapshot taken
 * before the first of them: a move between two partitions cannot slip
 * between their scans); InvalidOid when none.
 */
static Oid
pgq_job_row_scan(Datum id)
{
	Oid			parent = pgq_relid(get_namespace_oid("pgqueue", false), "queue");
	List	   *rels = list_make1_oid(parent);
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	PgqJobMatch m = {id, InvalidOid, InvalidAttrNumber};
	Oid			found = InvalidOid;
	ListCell   *lc;

	/* "now": the catalog read with a snapshot no older than snap */
	InvalidateCatalogSnapshot();
	if (get_rel_relkind(parent) == RELKIND_PARTITIONED_TABLE)
		rels = find_inheritance_children(parent, AccessShareLock);
	foreach(lc, rels)
	{
		if (pgq_rel_rows(lfirst_oid(lc), snap, pgq_row_is_job, &m, 0) > 0)
		{
			found = lfirst_oid(lc);
			break;
		}
	}
	UnregisterSnapshot(snap);
	return found;
}

/*
 * Take w's snapshot anew (after a bound was read, or SPI statements ran in
 * between), seeing what the transaction did so far.
 */
void
pgq_write_new_snapshot(PgqWrite *w)
{
	CommandCounterIncrement();
	w->cid = GetCurrentCommandId(true);
	UnregisterSnapshot(w->snapshot);
	w->snapshot = RegisterSnapshot(GetTransactionSnapshot());
	w->estate->es_snapshot = w->snapshot;
	w->estate->es_output_cid = w->cid;

	/*
	 * The slots of the turns this snapshot sees: the scheduler commits a
	 * turn before any pass writes the slot it made current, so a snapshot
	 * that sees a row of it was taken after the turn's invalidation was
	 * sent (ring.c).
	 */
	(void) pgq_write_refresh_views(w);
}

/* The current slot of pgqueue.queue, opened now; it becomes w->job. */
PgqTable *
pgq_write_job(PgqWrite *w)
{
	return w->job = pgq_job_slot(w, 0);
}

/* End a call begun with pgq_write_begin. */
void
pgq_write_end(PgqWrite *w)
{
	pgq_write_close(w);
	UnregisterSnapshot(w->snapshot);
	pgq_call_end();
}

/*
 * Tell the executor state which columns of t the next update changes (for
 * the index AM's "unchanged by update" hint: bottom-up deletion of the
 * duplicates that non-HOT updates leave in the primary key).
 */
void
pgq_write_changes(PgqWrite *w, PgqTable *t, const PgqCol *cols, int ncols)
{
	RangeTblEntry *rte = exec_rt_fetch(t->rri->ri_RangeTableIndex, w->estate);
	Bitmapset  *set = NULL;
	int			i;

	for (i = 0; i < ncols; i++)
		if (t->att[cols[i]] != InvalidAttrNumber)
			set = bms_add_member(set, t->att[cols[i]] - FirstLowInvalidHeapAttributeNumber);
	pgq_rte_set_updated_cols(pgq_estate_perminfos(w->estate), rte, set);
}

/*
 * Find the row of t whose id is the uuid id, as w's snapshot sees it, into
 * t->found.  Returns false when there is none.
 */
bool
pgq_find(PgqWrite *w, PgqTable *t, Datum id)
{
	IndexScanDesc scan;
	ScanKeyData key;
	bool		found;

	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_UUID_EQ, id);
	scan = pgq_index_beginscan(t->rel, t->pkey, w->snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, t->found);
	index_endscan(scan);
	if (!found)
		ExecClearTuple(t->found);
	return found;
}

/*
 * Deal with a write that found the row changed by another transaction
 * (res, as returned by table_tuple_update/delete for t->found).  Under READ
 * COMMITTED the latest version is locked into t->found (returns true: the
 * caller checks its condition again and retries) or is gone (false).
 * Otherwise a serialization error, as SQL raises.
 */
static bool
pgq_write_result(PgqWrite *w, PgqTable *t, TM_Result res, TM_FailureData *tmfd,
				 const char *what)
{
	switch (res)
	{
		case TM_Updated:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			if (ItemPointerIndicatesMovedPartitions(&tmfd->ctid))
			{
				/* moved to another slot (ring.c): the caller looks again */
				w->row_gone = true;
				return false;
			}
			res = table_tuple_lock(t->rel, &t->found->tts_tid, w->snapshot,
								   t->found, w->cid, LockTupleExclusive,
								   LockWaitBlock, TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
								   tmfd);
			if (res == TM_Ok)
				return true;
			if (res == TM_Deleted)
			{
				w->row_gone = true;
				return false;
			}
			break;
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent delete")));
			w->row_gone = true;
			return false;
		case TM_SelfModified:
			/* changed by this very call (as by a statement, for itself) */
			if (tmfd->cmax == w->cid)
				return false;
			break;
		default:
			break;
	}
	elog(ERROR, "unexpected result %d of %s of a row of \"pgqueue.%s\"",
		 (int) res, what, RelationGetRelationName(t->rel));
	return false;				/* keep compiler quiet */
}

/*
 * A row of t was written.  Every write of work_queue changes the indexes of
 * the READY and LEASE bounds: the transaction raises them no more
 * (bounds.c, rule 4).  Writes of pgqueue.queue that take jobs out of the
 * ready states are held by their callers (PGQ_BOUND_SCHED).
 */
static void
pgq_write_done(PgqWrite *w, PgqTable *t)
{
	if (t < w->jobs || t >= w->jobs + PGQ_MAX_SLOTS)
	{
		pgq_bound_hold(PGQ_BOUND_READY);
		pgq_bound_hold(PGQ_BOUND_LEASE);
	}
}

/*
 * Delete the row in t->found if check(t->found, arg) (NULL: always).  A row
 * changed meanwhile is checked again in its latest version (see above).
 * Returns whether a row was deleted; t->found holds it then.
 */
bool
pgq_delete_found(PgqWrite *w, PgqTable *t, PgqRowCheck check, void *arg)
{
	for (;;)
	{
		TM_FailureData tmfd;
		TM_Result	res;

		if (check != NULL && !check(t, arg))
			return false;
		res = table_tuple_delete(t->rel, &t->found->tts_tid, w->cid, w->snapshot,
								 InvalidSnapshot, true, &tmfd, false);
		if (res == TM_Ok)
		{
			pgq_write_done(w, t);
			return true;
		}
		if (!pgq_write_result(w, t, res, &tmfd, "delete"))
			return false;
	}
}

/*
 * Update the row in t->found if check(t->found, arg) (NULL: always) to the
 * version build(t, arg) puts into t->next (starting from a copy of
 * t->found's values in t->next's tts_values/tts_isnull, which it changes
 * and then stores with ExecStoreVirtualTuple).  Columns changed must have
 * been named with pgq_write_changes.  A row changed meanwhile is checked
 * and built again from its latest version.  Returns whether the row was
 * updated; t->next then holds the new version (with its tid).
 */
bool
pgq_update_found(PgqWrite *w, PgqTable *t, PgqRowCheck check,
				 PgqRowBuild build, void *arg)
{
	for (;;)
	{
		TM_FailureData tmfd;
		TM_Result	res;
		LockTupleMode lockmode;
		PgqUpdateIndexes update_indexes;
		int			natts = RelationGetDescr(t->rel)->natts;

		if (check != NULL && !check(t, arg))
			return false;
		slot_getallattrs(t->found);
		ExecClearTuple(t->next);
		memcpy(t->next->tts_values, t->found->tts_values, sizeof(Datum) * natts);
		memcpy(t->next->tts_isnull, t->found->tts_isnull, sizeof(bool) * natts);
		build(t, arg);

		res = table_tuple_update(t->rel, &t->found->tts_tid, t->next, w->cid,
								 w->snapshot, InvalidSnapshot, true, &tmfd,
								 &lockmode, &update_indexes);
		if (res == TM_Ok)
		{
			if (PGQ_UPDATE_NEEDS_INDEXES(update_indexes))
				pgq_table_indexes(t);
			if (PGQ_UPDATE_NEEDS_INDEXES(update_indexes) && t->rri->ri_NumIndices > 0)
				pgq_table_index_row(w, t, true, PGQ_UPDATE_ONLY_SUMMARIZING(update_indexes));
			pgq_write_done(w, t);
			return true;
		}
		if (!pgq_write_result(w, t, res, &tmfd, "update"))
			return false;
	}
}

/*
 * Insert a row into t with the given values (by attribute number - 1) and
 * make its index entries.  Unique violations are raised as by SQL.
 */
void
pgq_insert(PgqWrite *w, PgqTable *t, Datum *values, bool *isnull)
{
	int			natts = RelationGetDescr(t->rel)->natts;

	ExecClearTuple(t->next);
	memcpy(t->next->tts_values, values, sizeof(Datum) * natts);
	memcpy(t->next->tts_isnull, isnull, sizeof(bool) * natts);
	if (t->att[PGQ_COL_SLOT] != InvalidAttrNumber)
	{
		/* the slot this partition holds (ring.c) */
		t->next->tts_values[t->att[PGQ_COL_SLOT] - 1] = Int32GetDatum(t->slot);
		t->next->tts_isnull[t->att[PGQ_COL_SLOT] - 1] = false;
	}
	ExecStoreVirtualTuple(t->next);
	if (RelationGetDescr(t->rel)->constr)
		ExecConstraints(t->rri, t->next, w->estate);
	table_tuple_insert(t->rel, t->next, w->cid, 0, NULL);
	pgq_table_indexes(t);
	if (t->rri->ri_NumIndices > 0)
		pgq_table_index_row(w, t, false, false);
	pgq_write_done(w, t);
}

/* Value of column c of the row in slot (which must belong to t). */
Datum
pgq_get(PgqTable *t, TupleTableSlot *slot, PgqCol c, bool *isnull)
{
	if (t->att[c] == InvalidAttrNumber)
	{
		*isnull = true;
		return (Datum) 0;
	}
	return slot_getattr(slot, t->att[c], isnull);
}

/* Set column c of the row being built in t->next (see pgq_update_found). */
void
pgq_set(PgqTable *t, PgqCol c, Datum value, bool isnull)
{
	if (t->att[c] == InvalidAttrNumber)
		elog(ERROR, "column %s of \"pgqueue.%s\" is missing",
			 pgq_col_names[c], RelationGetRelationName(t->rel));
	t->next->tts_values[t->att[c] - 1] = value;
	t->next->tts_isnull[t->att[c] - 1] = isnull;
}

/* Whether the text column c of the row in t->found equals key. */
bool
pgq_text_equals(PgqTable *t, PgqCol c, text *key)
{
	bool		isnull;
	Datum		d = pgq_get(t, t->found, c, &isnull);

	if (isnull)
		return false;
	return DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID,
												d, PointerGetDatum(key)));
}

/*
 * The value of the job state label (pending, retry, scheduled, failed) for
 * the state column of t (an enum type of the extension's).
 */
Datum
pgq_state_datum(PgqTable *t, const char *label)
{
	Oid			typid;

	if (t->att[PGQ_COL_STATE] == InvalidAttrNumber)
		elog(ERROR, "column state of \"pgqueue.%s\" is missing",
			 RelationGetRelationName(t->rel));
	typid = TupleDescAttr(RelationGetDescr(t->rel), t->att[PGQ_COL_STATE] - 1)->atttypid;
	return DirectFunctionCall2(enum_in, CStringGetDatum(label), ObjectIdGetDatum(typid));
}

/*
 * The relation pgqueue.name (nsp: pgqueue's namespace); a clear error when
 * it is missing.
 */
Oid
pgq_relid(Oid nsp, const char *name)
{
	Oid			relid = get_relname_relid(name, nsp);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"pgqueue.%s\" does not exist", name),
				 errhint("Reinstall the extension: DROP EXTENSION pgqueue; CREATE EXTENSION pgqueue;")));
	return relid;
}

/*
 * Which layout this database's pgqueue tables have: PGQ_V12 when
 * pgqueue.work_queue has the max_tries column of version 1.2, PGQ_V11 when
 * it has the tries column of version 1.1, else PGQ_V10.  One
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
	if (get_attnum(relid, "max_tries") != InvalidAttrNumber)
		return PGQ_V12;
	return get_attnum(relid, "tries") != InvalidAttrNumber ? PGQ_V11 : PGQ_V10;
}

/* ----------------------------------------------------------------
 * Slots' indexes
 *
 * In 1.1, pgqueue.queue and pgqueue.work_queue are partitioned by slot
 * (LIST), and the per-job calls read and write the slots' partitions
 * directly, by OID (ring.c says which): through the parent, each call
 * would lock and route through every partition.  A 1.0 database's tables
 * are not partitioned: they are used as they are.
 *
 * Each slot has its own indexes, named after it (queue_0_ready_idx is the
 * queue_ready_idx of slot 0, as the comments elsewhere call it), not
 * partitions of indexes on the parents (see pgqueue--1.1.sql).  They are
 * kept in a small cache, emptied at any relcache invalidation (a DROP or
 * RENAME invalidates the relations concerned), so that a call pays no
 * catalog lookup for them.
 * ----------------------------------------------------------------
 */

#define PGQ_SLOT_CACHE_SIZE 64

typedef struct PgqSlotCacheEntry
{
	Oid			parent;			/* a slot's table */
	const char *role;			/* the role of an index of the slot */
	Oid			part;			/* that index */
} PgqSlotCacheEntry;

static PgqSlotCacheEntry slot_cache[PGQ_SLOT_CACHE_SIZE];
static int	slot_cache_used = 0;
static bool slot_cache_registered = false;

static void
pgq_slot_cache_callback(Datum arg, Oid relid)
{
	slot_cache_used = 0;
}

/* The cached relation for (parent, role), or InvalidOid. */
static Oid
pgq_slot_cache_get(Oid parent, const char *role)
{
	int			i;

	for (i = 0; i < slot_cache_used; i++)
		if (slot_cache[i].parent == parent && strcmp(slot_cache[i].role, role) == 0)
			return slot_cache[i].part;
	return InvalidOid;
}

static void
pgq_slot_cache_put(Oid parent, const char *role, Oid part)
{
	if (!slot_cache_registered)
	{
		CacheRegisterRelcacheCallback(pgq_slot_cache_callback, (Datum) 0);
		slot_cache_registered = true;
	}
	if (slot_cache_used == PGQ_SLOT_CACHE_SIZE)
		slot_cache_used = 0;
	slot_cache[slot_cache_used].parent = parent;
	slot_cache[slot_cache_used].role = role;
	slot_cache[slot_cache_used].part = part;
	slot_cache_used++;
}

/*
 * The index of role role (ready_idx, lease_idx, ...) of rel, a slot's
 * partition (1.1) or a 1.0 table: the one named after rel,
 * pgqueue.<rel>_<role>, as the extension scripts and 1.0 name them
 * (queue_0_ready_idx, work_queue_lease_idx).
 */
Oid
pgq_slot_index_relid(Relation rel, const char *role)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			idx = pgq_slot_cache_get(relid, role);
	char	   *name;

	if (OidIsValid(idx))
		return idx;
	name = psprintf("%s_%s", RelationGetRelationName(rel), role);
	idx = pgq_relid(RelationGetNamespace(rel), name);
	if (get_rel_relkind(idx) != RELKIND_INDEX)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"pgqueue.%s\" is not an index", name),
				 errhint("Reinstall the extension: DROP EXTENSION pgqueue; CREATE EXTENSION pgqueue;")));
	pfree(name);
	pgq_slot_cache_put(relid, role, idx);
	return idx;
}
