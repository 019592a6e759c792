/*-------------------------------------------------------------------------
 *
 * ring.c
 *		The slots of pgqueue.queue and pgqueue.work_queue: which of their
 *		partitions calls visit (the view, cached per backend), and the
 *		rings that the scheduler turns: a new current slot every
 *		pgqueue.slot_size of rows, slots whose rows are all gone given
 *		back whole with TRUNCATE instead of row by row by VACUUM, which a
 *		long snapshot holds back (bench/ROTATION.md).
 *
 * States (pgqueue.slots):
 *
 *	 current	where new rows go (pushes' job rows, a scheduling pass's
 *				work_queue rows)
 *	 live		may hold rows: calls visit it (claims walk it, acks probe it)
 *	 drained	found empty: calls under READ COMMITTED no longer visit it;
 *				truncated when no snapshot that could see its rows is left
 *				(below)
 *	 free		truncated, empty: the next slot to become current (its
 *				statistics set right once other backends' counts of its
 *				last rows are in: stats_settle)
 *
 * A partition without a row in pgqueue.slots is live, and the ring leaves
 * it so: it was not made by this ring (a restore's, whose rows and states
 * may still be on their way), so it is never drained, truncated, reused
 * or retired; a restored pgqueue.slots gives it its state.
 *
 * Slot 0 of each ring, a member of the extension (pgqueue--1.1.sql), is
 * never current again once another slot was made current, nor truncated,
 * reused or retired, so the scheduler never takes ACCESS EXCLUSIVE on it.
 * The workers of pg_dump -j lock each table whose rows they dump without
 * waiting (NOWAIT), and its leader, which holds a lock on every other
 * table from the start, takes none on a member of an extension: a
 * work_queue_0 truncated or made current again during a dump failed it.
 * work_queue's slot 0 is emptied by the straggler moves, then drained as
 * any other slot (a state in pgqueue.slots, no lock that a dump meets),
 * and stays drained: a live slot 0 would be one more walk for every claim
 * for good.  Never truncated, it has no look under ACCESS EXCLUSIVE that
 * would find rows in it: each look at the ring does a dirty scan of it
 * instead, and rows found (a restore's, or written by hand) make it live
 * again.  queue's slot 0 stays live (below).
 *
 * Slot 0 of queue is its cold slot.  Jobs with a dedup_key are pushed into it (its
 * unique index is the only one: uniqueness holds because such jobs never
 * leave it), and the job rows left in an old slot are moved into it
 * (ring_move_jobs): jobs due later, dead letters, a paused queue's backlog,
 * jobs under long leases, which may stay for days and would otherwise keep
 * their slot, and the ring, from turning.  VACUUM keeps slot 0.
 *
 * The rule: how a call learns the ring's state.  Only the scheduler
 * changes a ring (pgq_ring_maintain, its turns, then pgq_ring_move, the
 * straggler moves, before its passes, and pgq_ring_shrink after them,
 * each in a transaction of its own: a turn has sent its invalidations
 * before a move or a pass writes the slot it made current), and every
 * change commits with a relcache invalidation of the parent.  A call reads
 * the ring at each call, not once per transaction: pgq_ring_view reads the
 * invalidations sent so far (AcceptInvalidationMessages) before it looks
 * at its cached view.  Taking the lock on the parent would not do: a
 * transaction that holds it already reads nothing there, and every later
 * call of that transaction (each try of a blocking claim too) would use
 * the slots of its first call.  So a transaction that began before a turn
 * sees the turn at its next call; the rows it wrote before are in a slot
 * that is still visited (below).  A call that takes a new snapshot reads
 * the invalidations again after it (pgq_write_new_snapshot): a row of a
 * pass that the snapshot sees is in a slot whose turn was committed, and
 * its invalidation sent, before that pass began.  (A turn shows in
 * pgqueue.slots a moment before its invalidation is sent: a view loaded
 * from the table in that moment has the new slots before others do; a
 * row another call then misses is found through the parent, below.)
 * Entry points:
 *
 *	 push, push_batch (jobs.c) and the scheduling pass (schedule.c) insert
 *		into the current slot, which pgq_write_begin locks (ROW EXCLUSIVE)
 *		and then checks against the view read again: a turn committed in
 *		between makes the call begin again with the new view.  A push with
 *		a dedup_key inserts into queue's slot 0, never drained.
 *	 claim (claim.c; each try of a waiting claim is a call of its own)
 *		walks the slots of its view; the job of a work_queue row taken is
 *		looked for in the slots of queue, and in those made since the call
 *		began (pgq_write_refresh_views) when it is not found; a work_queue
 *		row is deleted only when the parent, read by SQL, and then every
 *		partition the catalog lists, read whole, have no job row either
 *		(pgq_job_row_missing): a row "not found" in a view is not gone.
 *	 extend, ack, ack_batch, nack (jobs.c) find rows by primary key the
 *		same way; a row found moved by the scheduler (an UPDATE of its
 *		slot: a delete and an insert) is looked for again with a new
 *		snapshot under READ COMMITTED, and is a serialization failure
 *		(40001) under REPEATABLE READ and SERIALIZABLE, never a false.
 *		Once the work_queue row is deleted, a job row that cannot be found
 *		makes the call fail if the parent has it (nothing is left half
 *		done).
 *	 release, cancel, purge, retry, retry_failed, and a claim's steal of
 *		expired leases are SQL statements on the parents, whose partitions
 *		the planner reads at each statement; one that meets a row being
 *		moved fails with 40001, and runs again under READ COMMITTED
 *		(common.c, pgq_execute_moving).
 *	 the archive's upkeep (archive.c) changes only pgqueue.archive.
 *
 * Why no row is lost or hidden.  Rows are inserted only into a slot that
 * the call's view read after the lock names current: the lock is taken
 * before that view is read again, and a call that locks a slot after the
 * turn that made it live was sent (the scheduler's transaction ended)
 * sees it live and inserts elsewhere.  So once every transaction that
 * held a lock on a live slot at some look after that turn has ended, no
 * row can appear in it: the scheduler notes them (GetLockConflicts with
 * SHARE: every mode that may write) at a look that finds it empty, and
 * drains (stops visiting) it at a later look that finds them all ended
 * and it still empty (its rows may still be updated by others then: seen
 * by a snapshot as well as by SnapshotDirty, slot_settled_empty); or at
 * once when it has SHARE, which no writer of it holds, without waiting.  (It once drained under SHARE only: claims and
 * acks, which lock every live slot they visit, kept empty slots from
 * draining for as long as they came, and each slot kept live costs every
 * claim a probe.)  A
 * slot is truncated only under ACCESS EXCLUSIVE (taken without waiting)
 * after a look, under that lock, finds no row that any transaction could
 * still see as live (SnapshotDirty: rows whose insert or delete is in
 * progress count as live); should it find one all the same, the slot
 * becomes live again (logged: it cannot happen).
 *
 * Why no snapshot sees rows vanish (TRUNCATE is not MVCC-safe: a snapshot
 * taken before it that reads the table afterwards finds it empty).  A
 * slot's rows were all inserted after it became current (made_xmin[], the
 * xmin of the transaction that made it current: every snapshot taken
 * later has an xmin at least that) and all deleted before it was found
 * empty (D).  A snapshot taken before it became current sees none of its
 * rows; one taken after D sees them all deleted; only one taken in
 * between can see some.  So at D the scheduler notes the backends whose
 * xmin is not older than made_xmin, and truncates once they have all
 * ended.  A backend whose xmin is older took its oldest snapshot before:
 * a statement of its own that reads the slot took its locks on it before
 * its snapshot (the planner locks every partition), so the truncation
 * waits for it all the same (not so a statement in a STABLE function, run
 * on its caller's snapshot: docs/internals.md says so; pgq_stats is VOLATILE and
 * takes its own); but a pgqueue call opens slots after it took its
 * snapshot, and a backend with an old snapshot (a worker function
 * holding its statement's, a cursor) may make calls with new ones: the
 * calls under way at D are noted too, each waited for to its end
 * (shmem.c, "Calls under way").  A REPEATABLE READ transaction open across many turns of the
 * ring (the long snapshot that holds VACUUM back) is older than every slot
 * made current after it began, and holds up none of them.  When made_xmin
 * is not known (slot 0, or slots made current before the scheduler
 * started), every backend with a snapshot at D is waited for.  A hot
 * standby's snapshots are known only as the oldest xmin it reports with
 * hot_standby_feedback: a slot is truncated once that is at least the next
 * xid at D (waits_over), and the truncation is preceded in the WAL by a
 * recovery conflict that cancels, on a standby, every snapshot older than
 * that xid which the primary did not know of (pgq_standby_conflict:
 * without feedback, or after a crash set a replication slot's xmin back).
 * Such a snapshot, older than the call's view,
 * may see rows in a drained slot: under REPEATABLE READ and SERIALIZABLE
 * the view has the drained slots too, so a call finds the rows its
 * snapshot sees, and a row moved or deleted since is a clean 40001.
 *
 * What pg_dump and a restore see.  Slots are made at run time as tables
 * attached to the parents, not members of the extension: pg_dump dumps
 * them with their rows and pgqueue.slots with their states.  A free slot
 * the ring no longer needs is not dropped: pg_dump reads the catalog with
 * its snapshot and LOCKs each table it dumps by name afterwards, and a
 * DROP in between fails it.  It is retired (retire.c): detached and made
 * a member of the extension, which pg_dump neither dumps nor locks, and
 * dropped once no snapshot from before that is left.
 *
 * Layer 3 of src/README (storage): it may call the other files of its
 * layer, those of shared memory and wake-ups (shmem.c, publish.c,
 * bounds.c), and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "storage.h"

/* pgqueue.slot_size: a new current slot when the current one is this big */
int			pgqueue_slot_size_kb = 1024;

/*
 * Slots a ring grows to as a rule (PGQ_MAX_SLOTS: while readers pin some),
 * and the free slots it keeps: more are retired (pgq_ring_shrink).
 */
#define PGQ_RING_SLOTS 32
#define PGQ_FREE_RESERVE 2
/* How often the scheduler looks at the ring, at most. */
#define PGQ_RING_MAINTAIN_USECS (100 * 1000)
/*
 * A free slot's statistics, set right: from this long after its TRUNCATE
 * until this long after it (see stats_settle).
 */
#define PGQ_STATS_SETTLE_USECS (1500 * 1000)
#define PGQ_STATS_WATCH_USECS (15 * 1000 * 1000)

typedef enum SlotState
{
	SLOT_CURRENT = 'c',
	SLOT_LIVE = 'l',
	SLOT_DRAINED = 'd',
	SLOT_FREE = 'f'
} SlotState;

/* One partition of a parent, as the ring's last committed state says. */
typedef struct RingSlot
{
	int32		slot;
	Oid			relid;
	char		state;
	TimestampTz since;			/* when it last became current */
	TimestampTz low;			/* no row has an older created (see view) */
	bool		has_row;		/* pgqueue.slots has a row of it */
} RingSlot;

typedef struct Ring
{
	int			n;
	RingSlot	slots[PGQ_MAX_SLOTS];
	int			current;		/* index in slots[] */
} Ring;

/*
 * The views of "queue" [0] and "work_queue" [1], until an invalidation:
 * the slots calls visit under READ COMMITTED (view), and with the drained
 * ones too, for a transaction snapshot (xact_view; see the rule above).
 */
typedef struct RingCache
{
	bool		valid;
	Oid			parent;
	PgqRingView view;
	PgqRingView xact_view;
} RingCache;

static RingCache ring_cache[2];
static bool ring_cache_registered = false;
static uint64 ring_invals = 0;	/* invalidations seen, for the loads */

/* The two rings: queue's [0], work_queue's [1]. */
#define RING_QUEUE 0
#define RING_WORK 1
static const char *const ring_names[2] = {"queue", "work_queue"};

/* The scheduler's notes (pgq_ring_maintain), by ring and slot number. */
typedef struct RingNotes
{
	Oid			parent;
	TransactionId made_xmin[PGQ_MAX_SLOTS];
	VirtualTransactionId *waits[PGQ_MAX_SLOTS];
	uint32	   *calls[PGQ_MAX_SLOTS];	/* per wait: a call's mark, or 0 */
	int			nwaits[PGQ_MAX_SLOTS];
	bool		waits_noted[PGQ_MAX_SLOTS];
	TransactionId next_xid[PGQ_MAX_SLOTS];	/* the next xid when noted */
	TimestampTz truncated[PGQ_MAX_SLOTS];	/* free since; 0: not watched */
	/* a live slot found empty: the transactions that held a lock on it then */
	VirtualTransactionId *lockers[PGQ_MAX_SLOTS];
	int			nlockers[PGQ_MAX_SLOTS];
	bool		lockers_noted[PGQ_MAX_SLOTS];
} RingNotes;

static RingNotes ring_notes[2];
static TimestampTz next_maintain = 0;
static bool full_wanted = false;	/* a current slot is full: look at once */
static bool shrink_wanted[2];	/* a ring has more free slots than it keeps */
static bool stats_flush_wanted = false; /* a slot's counts zeroed: flush them */
static TimestampTz next_shrink = 0;

static const char *
state_name(char state)
{
	switch (state)
	{
		case SLOT_CURRENT:
			return "current";
		case SLOT_LIVE:
			return "live";
		case SLOT_DRAINED:
			return "drained";
		default:
			return "free";
	}
}

static void
ring_cache_callback(Datum arg, Oid relid)
{
	int			i;

	ring_invals++;
	for (i = 0; i < lengthof(ring_cache); i++)
		if (!OidIsValid(relid) || relid == ring_cache[i].parent)
			ring_cache[i].valid = false;
}

/*
 * Read the ring of parent (pgqueue.name, locked by the caller) from its
 * partitions and pgqueue.slots, as a snapshot taken now sees them.
 */
static void
ring_load(Oid nsp, Oid parent, const char *name, Ring *ring)
{
	Relation	rel;
	PartitionDesc pd;
	Oid			slots_relid;
	int			i;

	ring->n = 0;
	ring->current = -1;
	if (get_rel_relkind(parent) != RELKIND_PARTITIONED_TABLE)
	{
		/* 1.0: the table is the one slot */
		ring->n = 1;
		ring->current = 0;
		ring->slots[0].slot = 0;
		ring->slots[0].relid = parent;
		ring->slots[0].state = SLOT_CURRENT;
		ring->slots[0].since = DT_NOBEGIN;
		ring->slots[0].low = DT_NOBEGIN;
		ring->slots[0].has_row = false;
		return;
	}

	/* the relcache holds the bounds, parsed: a LIST bound is one datum */
	rel = table_open(parent, NoLock);
	pd = RelationGetPartitionDesc(rel, true);
	for (i = 0; pd->boundinfo != NULL && i < pd->boundinfo->ndatums; i++)
	{
		RingSlot   *s;

		if (pd->boundinfo->indexes[i] < 0)
			continue;
		if (ring->n == PGQ_MAX_SLOTS)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("relation \"pgqueue.%s\" has more than %d partitions", name,
							PGQ_MAX_SLOTS),
					 errhint("Partitions of pgqueue's tables are made by its scheduler only.")));
		s = &ring->slots[ring->n++];
		s->slot = DatumGetInt32(pd->boundinfo->datums[i][0]);
		s->relid = pd->oids[pd->boundinfo->indexes[i]];
		s->state = SLOT_LIVE;
		s->since = DT_NOBEGIN;
		s->low = DT_NOBEGIN;
		s->has_row = false;
	}
	table_close(rel, NoLock);
	if (ring->n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relation \"pgqueue.%s\" has no partition", name),
				 errhint("Reinstall the extension: DROP EXTENSION pgqueue; CREATE EXTENSION pgqueue;")));

	/* the states, from pgqueue.slots (tbl, slot, state, since, low) */
	slots_relid = get_relname_relid("slots", nsp);
	if (OidIsValid(slots_relid))
	{
		Relation	srel = table_open(slots_relid, AccessShareLock);
		TupleDesc	desc = RelationGetDescr(srel);
		Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
		TableScanDesc scan = table_beginscan(srel, snap, 0, NULL);
		HeapTuple	tup;

		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull[5];
			Datum		d[5];
			char	   *state;

			heap_deform_tuple(tup, desc, d, isnull);
			if (isnull[0] || isnull[1] || isnull[2] ||
				strcmp(TextDatumGetCString(d[0]), name) != 0)
				continue;
			for (i = 0; i < ring->n; i++)
				if (ring->slots[i].slot == DatumGetInt32(d[1]))
					break;
			if (i == ring->n)
				continue;		/* a row of a slot that is not attached */
			state = TextDatumGetCString(d[2]);
			ring->slots[i].has_row = true;
			ring->slots[i].state = state[0] == 'c' ? SLOT_CURRENT :
				state[0] == 'd' ? SLOT_DRAINED :
				state[0] == 'f' ? SLOT_FREE : SLOT_LIVE;
			if (!isnull[3])
				ring->slots[i].since = DatumGetTimestampTz(d[3]);
			ring->slots[i].low = ring->slots[i].since;
			if (desc->natts >= 5 && !isnull[4] &&
				DatumGetTimestampTz(d[4]) < ring->slots[i].low)
				ring->slots[i].low = DatumGetTimestampTz(d[4]);
		}
		table_endscan(scan);
		UnregisterSnapshot(snap);
		table_close(srel, AccessShareLock);
	}

	/* the current slot: the latest made current; else slot 0, else the first */
	for (i = 0; i < ring->n; i++)
		if (ring->slots[i].state == SLOT_CURRENT &&
			(ring->current < 0 || ring->slots[i].since > ring->slots[ring->current].since))
			ring->current = i;
	for (i = 0; ring->current < 0 && i < ring->n; i++)
		if (ring->slots[i].slot == 0)
			ring->current = i;
	if (ring->current < 0)
		ring->current = 0;
	for (i = 0; i < ring->n; i++)
		if (i != ring->current && ring->slots[i].state == SLOT_CURRENT)
			ring->slots[i].state = SLOT_LIVE;
	ring->slots[ring->current].state = SLOT_CURRENT;
}

/* Append the slots of ring in state state to view v, newest first. */
static void
view_add(PgqRingView *v, const Ring *ring, char state)
{
	bool		taken[PGQ_MAX_SLOTS];
	int			i;

	memset(taken, 0, sizeof(taken));
	for (;;)
	{
		int			best = -1;

		for (i = 0; i < ring->n; i++)
			if (!taken[i] && ring->slots[i].state == state &&
				(best < 0 || ring->slots[i].since > ring->slots[best].since ||
				 (ring->slots[i].since == ring->slots[best].since &&
				  ring->slots[i].slot > ring->slots[best].slot)))
				best = i;
		if (best < 0)
			break;
		taken[best] = true;
		v->relid[v->n] = ring->slots[best].relid;
		v->slot[v->n] = ring->slots[best].slot;
		v->low[v->n] = ring->slots[best].low;
		v->since[v->n] = ring->slots[best].since;
		v->n++;
	}
}

/*
 * The slots of pgqueue.name (queue, work_queue) that a call visits, as the
 * ring's state committed so far says (the rule above): the current one
 * first, then the live ones, newest first, and under REPEATABLE READ or
 * SERIALIZABLE the drained ones after them.  Reads the invalidations sent
 * so far first, at every call, then locks the parent (ACCESS SHARE, to the
 * end of the transaction); the view is cached until an invalidation of the
 * parent.
 */
void
pgq_ring_view(Oid nsp, const char *name, PgqRingView *v)
{
	Oid			parent = pgq_relid(nsp, name);
	RingCache  *c = &ring_cache[strcmp(name, "work_queue") == 0 ? 1 : 0];

	if (!ring_cache_registered)
	{
		CacheRegisterRelcacheCallback(ring_cache_callback, (Datum) 0);
		ring_cache_registered = true;
	}

	/*
	 * Taking the lock reads the invalidations only when this transaction
	 * did not hold it yet: a call later in the same transaction would keep
	 * the view of its first call (a turn it did not see: rows looked for
	 * in the wrong slots, a push into a slot since freed).
	 */
	AcceptInvalidationMessages();
	LockRelationOid(parent, AccessShareLock);
	if (!c->valid || c->parent != parent)
	{
		Ring		ring;
		uint64		invals = ring_invals;

		c->valid = false;
		c->parent = parent;
		ring_load(nsp, parent, name, &ring);
		c->view.parent = parent;
		c->view.n = 1;
		c->view.relid[0] = ring.slots[ring.current].relid;
		c->view.slot[0] = ring.slots[ring.current].slot;
		c->view.low[0] = ring.slots[ring.current].low;
		c->view.since[0] = ring.slots[ring.current].since;
		view_add(&c->view, &ring, SLOT_LIVE);
		c->xact_view = c->view;
		view_add(&c->xact_view, &ring, SLOT_DRAINED);
		/* valid unless an invalidation was read while loading */
		c->valid = (invals == ring_invals);
	}
	*v = IsolationUsesXactSnapshot() ? c->xact_view : c->view;
}

/* ----------------------------------------------------------------
 * Turning the ring (the scheduler)
 * ----------------------------------------------------------------
 */

/*
 * The rows of relid that some transaction may still see as live, counted
 * up to max + 1 (SnapshotDirty: pgq_rel_rows).  0: the slot is empty.
 */
static int
slot_rows(Oid relid, int max)
{
	return pgq_rel_rows(relid, NULL, NULL, NULL, max);
}

/*
 * Whether live slot relid is empty for good, once every transaction that
 * may still insert into it has ended (lockers_over), without a lock that
 * keeps others from updating its rows meanwhile: the dirty scan alone can
 * miss a row that such an update moves behind it, a snapshot taken before
 * it still sees the old version (pgq_rel_rows).
 */
static bool
slot_settled_empty(Oid relid)
{
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	bool		empty = (pgq_rel_rows(relid, snap, NULL, NULL, 0) == 0);

	UnregisterSnapshot(snap);
	return empty;
}

/* Whether the slot relid has grown to pgqueue.slot_size. */
static bool
slot_full(Oid relid)
{
	Relation	rel = table_open(relid, AccessShareLock);
	bool		full = (int64) RelationGetNumberOfBlocks(rel) * BLCKSZ >=
		(int64) pgqueue_slot_size_kb * 1024;

	table_close(rel, NoLock);
	return full;
}

/*
 * Note, at the moment slot s is found empty, the backends whose snapshot
 * may have been taken after it became current (see the file's header):
 * those whose xmin is not older than made_xmin, waited for to the end of
 * their transaction, and of the others, whose oldest snapshot is older,
 * those in a pgqueue call, waited for to the end of that call (its
 * snapshots may be newer: shmem.c, "Calls under way").
 */
static void
note_waits(RingNotes *rn, int32 s)
{
	VirtualTransactionId *all;
	VirtualTransactionId *older = NULL;
	int			nall;
	int			nolder = 0;
	int			i;
	int			j;
	int			n = 0;

	/* VACUUM's snapshot reads no row it returns: not waited for */
	all = GetCurrentVirtualXIDs(InvalidTransactionId, true, false, PROC_IN_VACUUM, &nall);
	if (TransactionIdIsValid(rn->made_xmin[s]))
	{
		TransactionId limit = rn->made_xmin[s];

		/* those whose xmin precedes made_xmin: taken before it was current */
		TransactionIdRetreat(limit);
		older = GetCurrentVirtualXIDs(limit, true, false, PROC_IN_VACUUM, &nolder);
	}
	if (rn->waits[s] != NULL)
		pfree(rn->waits[s]);
	if (rn->calls[s] != NULL)
		pfree(rn->calls[s]);
	rn->waits[s] = MemoryContextAlloc(TopMemoryContext,
									  sizeof(VirtualTransactionId) * Max(nall, 1));
	rn->calls[s] = MemoryContextAlloc(TopMemoryContext, sizeof(uint32) * Max(nall, 1));
	for (i = 0; i < nall; i++)
	{
		bool		older_xmin = false;
		uint32		call = 0;

		for (j = 0; j < nolder && !older_xmin; j++)
			older_xmin = VirtualTransactionIdEquals(all[i], older[j]);
		if (older_xmin && (call = pgq_call_of(all[i])) == 0)
			continue;			/* its snapshots are all older than the slot */
		rn->waits[s][n] = all[i];
		rn->calls[s][n++] = call;
	}
	rn->nwaits[s] = n;
	rn->next_xid[s] = ReadNextTransactionId();
	rn->waits_noted[s] = true;
}

/*
 * Whether every backend noted for slot s has ended its transaction, and no
 * standby may still see its rows: the oldest xmin a standby reports with
 * hot_standby_feedback is at least the next xid when the slot was found
 * empty (a snapshot with such an xmin sees every delete of its rows
 * committed; retire.c).  Without hot_standby_feedback a standby reports
 * nothing: docs/operations.md ("Hot standbys") says what its readers may see.
 */
static bool
waits_over(RingNotes *rn, int32 s)
{
	int			i;

	if (!rn->waits_noted[s])
		note_waits(rn, s);
	for (i = 0; i < rn->nwaits[s]; i++)
	{
		if (rn->calls[s][i] != 0)
		{
			/* a call's snapshots are gone with it */
			if (pgq_call_of(rn->waits[s][i]) == rn->calls[s][i])
				return false;
		}
		else if (!VirtualXactLock(rn->waits[s][i], false))
			return false;
	}
	return !pgq_standby_snapshots_before(rn->next_xid[s]);
}

/*
 * Note the transactions that hold a lock on live slot s now (any mode but
 * ACCESS SHARE: those that may write it), for lockers_over.
 */
static void
note_lockers(RingNotes *rn, const RingSlot *s)
{
	LOCKTAG		tag;
	VirtualTransactionId *v;
	int			n;

	SET_LOCKTAG_RELATION(tag, MyDatabaseId, s->relid);
	v = GetLockConflicts(&tag, ShareLock, &n);
	if (rn->lockers[s->slot] != NULL)
		pfree(rn->lockers[s->slot]);
	rn->lockers[s->slot] = MemoryContextAlloc(TopMemoryContext,
											  sizeof(VirtualTransactionId) * Max(n, 1));
	memcpy(rn->lockers[s->slot], v, sizeof(VirtualTransactionId) * n);
	rn->nlockers[s->slot] = n;
	rn->lockers_noted[s->slot] = true;
}

/* Whether every transaction noted by note_lockers for slot s has ended. */
static bool
lockers_over(RingNotes *rn, int32 s)
{
	int			i;

	for (i = 0; i < rn->nlockers[s]; i++)
		if (!VirtualXactLock(rn->lockers[s][i], false))
			return false;
	return true;
}

/* Record slot s's state in pgqueue.slots (since: now, when it is current). */
static void
set_state(const char *name, RingSlot *s, char state)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {TEXTOID, INT4OID, TEXTOID};
	Datum		args[3];

	args[0] = CStringGetTextDatum(name);
	args[1] = Int32GetDatum(s->slot);
	args[2] = CStringGetTextDatum(state_name(state));
	/*
	 * A slot's first row says since = -infinity unless it becomes current:
	 * the slot that stops being current (slot 0 at the first turn) was
	 * current before the new one (the straggler moves look at which slot
	 * replaced which).
	 */
	if (SPI_execute_plan(pgq_keep_plan(&plan,
									   "INSERT INTO pgqueue.slots AS s (tbl, slot, state, since)"
									   " VALUES ($1, $2, $3, CASE WHEN $3 = 'current'"
									   "   THEN pg_catalog.now() ELSE '-infinity' END)"
									   " ON CONFLICT (tbl, slot) DO UPDATE"
									   "   SET state = excluded.state,"
									   "       since = CASE WHEN excluded.state = 'current'"
									   "               THEN pg_catalog.now() ELSE s.since END,"
									   "       low = CASE WHEN excluded.state = 'current'"
									   "             THEN NULL ELSE s.low END",
									   3, types),
						 args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the state of slot %d of pgqueue.%s", s->slot, name);
	s->state = state;
}

/* Run one statement of DDL through SPI (as pgqueue's own: pgq_spi_ddl). */
static void
ring_ddl(const char *sql)
{
	if (pgq_spi_ddl(sql) != SPI_OK_UTILITY)
		elog(ERROR, "could not run \"%s\"", sql);
}

/*
 * Make slot s of ring r: a table like the parent with its own primary key
 * and indexes, named after it as pgqueue--1.1.sql (and --1.1--1.2.sql)
 * names slot 0's (a slot
 * of queue after 0 has no dedup index: jobs with a dedup_key go to slot 0
 * and stay there), then attached (SHARE UPDATE EXCLUSIVE on the parent:
 * calls go on).  Not a member of the extension: pg_dump dumps it with its
 * rows and its attachment, as the archive's partitions.  Returns its OID.
 */
/*
 * The CREATE INDEX of slot pgqueue.<slot>'s group_idx (1.2): the jobs of
 * each group of a queue, those in flight (scheduled, retry) first, then the
 * pending ones in the order they run (schedule.c, the walk of a queue's
 * groups).  As pgqueue--1.1--1.2.sql makes it in the slots it finds.
 */
char *
pgq_group_index_ddl(const char *slot)
{
	return psprintf("CREATE INDEX %s ON pgqueue.%s"
					" (queue, group_key, (state = 'pending'),"
					" (-(priority::bigint)), run_after, id)"
					" WHERE group_key IS NOT NULL"
					" AND state IN ('pending', 'retry', 'scheduled')",
					quote_identifier(psprintf("%s_group_idx", slot)),
					quote_identifier(slot));
}

static Oid
make_slot(Oid nsp, int r, int32 s)
{
	const char *parent = ring_names[r];
	char	   *t = psprintf("%s_%d", parent, s);
	const char *qt = quote_identifier(t);
	bool		v12 = get_attnum(pgq_relid(nsp, parent), "max_tries") != InvalidAttrNumber;

	ring_ddl(psprintf("CREATE TABLE pgqueue.%s (LIKE pgqueue.%s INCLUDING DEFAULTS)"
					  " WITH (fillfactor = %d)", qt, parent, r == RING_WORK ? 70 : 80));
	ring_ddl(psprintf("ALTER TABLE pgqueue.%s ADD CONSTRAINT %s PRIMARY KEY (id)",
					  qt, quote_identifier(psprintf("%s_pkey", t))));
	if (r == RING_WORK)
	{
		ring_ddl(psprintf("CREATE INDEX %s ON pgqueue.%s (created, batch_order)"
						  " WHERE lock_timeout IS NULL",
						  quote_identifier(psprintf("%s_ready_idx", t)), qt));
		ring_ddl(psprintf("CREATE INDEX %s ON pgqueue.%s (queue, created, batch_order)"
						  " WHERE lock_timeout IS NULL",
						  quote_identifier(psprintf("%s_queue_ready_idx", t)), qt));
		ring_ddl(psprintf("CREATE INDEX %s ON pgqueue.%s (lock_timeout)"
						  " WHERE lock_timeout IS NOT NULL",
						  quote_identifier(psprintf("%s_lease_idx", t)), qt));
	}
	else
	{
		ring_ddl(psprintf("CREATE INDEX %s ON pgqueue.%s"
						  " (queue, (-(priority::bigint)), run_after, id)"
						  " WHERE state IN ('pending', 'retry')",
						  quote_identifier(psprintf("%s_ready_idx", t)), qt));
		ring_ddl(psprintf("CREATE INDEX %s ON pgqueue.%s (queue) WHERE state = 'scheduled'",
						  quote_identifier(psprintf("%s_scheduled_idx", t)), qt));
		/* 1.2: failed jobs page by (queue, id) (pgqueue--1.1--1.2.sql) */
		ring_ddl(psprintf("CREATE INDEX %s ON pgqueue.%s (queue%s) WHERE state = 'failed'",
						  quote_identifier(psprintf("%s_failed_idx", t)), qt,
						  v12 ? ", id" : ""));
		/* 1.2: the jobs of each group, in flight first (pgqueue--1.1--1.2.sql) */
		if (get_attnum(pgq_relid(nsp, parent), "group_key") != InvalidAttrNumber)
			ring_ddl(pgq_group_index_ddl(t));
	}
	ring_ddl(psprintf("ALTER TABLE pgqueue.%s ATTACH PARTITION pgqueue.%s"
							  " FOR VALUES IN (%d)", parent, qt, s));
	return get_relname_relid(t, nsp);
}

/*
 * Lock the parent of ring r in mode (ACCESS EXCLUSIVE: only when had at
 * once, never waiting) and load its ring.  Returns the parent's OID, or
 * InvalidOid when the lock was not had.
 */
static Oid
ring_open(int r, LOCKMODE mode, Ring *ring)
{
	Oid			nsp = get_namespace_oid("pgqueue", false);
	Oid			parent = pgq_relid(nsp, ring_names[r]);

	if (mode != AccessExclusiveLock)
		LockRelationOid(parent, mode);
	else if (!ConditionalLockRelationOid(parent, mode))
		return InvalidOid;
	ring_load(nsp, parent, ring_names[r], ring);
	return parent;
}

/*
 * Whether s is a free slot that a ring may reuse or retire: one of its
 * numbered slots (not slot 0, the extension's, nor a partition of someone
 * else's numbering).
 */
static bool
slot_is_free(const RingSlot *s)
{
	return s->state == SLOT_FREE && s->slot > 0 && s->slot < PGQ_MAX_SLOTS;
}

/* The free slots of ring. */
static int
ring_nfree(const Ring *ring)
{
	int			n = 0;
	int			i;

	for (i = 0; i < ring->n; i++)
		if (slot_is_free(&ring->slots[i]))
			n++;
	return n;
}

/*
 * Set right the statistics of free slot s, truncated a moment ago.  A
 * TRUNCATE sets a table's live and dead row counts to zero when it
 * commits, but the counts of other backends' deletes and updates that they
 * had not yet flushed then (a busy backend flushes at most once a second,
 * an idle one within ten seconds) are added afterwards: an emptied slot
 * would show the dead rows of its last second of use until it is truncated
 * again, one more ring turn later, in pg_stat_user_tables and to
 * autovacuum.  From PGQ_STATS_SETTLE_USECS after the TRUNCATE until
 * PGQ_STATS_WATCH_USECS after it, at each look at the ring, a slot whose
 * counts are not zero is counted as truncated again (pgstat_count_truncate: its live and dead
 * counts set to zero when this transaction's statistics are flushed; the
 * cumulative counts of inserts, updates and deletes are kept) if, under
 * ACCESS EXCLUSIVE, it has no page.
 */
static void
stats_settle(RingNotes *rn, const RingSlot *s, TimestampTz now)
{
	PgStat_StatTabEntry *st;
	Relation	rel;

	if (now >= rn->truncated[s->slot] + PGQ_STATS_WATCH_USECS)
	{
		rn->truncated[s->slot] = 0;
		return;
	}
	if (now < rn->truncated[s->slot] + PGQ_STATS_SETTLE_USECS)
		return;
	st = pgstat_fetch_stat_tabentry(s->relid);
	if (st == NULL || (pgq_tabentry_live_tuples(st) == 0 && pgq_tabentry_dead_tuples(st) == 0))
		return;
	if (!ConditionalLockRelationOid(s->relid, AccessExclusiveLock))
		return;
	rel = table_open(s->relid, NoLock);
	if (RelationGetNumberOfBlocks(rel) == 0)
	{
		pgstat_count_truncate(rel);
		stats_flush_wanted = true;
	}
	table_close(rel, NoLock);
}

/*
 * Whether this transaction zeroed the row counts of a slot (a TRUNCATE, or
 * stats_settle): if so the scheduler flushes its statistics as soon as the
 * transaction has committed (pgstat_report_stat(true)), not up to a second
 * later.  A later transaction of the same backend that writes the slot
 * before that flush would undo the zeroing: PostgreSQL keeps one "truncated"
 * mark per table among the counts a backend has not flushed, and each
 * transaction that commits a change to the table sets it to its own
 * (AtEOXact_PgStat_Relations), so that the slot would go on counting the
 * dead rows of its former turns.  Reset by the call.
 */
bool
pgq_ring_stats_flush_wanted(void)
{
	bool		wanted = stats_flush_wanted;

	stats_flush_wanted = false;
	return wanted;
}

/*
 * Truncate drained slot s of pgqueue.name, if it may be: once no snapshot
 * that could see its rows is left (waits_over) and under ACCESS EXCLUSIVE
 * had at once; else it is not reusable now (*pinned counts it).  Returns
 * whether s changed state.
 */
static bool
ring_truncate_drained(RingNotes *rn, const char *name, RingSlot *s, TimestampTz now,
					  int *pinned)
{
	if (!waits_over(rn, s->slot) ||
		!ConditionalLockRelationOid(s->relid, AccessExclusiveLock))
	{
		(*pinned)++;
		return false;
	}
	if (slot_rows(s->relid, 0) > 0)
	{
		/* cannot happen (the rule above); never truncate rows */
		ereport(LOG,
				(errmsg("pgqueue: drained slot %d of pgqueue.%s has rows; it is live again",
						s->slot, name)));
		set_state(name, s, SLOT_LIVE);
		return true;
	}
	/* a standby snapshot older than the deletes: cancelled */
	{
		Relation	rel = relation_open(s->relid, NoLock);

		pgq_standby_conflict(rel, rn->next_xid[s->slot]);
		relation_close(rel, NoLock);
	}
	ring_ddl(psprintf("TRUNCATE pgqueue.%s",
					  quote_identifier(get_rel_name(s->relid))));
	set_state(name, s, SLOT_FREE);
	rn->waits_noted[s->slot] = false;
	rn->made_xmin[s->slot] = InvalidTransactionId;
	rn->truncated[s->slot] = now;
	stats_flush_wanted = true;
	return true;
}

/*
 * Mark live slot s of pgqueue.name drained if it is empty for good: found
 * empty after every transaction that held a lock on it at an earlier look
 * has ended (or under SHARE, had at once, which none holds): see "Why no
 * row is lost".  Returns whether it was drained.
 */
static bool
ring_drain_if_empty(RingNotes *rn, const char *name, RingSlot *s)
{
	bool		drain = false;

	if (slot_rows(s->relid, 0) > 0)
		rn->lockers_noted[s->slot] = false;
	else if (ConditionalLockRelationOid(s->relid, ShareLock))
		drain = (slot_rows(s->relid, 0) == 0);	/* no writer: exact */
	else if (!rn->lockers_noted[s->slot])
		note_lockers(rn, s);
	else if (lockers_over(rn, s->slot))
		drain = slot_settled_empty(s->relid);
	if (drain)
	{
		set_state(name, s, SLOT_DRAINED);
		note_waits(rn, s->slot);
		rn->lockers_noted[s->slot] = false;
	}
	return drain;
}

/*
 * The free slot of ring to make current: one that no one has locked
 * (ACCESS EXCLUSIVE, had at once), or NULL.  A transaction that read the
 * parent holds a lock on every slot it had then, until it ends, and one of
 * those filled again could not be truncated before that.  The one
 * truncated longest ago first (truncated[] is 0 once it is no longer
 * watched): its statistics are settled (stats_settle).  *pinned counts
 * the free slots passed over because another transaction holds a lock.
 */
static RingSlot *
ring_free_slot(Ring *ring, RingNotes *rn, int *pinned)
{
	bool		tried[PGQ_MAX_SLOTS] = {0};
	int			i;

	for (;;)
	{
		RingSlot   *oldest = NULL;

		for (i = 0; i < ring->n; i++)
		{
			RingSlot   *f = &ring->slots[i];

			if (slot_is_free(f) && !tried[i] &&
				(oldest == NULL || rn->truncated[f->slot] < rn->truncated[oldest->slot]))
				oldest = f;
		}
		if (oldest == NULL)
			return NULL;
		tried[oldest - ring->slots] = true;
		if (ConditionalLockRelationOid(oldest->relid, AccessExclusiveLock))
			return oldest;
		(*pinned)++;
	}
}

/*
 * Make a new slot of ring r (pgqueue.name, in namespace nsp) and add it to
 * ring, free: the lowest number not taken by a slot, nor by a table's
 * name.  NULL when every number below PGQ_MAX_SLOTS is taken.
 */
static RingSlot *
ring_new_slot(Oid nsp, int r, const char *name, Ring *ring)
{
	RingSlot   *next = NULL;
	int32		s;
	int			i;

	/* the lowest number not taken by a slot, nor by a table's name */
	for (s = 1; s < PGQ_MAX_SLOTS; s++)
	{
		for (i = 0; i < ring->n && ring->slots[i].slot != s; i++)
			;
		if (i == ring->n &&
			!OidIsValid(get_relname_relid(psprintf("%s_%d", name, s), nsp)))
			break;
	}
	if (s < PGQ_MAX_SLOTS)
	{
		next = &ring->slots[ring->n++];
		next->slot = s;
		next->relid = make_slot(nsp, r, s);
		next->state = SLOT_FREE;
	}
	return next;
}

/*
 * One look at a ring (*arg: RING_QUEUE, RING_WORK): truncate the drained
 * slots that may be, mark drained the live ones found empty, and make a
 * new slot current when the current one has grown to pgqueue.slot_size.
 * Slot 0 is never truncated nor current again once another slot was
 * (see the file's header); queue's is never drained, work_queue's is,
 * once empty for good, and stays drained.
 */
static void
ring_turn(void *arg)
{
	int			r = *(int *) arg;
	const char *name = ring_names[r];
	RingNotes  *rn = &ring_notes[r];
	Oid			nsp = get_namespace_oid("pgqueue", false);
	Ring		ring;
	Oid			parent = ring_open(r, AccessShareLock, &ring);
	RingSlot   *cur = &ring.slots[ring.current];
	bool		changed = false;
	int			pinned = 0;		/* drained or free slots not reusable now */
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	if (parent != rn->parent)
	{
		/* the extension was made again, or a restore: forget the notes */
		rn->parent = parent;
		for (i = 0; i < PGQ_MAX_SLOTS; i++)
		{
			rn->made_xmin[i] = InvalidTransactionId;
			rn->waits_noted[i] = false;
			rn->lockers_noted[i] = false;
			rn->truncated[i] = 0;
		}
	}
	SPI_connect();

	for (i = 0; i < ring.n; i++)
	{
		RingSlot   *s = &ring.slots[i];

		if (s->slot < 0 || s->slot >= PGQ_MAX_SLOTS)
			continue;			/* not one of ours */
		if (s->slot == 0)
		{
			/*
			 * The extension's, a member of it: never truncated (pg_dump
			 * -j's workers lock it without waiting, and fail the dump if
			 * it is taken).  queue's holds the jobs with a dedup_key:
			 * live for good.  work_queue's is never current again once
			 * another slot was: once empty for good it is drained as the
			 * others are, so that claims stop walking it, and stays so.
			 */
			if (r == RING_WORK && s->state == SLOT_LIVE && s->has_row &&
				ring_drain_if_empty(rn, name, s))
				changed = true;
			else if (r == RING_WORK && s->state == SLOT_DRAINED &&
					 slot_rows(s->relid, 0) > 0)
			{
				/*
				 * Rows no call of the API writes there: a restore's (its
				 * pgqueue.slots, which says drained, loaded after a
				 * pgq_schedule() put rows into slot 0, then current for
				 * want of a row that said otherwise), or written by hand.
				 * Visited again, the straggler moves take them out.
				 */
				ereport(LOG,
						(errmsg("pgqueue: drained slot 0 of pgqueue.%s has rows; it is live again",
								name)));
				set_state(name, s, SLOT_LIVE);
				changed = true;
			}
			continue;
		}
		if (s->state == SLOT_DRAINED)
		{
			if (ring_truncate_drained(rn, name, s, now, &pinned))
				changed = true;
		}
		else if (s->state == SLOT_FREE && rn->truncated[s->slot] != 0)
			stats_settle(rn, s, now);
		else if (s->state == SLOT_LIVE && s->has_row)
		{
			/*
			 * A slot without a row in pgqueue.slots is not one this ring
			 * made (a restore's, whose rows and states may still be on
			 * their way): left live.
			 */
			if (ring_drain_if_empty(rn, name, s))
				changed = true;
		}
	}

	/* time for a new current slot? */
	if (slot_full(cur->relid))
	{
		RingSlot   *next = ring_free_slot(&ring, rn, &pinned);

		/*
		 * A new slot: up to PGQ_RING_SLOTS, or PGQ_MAX_SLOTS while slots
		 * that hold no rows cannot be reused (a reader of the parent locked
		 * them, or its snapshot can see their rows): else a transaction
		 * that read the parent when the ring was full would stop it until
		 * it ended.  A backlog alone (every slot live) stops at
		 * PGQ_RING_SLOTS: the current slot grows past pgqueue.slot_size.
		 */
		if (next == NULL && ring.n < (pinned > 0 ? PGQ_MAX_SLOTS : PGQ_RING_SLOTS))
			next = ring_new_slot(nsp, r, name, &ring);
		if (next != NULL)
		{
			set_state(name, cur, SLOT_LIVE);
			set_state(name, next, SLOT_CURRENT);
			rn->made_xmin[next->slot] = GetActiveSnapshot()->xmin;
			rn->waits_noted[next->slot] = false;
			rn->lockers_noted[next->slot] = false;
			rn->truncated[next->slot] = 0;
			changed = true;
		}
	}
	SPI_finish();
	if (changed)
		CacheInvalidateRelcacheByRelid(parent);

	shrink_wanted[r] = ring_nfree(&ring) > PGQ_FREE_RESERVE;
}

/*
 * Retire the free slots of ring *arg beyond PGQ_FREE_RESERVE, the highest
 * numbers first (retire.c: detached and made members of the extension at
 * once, dropped once no snapshot from before is left, so that no pg_dump
 * fails on them).  A transaction that reads the parent locks every slot
 * that exists then, until it ends, and the ring cannot reuse those: the
 * fewer slots are attached, the fewer it pins.  Detaching a partition
 * takes ACCESS EXCLUSIVE on the parent, which every call holds a weaker
 * lock on for its transaction: only when that is had at once (never
 * waiting, so no call queues behind it), in a transaction of its own that
 * ends at once.
 */
static void
ring_shrink(void *arg)
{
	int			r = *(int *) arg;
	const char *name = ring_names[r];
	RingNotes  *rn = &ring_notes[r];
	Ring		ring;
	Oid			parent = ring_open(r, AccessExclusiveLock, &ring);
	int			nfree;
	int			i;

	if (!OidIsValid(parent))
		return;					/* in use: tried again later */
	nfree = ring_nfree(&ring);

	SPI_connect();
	while (nfree > PGQ_FREE_RESERVE)
	{
		RingSlot   *s = NULL;
		Oid			types[2] = {TEXTOID, INT4OID};
		Datum		args[2];

		/* the highest first (slot 0 is never free: slot_is_free) */
		for (i = 0; i < ring.n; i++)
			if (slot_is_free(&ring.slots[i]) &&
				(s == NULL || ring.slots[i].slot > s->slot))
				s = &ring.slots[i];
		if (s == NULL)
			break;
		nfree--;
		s->state = SLOT_LIVE;	/* not looked at again */

		/* free means truncated; a slot with rows is never retired */
		if (!ConditionalLockRelationOid(s->relid, AccessExclusiveLock) ||
			slot_rows(s->relid, 0) > 0)
			continue;
		pgq_retire_partition(parent, s->relid);
		args[0] = CStringGetTextDatum(name);
		args[1] = Int32GetDatum(s->slot);
		if (SPI_execute_with_args("DELETE FROM pgqueue.slots WHERE tbl = $1 AND slot = $2",
								  2, types, args, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not forget slot %d of pgqueue.%s", s->slot, name);
		rn->made_xmin[s->slot] = InvalidTransactionId;
		rn->waits_noted[s->slot] = false;
		rn->truncated[s->slot] = 0;
		ereport(DEBUG1,
				(errmsg_internal("retired free slot %d of pgqueue.%s", s->slot, name)));
	}
	SPI_finish();
	CacheInvalidateRelcacheByRelid(parent);
	shrink_wanted[r] = false;
}

/* Whether a ring has free slots to retire (pgq_ring_shrink), now. */
bool
pgq_ring_shrink_wanted(void)
{
	return (shrink_wanted[RING_QUEUE] || shrink_wanted[RING_WORK]) &&
		GetCurrentTimestamp() >= next_shrink;
}

/*
 * The scheduler's retirement of the free slots a ring has beyond those it
 * keeps (ring_shrink), in a transaction of its own, at most every
 * PGQ_RING_MAINTAIN_USECS.  As pgq_ring_maintain, never raises an error of
 * its own.
 */
void
pgq_ring_shrink(void)
{
	static int	rings[2] = {RING_QUEUE, RING_WORK};

	next_shrink = GetCurrentTimestamp() + PGQ_RING_MAINTAIN_USECS;
	if (pgq_layout() < PGQ_V11)
		return;
	if (shrink_wanted[RING_WORK])
		pgq_upkeep_try(ring_shrink, &rings[RING_WORK], "retire the free slots of pgqueue.work_queue",
					   "The scheduler tries again after a later pass.");
	if (shrink_wanted[RING_QUEUE])
		pgq_upkeep_try(ring_shrink, &rings[RING_QUEUE], "retire the free slots of pgqueue.queue",
					   "The scheduler tries again after a later pass.");
}

/* Most rows a slot may have left for them to be moved (straggler move). */
#define PGQ_MOVE_MAX_ROWS 100
/* How long a slot must have been out of use (not current), for a move. */
#define PGQ_MOVE_AGE_USECS (10 * USECS_PER_SEC)

/*
 * Whether live slot s of ring has rows to move (straggler moves): it
 * stopped being current (another slot was made current after it) before
 * old, and has 1 to PGQ_MOVE_MAX_ROWS rows left.
 */
static bool
slot_has_stragglers(Ring *ring, RingSlot *s, TimestampTz old)
{
	TimestampTz replaced = DT_NOEND;
	int			n;
	int			k;

	if (s->state != SLOT_LIVE)
		return false;
	for (k = 0; k < ring->n; k++)
		if (ring->slots[k].since > s->since && ring->slots[k].since < replaced)
			replaced = ring->slots[k].since;
	if (replaced > old)
		return false;
	n = slot_rows(s->relid, PGQ_MOVE_MAX_ROWS);
	return n > 0 && n <= PGQ_MOVE_MAX_ROWS;
}

/*
 * Run a move statement, an UPDATE of the parent that sets slot = $1 on the
 * rows of slot $2 (from) that no other transaction holds, and returns rows
 * (in SPI_tuptable).
 */
static void
ring_move_rows(const char *sql, int32 to, const char *name, int32 from)
{
	Datum		args[2] = {Int32GetDatum(to), Int32GetDatum(from)};
	Oid			argtypes[2] = {INT4OID, INT4OID};

	if (SPI_execute_with_args(sql, 2, argtypes, args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "could not move the rows of slot %d of pgqueue.%s", from, name);
	if (SPI_processed > 0)
		ereport(DEBUG1,
				(errmsg_internal("moved %d rows of slot %d of pgqueue.%s",
								 (int) SPI_processed, from, name)));
}

/*
 * The straggler moves the scheduler's last look at the rings planned
 * (ring_move_plan), for its next transaction (pgq_ring_move): the slots of
 * work_queue whose rows go to slot planned_to, and those of queue whose
 * rows go to slot 0.
 */
static int32 planned_to = -1;
static int	nplanned_work = 0;
static int32 planned_work[PGQ_MAX_SLOTS];
static int	nplanned_jobs = 0;
static int32 planned_jobs[PGQ_MAX_SLOTS];

/*
 * Straggler moves: rows that stay in an old slot (a long lease, a queue
 * whose workers stopped) would keep it from ever draining, and the ring
 * would grow.  The few rows left in a live slot that stopped being
 * current (another slot became current after it) more than
 * PGQ_MOVE_AGE_USECS ago are moved to the current slot (work_queue) or to
 * slot 0 (queue: ring_move_jobs), by an UPDATE of their slot through the
 * parent, which PostgreSQL carries out as a delete and an insert with the
 * same values (id, lease, tries, version).  A row another transaction
 * holds is left for a later look (FOR UPDATE SKIP LOCKED): a worker that
 * holds its job's row in an open transaction delays nothing.  An ack,
 * extend or nack that finds its row moved looks for it again (tables.c,
 * pgq_write_row); a claim that meets a row being moved skips it; a
 * statement on the parent that meets it fails with 40001, which
 * pgq_execute_moving retries under READ COMMITTED.  The rows keep their
 * keys, so the scan bounds are lowered to them at commit (bounds.c).
 *
 * The moves run in a transaction after the look that planned them: a row
 * moved into a slot made current in the same transaction would be seen by
 * a snapshot before the slot's turn is read from its invalidation (ring.c's
 * rule), and the current slot's low (no row older: claims begin its walk
 * there) is lowered to the moved rows' oldest by the look, before any of
 * them is moved.  Here, in the look: plan.
 */
static void
ring_move_plan(void *arg)
{
	TimestampTz old = GetCurrentTimestamp() - PGQ_MOVE_AGE_USECS;
	Ring		ring;
	Oid			parent;
	RingSlot   *cur;
	TimestampTz oldest = DT_NOEND;
	int32		work[PGQ_MAX_SLOTS];
	int32		jobs[PGQ_MAX_SLOTS];
	int			nwork = 0;
	int			njobs = 0;
	int			i;

	/* no plan unless this one is complete (an error leaves none) */
	nplanned_work = nplanned_jobs = 0;
	planned_to = -1;

	(void) ring_open(RING_QUEUE, AccessShareLock, &ring);
	for (i = 0; i < ring.n; i++)
		if (ring.slots[i].slot != 0 && slot_has_stragglers(&ring, &ring.slots[i], old))
			jobs[njobs++] = ring.slots[i].slot;

	parent = ring_open(RING_WORK, AccessShareLock, &ring);
	cur = &ring.slots[ring.current];
	SPI_connect();
	for (i = 0; i < ring.n; i++)
	{
		RingSlot   *s = &ring.slots[i];
		Oid			type = INT4OID;
		Datum		arg = Int32GetDatum(s->slot);
		bool		isnull;
		Datum		d;

		if (!slot_has_stragglers(&ring, s, old))
			continue;
		if (SPI_execute_with_args("SELECT min(w.created) FROM pgqueue.work_queue w WHERE w.slot = $1",
								  1, &type, &arg, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read the oldest row of slot %d of pgqueue.work_queue",
				 s->slot);
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull && DatumGetTimestampTz(d) < oldest)
			oldest = DatumGetTimestampTz(d);
		work[nwork++] = s->slot;
	}

	/* the current slot will hold rows older than it: claims must know first */
	if (oldest < cur->low)
	{
		Oid			types[2] = {INT4OID, TIMESTAMPTZOID};
		Datum		args[2];

		args[0] = Int32GetDatum(cur->slot);
		args[1] = TimestampTzGetDatum(oldest);
		if (SPI_execute_with_args("UPDATE pgqueue.slots"
								  "   SET low = LEAST(coalesce(low, since), $2)"
								  " WHERE tbl = 'work_queue' AND slot = $1",
								  2, types, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not record the oldest row of slot %d of pgqueue.work_queue",
				 cur->slot);
		CacheInvalidateRelcacheByRelid(parent);
	}
	SPI_finish();

	memcpy(planned_work, work, sizeof(int32) * nwork);
	nplanned_work = nwork;
	memcpy(planned_jobs, jobs, sizeof(int32) * njobs);
	nplanned_jobs = njobs;
	planned_to = cur->slot;
}

/* The straggler moves of work_queue that the last look planned. */
static void
ring_move(void *arg)
{
	Ring		ring;
	int			i;

	(void) ring_open(RING_WORK, AccessShareLock, &ring);
	if (ring.slots[ring.current].slot != planned_to)
		return;					/* the ring turned since: planned again */

	SPI_connect();
	for (i = 0; i < nplanned_work; i++)
	{
		uint64		j;
		TimestampTz ready = DT_NOEND;
		TimestampTz lease = DT_NOEND;

		ring_move_rows("UPDATE pgqueue.work_queue w SET slot = $1"
					   " WHERE w.slot = $2 AND w.id = ANY (ARRAY("
					   "   SELECT m.id FROM pgqueue.work_queue m WHERE m.slot = $2"
					   "      FOR UPDATE SKIP LOCKED))"
					   " RETURNING w.created, w.lock_timeout",
					   planned_to, "work_queue", planned_work[i]);
		for (j = 0; j < SPI_processed; j++)
		{
			bool		cnull;
			bool		lnull;
			TimestampTz c = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[j],
															  SPI_tuptable->tupdesc, 1, &cnull));
			TimestampTz l = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[j],
															  SPI_tuptable->tupdesc, 2, &lnull));

			if (lnull && c < ready)
				ready = c;
			if (!lnull && l < lease)
				lease = l;
		}
		if (SPI_processed > 0)
		{
			pgq_bound_hold(PGQ_BOUND_READY);
			pgq_bound_hold(PGQ_BOUND_LEASE);
			if (ready != DT_NOEND)
				pgq_bound_lower_at_commit(PGQ_BOUND_READY, pgq_time_key(ready));
			if (lease != DT_NOEND)
				pgq_bound_lower_at_commit(PGQ_BOUND_LEASE, pgq_time_key(lease));
		}
	}
	SPI_finish();
}

/*
 * Straggler moves of queue: the job rows left in an old slot (jobs due
 * later, dead letters, a paused queue's backlog, a job held under a lease
 * of hours) would keep it from ever draining.  Unlike work_queue's, they
 * may stay for days, so they go to the cold slot 0 (never rotated: VACUUM
 * keeps it, and only such jobs and those with a dedup_key live there), by
 * an UPDATE of their slot through the parent, which PostgreSQL carries
 * out as a delete and an insert (see ring_move for the rest: the slots
 * are those the last look planned, a row held by another transaction is
 * left for later).  The ready rows keep their keys: the scheduling
 * processes are told of them as of new ready jobs in slot 0 (publish.c).
 */
static void
ring_move_jobs(void *arg)
{
	int			i;

	SPI_connect();
	for (i = 0; i < nplanned_jobs; i++)
	{
		uint64		j;

		ring_move_rows("UPDATE pgqueue.queue q SET slot = $1"
					   " WHERE q.slot = $2 AND q.id = ANY (ARRAY("
					   "   SELECT m.id FROM pgqueue.queue m WHERE m.slot = $2"
					   "      FOR UPDATE SKIP LOCKED))"
					   " RETURNING q.queue, q.state IN ('pending', 'retry'),"
					   "   -(q.priority::bigint), q.run_after",
					   0, "queue", planned_jobs[i]);
		for (j = 0; j < SPI_processed; j++)
		{
			HeapTuple	tup = SPI_tuptable->vals[j];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;

			if (DatumGetBool(SPI_getbinval(tup, desc, 2, &isnull)))
			{
				PgqKey		key;

				key.hi = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
				key.lo = DatumGetTimestampTz(SPI_getbinval(tup, desc, 4, &isnull));
				pgq_ready_at_commit(DatumGetTextPCopy(SPI_getbinval(tup, desc, 1, &isnull)),
									key, PGQ_SLOT_BIT(0));
			}
		}
	}
	SPI_finish();
}

/*
 * After a scheduling pass, in its transaction: whether a current slot has
 * grown to pgqueue.slot_size (two relation sizes), which makes the next
 * look at the rings due at once (pgq_ring_maintain_wanted), so that a
 * slot does not outgrow its size by the passes of PGQ_RING_MAINTAIN_USECS.
 */
void
pgq_ring_check_full(void)
{
	Oid			nsp;
	PgqRingView w;
	PgqRingView j;

	if (pgq_layout() < PGQ_V11)
		return;
	nsp = get_namespace_oid("pgqueue", false);
	pgq_ring_view(nsp, "work_queue", &w);
	pgq_ring_view(nsp, "queue", &j);
	if (slot_full(w.relid[0]) || slot_full(j.relid[0]))
		full_wanted = true;
}

/*
 * Forget what the scheduler noted of the slots (who held a lock on an
 * emptied slot, whose snapshots may see a drained one's rows, when it was
 * made current): after a restore, a slot's number may name other rows in
 * another state.  Each note is taken again at the next look that needs
 * it, with no made_xmin known (every snapshot waited for): only more
 * waiting, never less.
 */
void
pgq_ring_forget(void)
{
	ring_notes[RING_QUEUE].parent = InvalidOid;
	ring_notes[RING_WORK].parent = InvalidOid;
}

/* Whether the scheduler's look at the rings is due (pgq_ring_maintain). */
bool
pgq_ring_maintain_wanted(void)
{
	return full_wanted || GetCurrentTimestamp() >= next_maintain;
}

/*
 * The scheduler's look at the rings, at most every
 * PGQ_RING_MAINTAIN_USECS and at once when a current slot is full
 * (pgq_ring_check_full), in a transaction of its own before a pass: it
 * commits, and its invalidations are sent, before the pass that may write
 * a slot it made current begins (ring.c's rule).  Only for 1.1 databases.
 * Never raises an error of its own: each step runs in a subtransaction,
 * and what fails is logged (a lock not had at once at DEBUG1) and tried
 * again at the next look.
 */
void
pgq_ring_maintain(void)
{
	static int	rings[2] = {RING_QUEUE, RING_WORK};
	Oid			nsp;

	next_maintain = GetCurrentTimestamp() + PGQ_RING_MAINTAIN_USECS;
	full_wanted = false;
	if (pgq_layout() < PGQ_V11)
		return;
	nsp = get_namespace_oid("pgqueue", false);
	if (!OidIsValid(get_relname_relid("slots", nsp)))
		return;
	pgq_upkeep_try(ring_turn, &rings[RING_WORK], "turn the ring of pgqueue.work_queue",
				   "The scheduler tries again before its next pass.");
	pgq_upkeep_try(ring_turn, &rings[RING_QUEUE], "turn the ring of pgqueue.queue",
				   "The scheduler tries again before its next pass.");
	pgq_upkeep_try(ring_move_plan, NULL, "plan the moves of the rows left in old slots",
				   "The scheduler tries again before its next pass.");
}

/* Whether the last look at the rings planned straggler moves (pgq_ring_move). */
bool
pgq_ring_move_wanted(void)
{
	return nplanned_work > 0 || nplanned_jobs > 0;
}

/*
 * The straggler moves planned by the last look at the rings
 * (ring_move_plan), in a transaction of their own after its commit.  As
 * pgq_ring_maintain, never raises an error of its own.
 */
void
pgq_ring_move(void)
{
	if (nplanned_work > 0)
		pgq_upkeep_try(ring_move, NULL, "move the rows left in old slots of pgqueue.work_queue",
					   "The scheduler tries again after its next look at the rings.");
	if (nplanned_jobs > 0)
		pgq_upkeep_try(ring_move_jobs, NULL, "move the rows left in old slots of pgqueue.queue",
					   "The scheduler tries again after its next look at the rings.");
	nplanned_work = nplanned_jobs = 0;
}
