/*-------------------------------------------------------------------------
 *
 * claimscan.c
 *		Find and lock the never-claimed rows of pgqueue.work_queue for a
 *		claim, in scheduling order, without locking rows it cannot take;
 *		and the other index probes that claims and scheduling passes make
 *		on every call, done here without SQL.
 *
 * Why not "SELECT ... FOR UPDATE SKIP LOCKED" in SQL: under READ COMMITTED
 * a row whose visible version was updated by a transaction that committed
 * after the statement's snapshot (another claim that just took it) is not
 * skipped but followed to its latest version, which is locked and only then
 * re-checked.  The re-check fails (the row is claimed) and the row is left
 * out, yet it stays locked until the claiming transaction ends.  The worker
 * that really holds the job then waits for that stranger's commit when it
 * acks: measured under 4 consumers, the ack statement averaged 1.3 ms, most
 * of it in XactLockTableWait, and about a third of every consumer's time.
 *
 * Here each candidate is locked as the version the snapshot sees, without
 * following updates (table_tuple_lock without
 * TUPLE_LOCK_FLAG_FIND_LAST_VERSION): a row that changed since, or that
 * another transaction holds, is skipped and never locked.  The rows locked
 * are then updated by the claim statement through their ids.
 *
 * Unfiltered claims walk work_queue_ready_idx (created, batch_order);
 * claims filtered by queue walk work_queue_queue_ready_idx once per queue
 * and merge the walks in (created, batch_order) order, so exactly the first
 * max_items claimable rows of those queues are taken.  Walks start at the
 * PGQ_HINT_READY bound (shmem.c), not at the left end of the index, where
 * the entries of claimed rows pile up until VACUUM removes them; an
 * unfiltered walk moves the bound up to the first row it did not pass.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "pgqueue.h"

/* One index walk: its scan and the ready row it stands on. */
typedef struct ReadyWalk
{
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		valid;			/* slot holds a ready row */
	TimestampTz created;
	int32		batch_order;
} ReadyWalk;

/* Attribute numbers of pgqueue.work_queue looked up for this call. */
typedef struct WorkQueueAtts
{
	AttrNumber	id;
	AttrNumber	created;
	AttrNumber	batch_order;
	AttrNumber	lock_timeout;
} WorkQueueAtts;

static AttrNumber
pgq_attnum(Oid relid, const char *name)
{
	AttrNumber	att = get_attnum(relid, name);

	if (att == InvalidAttrNumber)
		elog(ERROR, "pgqueue: column pgqueue.work_queue.%s is missing", name);
	return att;
}

Oid
pgq_relid(Oid nsp, const char *name)
{
	Oid			relid = get_relname_relid(name, nsp);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("pgqueue: relation pgqueue.%s is missing", name),
				 errhint("Reinstall the extension: DROP EXTENSION pgqueue; CREATE EXTENSION pgqueue;")));
	return relid;
}

/*
 * Push, as the active snapshot, a new one that sees what this transaction
 * did so far: what a non-read-only SPI statement would take.  The caller
 * pops it.
 */
static Snapshot
pgq_push_scan_snapshot(void)
{
	CommandCounterIncrement();
	PushCopiedSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	return GetActiveSnapshot();
}

/*
 * Advance a walk to the next row its snapshot sees as ready.  The index is
 * partial on "lock_timeout IS NULL", but an entry can lead through a HOT
 * chain to a version that is no longer ready, so the column is re-checked.
 */
static void
pgq_walk_next(ReadyWalk *w, const WorkQueueAtts *att)
{
	while (index_getnext_slot(w->scan, ForwardScanDirection, w->slot))
	{
		bool		isnull;

		(void) slot_getattr(w->slot, att->lock_timeout, &isnull);
		if (!isnull)
			continue;
		w->created = DatumGetTimestampTz(slot_getattr(w->slot, att->created, &isnull));
		w->batch_order = DatumGetInt32(slot_getattr(w->slot, att->batch_order, &isnull));
		w->valid = true;
		return;
	}
	w->valid = false;
}

/*
 * Lock up to max_items never-claimed (or released) rows of
 * pgqueue.work_queue, of the given queues when queues is not NULL, in
 * scheduling order.  Returns their ids as a uuid[] (possibly empty); the
 * rows stay locked FOR UPDATE until the transaction ends.
 */
ArrayType *
pgq_lock_ready(int max_items, ArrayType *queues)
{
	Oid			nsp = get_namespace_oid("pgqueue", false);
	Oid			relid = pgq_relid(nsp, "work_queue");
	Relation	rel;
	Relation	idx;
	Snapshot	snap;
	CommandId	cid;
	WorkQueueAtts att;
	ReadyWalk  *walks;
	int			nwalks = 0;
	TupleTableSlot *lockslot;
	Datum	   *ids;
	int			nids = 0;
	int			i;
	TimestampTz bound;
	uint64		epoch;
	bool		hinted;
	TimestampTz stop = DT_NOEND;	/* created of the first row not passed */
	ScanKeyData keys[2];

	/* what SELECT FOR UPDATE would say on a standby or read-only */
	PreventCommandIfReadOnly("pgq_claim");
	PreventCommandIfParallelMode("pgq_claim");

	att.id = pgq_attnum(relid, "id");
	att.created = pgq_attnum(relid, "created");
	att.batch_order = pgq_attnum(relid, "batch_order");
	att.lock_timeout = pgq_attnum(relid, "lock_timeout");

	rel = table_open(relid, RowShareLock);
	idx = index_open(pgq_relid(nsp, queues ? "work_queue_queue_ready_idx"
							   : "work_queue_ready_idx"),
					 AccessShareLock);

	/* the bound is read before the snapshot is taken (see shmem.c) */
	hinted = pgq_hint_get(PGQ_HINT_READY, &bound, &epoch, queues == NULL);

	snap = pgq_push_scan_snapshot();
	cid = GetCurrentCommandId(true);

	if (queues == NULL)
	{
		ScanKeyEntryInitialize(&keys[0], 0, 1, BTGreaterEqualStrategyNumber,
							   InvalidOid, InvalidOid, F_TIMESTAMPTZ_GE,
							   TimestampTzGetDatum(bound));
		walks = palloc0(sizeof(ReadyWalk));
		walks[0].scan = index_beginscan(rel, idx, snap, hinted ? 1 : 0, 0);
		index_rescan(walks[0].scan, keys, hinted ? 1 : 0, NULL, 0);
		nwalks = 1;
	}
	else
	{
		Datum	   *names;
		bool	   *nulls;
		int			nnames;

		deconstruct_array(queues, TEXTOID, -1, false, TYPALIGN_INT,
						  &names, &nulls, &nnames);
		walks = palloc0(sizeof(ReadyWalk) * nnames);
		for (i = 0; i < nnames; i++)
		{
			int			j;
			bool		dup = false;

			/* the caller rejected NULL elements; skip repeated names */
			for (j = 0; j < i && !dup; j++)
				dup = DatumGetBool(DirectFunctionCall2Coll(texteq,
														  idx->rd_indcollation[0],
														  names[i], names[j]));
			if (dup)
				continue;
			ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber,
								   InvalidOid, idx->rd_indcollation[0],
								   F_TEXTEQ, names[i]);
			ScanKeyEntryInitialize(&keys[1], 0, 2, BTGreaterEqualStrategyNumber,
								   InvalidOid, InvalidOid, F_TIMESTAMPTZ_GE,
								   TimestampTzGetDatum(bound));
			walks[nwalks].scan = index_beginscan(rel, idx, snap, hinted ? 2 : 1, 0);
			index_rescan(walks[nwalks].scan, keys, hinted ? 2 : 1, NULL, 0);
			nwalks++;
		}
	}

	for (i = 0; i < nwalks; i++)
	{
		walks[i].slot = table_slot_create(rel, NULL);
		pgq_walk_next(&walks[i], &att);
	}

	lockslot = table_slot_create(rel, NULL);
	ids = palloc(sizeof(Datum) * max_items);
	while (nids < max_items)
	{
		ReadyWalk  *best = NULL;
		TM_FailureData tmfd;
		TM_Result	res;

		for (i = 0; i < nwalks; i++)
		{
			ReadyWalk  *w = &walks[i];

			if (w->valid &&
				(best == NULL || w->created < best->created ||
				 (w->created == best->created && w->batch_order < best->batch_order)))
				best = w;
		}
		if (best == NULL)
			break;

		/* the version we saw, or nothing: never follow it to a newer one */
		res = table_tuple_lock(rel, &best->slot->tts_tid, snap, lockslot, cid,
							   LockTupleExclusive, LockWaitSkip, 0, &tmfd);

		/*
		 * Rows changed since the snapshot (TM_Updated, TM_Deleted: claimed,
		 * gone) may be passed; a row taken here or held by another
		 * transaction may not.
		 */
		if (res != TM_Updated && res != TM_Deleted && stop == DT_NOEND)
			stop = best->created;
		if (res == TM_Ok)
		{
			bool		isnull;
			pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));

			memcpy(id, DatumGetUUIDP(slot_getattr(lockslot, att.id, &isnull)),
				   sizeof(pg_uuid_t));
			ids[nids++] = UUIDPGetDatum(id);
		}
		pgq_walk_next(best, &att);
	}

	/*
	 * Every row before "stop" is claimed or gone as of the snapshot; when the
	 * walk ran out, every row is (later scheduling passes lower the bound).
	 */
	if (queues == NULL)
		pgq_hint_set(PGQ_HINT_READY, stop, epoch, !hinted);

	ExecDropSingleTupleTableSlot(lockslot);
	for (i = 0; i < nwalks; i++)
	{
		ExecDropSingleTupleTableSlot(walks[i].slot);
		index_endscan(walks[i].scan);
	}
	PopActiveSnapshot();
	index_close(idx, NoLock);
	table_close(rel, NoLock);

	return construct_array(ids, nids, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR);
}

/*
 * The earliest lease deadline in [from, now) of pgqueue.work_queue, as a
 * new snapshot sees it (what a non-read-only SPI statement would see);
 * *found is false when there is none.  One probe of work_queue_lease_idx,
 * without the plan and executor start-up of the same query in SQL, which
 * every claim runs and which almost always finds nothing.
 */
TimestampTz
pgq_first_expired(TimestampTz from, TimestampTz now, bool *found)
{
	Oid			nsp = get_namespace_oid("pgqueue", false);
	Oid			relid = pgq_relid(nsp, "work_queue");
	AttrNumber	att = pgq_attnum(relid, "lock_timeout");
	Relation	rel = table_open(relid, AccessShareLock);
	Relation	idx = index_open(pgq_relid(nsp, "work_queue_lease_idx"), AccessShareLock);
	Snapshot	snap;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData keys[2];
	TimestampTz result = 0;

	*found = false;
	snap = pgq_push_scan_snapshot();

	ScanKeyEntryInitialize(&keys[0], 0, 1, BTGreaterEqualStrategyNumber,
						   InvalidOid, InvalidOid, F_TIMESTAMPTZ_GE,
						   TimestampTzGetDatum(from));
	ScanKeyEntryInitialize(&keys[1], 0, 1, BTLessStrategyNumber,
						   InvalidOid, InvalidOid, F_TIMESTAMPTZ_LT,
						   TimestampTzGetDatum(now));
	scan = index_beginscan(rel, idx, snap, 2, 0);
	index_rescan(scan, keys, 2, NULL, 0);
	slot = table_slot_create(rel, NULL);

	/* the heap version is re-checked: the entry may lead through a HOT chain */
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		TimestampTz t = DatumGetTimestampTz(slot_getattr(slot, att, &isnull));

		if (!isnull && t >= from && t < now)
		{
			result = t;
			*found = true;
			break;
		}
	}

	ExecDropSingleTupleTableSlot(slot);
	index_endscan(scan);
	PopActiveSnapshot();
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	return result;
}

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
ArrayType *
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
