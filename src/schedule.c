/*-------------------------------------------------------------------------
 *
 * schedule.c
 *		The scheduling pass: move ready jobs from pgqueue.queue to
 *		pgqueue.work_queue, fairly across queues.
 *
 * A pass takes up to max_items jobs that are pending or retry, due
 * (run_after <= now), in a queue that is not paused and has room under its
 * max_in_flight.  Within a queue jobs go by priority (higher first), then
 * due time, then id: the order of queue_ready_idx (queue, -priority,
 * run_after, id).  Across queues, by weighted fair queuing (start-time fair
 * queuing, kept across passes): each queue has a virtual finish tag F, the
 * process a virtual time V; a queue that has a job to offer gets the tag
 * max(V, F) + 1/weight for it, the pass takes the smallest tags, and a job
 * taken moves F to its tag and V to its start; when nothing was waiting,
 * V catches up with the largest tag given.  So the k-th job of a queue of
 * weight w goes at k/w after the queue became busy, a queue that was idle
 * starts level with the others, and a queue with 10 ready jobs is served as
 * soon as one with a million, in this pass or the next.  Ties go by
 * priority, due time and queue name.  batch_order follows the order
 * taken, so claims interleave the queues too.
 *
 * A pass costs the jobs it moves, not the queues that exist: each
 * scheduling process (the background worker, a session calling
 * pgq_schedule) keeps every queue it knows in local memory, with the key
 * below which it has no ready job (its head: the walk of its range of
 * queue_ready_idx starts there), and the queues that may have work in a
 * heap by tag.  It learns of new work from notes that committing
 * transactions leave in shared memory (publish.c: the queue and the lowest
 * key they made ready), and of settings changes from a generation counter.
 * A pass that cannot trust what it knows (the first one, after a rolled-back
 * pass, when notes were lost, under REPEATABLE READ) walks the names of
 * every queue (pgq_ready_queue_names: one descent per name, no heap
 * visit); so does one every second or more (as the full walks of bounds.c,
 * spaced by their cost), to find jobs made ready behind the API's back.
 *
 * The heads keep the rules of bounds.c: a walk passes only rows that are
 * gone (taken by this pass, or by a committed transaction), never one held
 * by another transaction (whose rollback would bring it back); notes lower
 * them; a rolled-back pass forgets them.  Between full refreshes the shared
 * PGQ_BOUND_SCHED bound says where a queue's walk may start without a head.
 *
 * Rows are taken as SKIP LOCKED does, in one write: an update of the
 * version the snapshot sees, without waiting (a row held or changed by
 * another transaction is skipped), so two passes at once never schedule a
 * job twice.  max_in_flight under concurrent passes: a pass takes a
 * transaction-level lock (1885827445, hashtext(queue): pgq_try_queue_lock,
 * an object lock that no SQL can take, unlike an advisory lock) on each
 * capped queue it schedules into, without waiting; a capped queue locked by
 * another open pass is left out of this pass (its room may be in use).
 *
 * Layer 4 of src/README (job operations): it may call the other files of
 * its layer, storage (tables.c, ring.c, retire.c, uuid7.c), shared memory
 * and wake-ups (shmem.c, publish.c, bounds.c), and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <float.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "lib/pairingheap.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "jobs.h"

#define PGQ_CAP_LOCK_KEY 1885827445

/* Where a queue stands in the process's view. */
typedef enum QueueWhere
{
	Q_IDLE,						/* no known ready job */
	Q_READY,					/* in the ready heap: may have a due job */
	Q_LATER,					/* in the later heap: its jobs are due at next_due */
	Q_HELD						/* paused, or full under max_in_flight */
} QueueWhere;

/*
 * A position in a queue's range of queue_ready_idx: (-priority, run_after,
 * id).  As a head: after the row (np, ra, id) when has_id, else at the key
 * (np, ra), every id included.
 */
typedef struct QueuePos
{
	int64		np;
	TimestampTz ra;
	pg_uuid_t	id;
	bool		has_id;
} QueuePos;

/* What a scheduling process keeps of a queue between passes. */
typedef struct QueueState
{
	char		name[PGQ_MAX_NAME_BYTES + 1];	/* hash key */
	pairingheap_node node;		/* in the ready or the later heap */
	QueueWhere	where;
	double		start;			/* its start tag while in the ready heap */
	double		finish;			/* virtual finish tag of its last job taken */
	QueuePos	head;			/* no ready job of the queue below */
	uint32		slots;			/* slots of pgqueue.queue that may hold its
								 * ready jobs (PGQ_SLOT_BIT) */
	TimestampTz next_due;		/* Q_LATER: when its first job is due */
	int32		weight;
	int32		max_in_flight;
	bool		paused;
	int32		rate_limit;		/* 1.2: releases per rate_period; 0: none */
	int64		rate_period;	/* usecs */
	int64		room;			/* this pass: jobs it may still take */
	uint64		room_pass;		/* the pass room was counted for */
	bool		rate_held;		/* in the later heap for its full window */
	PgqRateWindow *rate;		/* this pass: its window (rate.c), or NULL */
	int64		rate_room;		/* this pass: releases its window allows */
	uint64		rate_pass;		/* the pass these two belong to */
	QueuePos	cursor;			/* this pass: the walk goes on after it */
	bool		head_fixed;		/* this pass: the head stays where it is */
	bool		held_row;		/* this pass: a row held by another transaction */
	TimestampTz first_later;	/* this pass: the earliest row not yet due */
	uint64		cursor_pass;	/* the pass these four belong to */
	bool		mark;			/* seen by pgq_refresh_all */
	int32		group_max_in_flight;	/* 1.2: its groups' limit; 0: none */
	bool		was_grouped;	/* pgq_load_settings: grouped before it */
	text	   *gcursor;		/* the group served last (TopMemoryContext);
								 * NULL: the jobs without a group */
	uint64		gpass;			/* the pass these six belong to */
	bool		glocked;		/* this pass: its pass lock is held */
	bool		gidle;			/* this pass: a turn without a take began */
	text	   *gidle_key;		/* ... at this group (NULL: no group) */
	bool		gwrapped;		/* ... and went past the last group since */
	bool		gblocked;		/* this pass: a due job left for the next */
	bool		gfull;			/* this pass: a group had a due job, no room */
	bool		gfull_wait;		/* its last round found only full groups:
								 * ready again when a commit frees places
								 * (pgq_places_generation), or at next_due */
	TimestampTz gfirst_later;	/* this pass: the earliest grouped row not due */
	TimestampTz gstarted;		/* this pass: when the round without a take began */
	struct GroupWalk *gwalk;	/* pass gwalk_pass's walk of its groups */
	uint64		gwalk_pass;
	TimestampTz gnull_since;	/* its head was last lowered to the start (a
								 * refresh, or its turn without a group) */
	int64		gnull_rows;		/* ... since: rows of groups its walk of
								 * queue_ready_idx passed (pgq_take_one) */
	int64		gnull_takes;	/* ... since: jobs its groups' turns took */
} QueueState;

/* The process's view; reset when the tables are not the ones it knew. */
static HTAB *queues = NULL;
static Oid	queues_relid = InvalidOid;	/* pgqueue.queue it describes */
static pairingheap *ready_heap = NULL;
static pairingheap *later_heap = NULL;
static double vtime = 0;
static double max_finish = 0;	/* the largest finish tag given */
static uint64 notes_pos = 0;
static uint64 settings_gen = 0;
static uint64 places_gen = 0;	/* pgq_places_generation at the last pass */

/*
 * A grouped queue whose round found only full groups rounds again after at
 * least this long even if no commit freed a place (pgq_take_grouped).
 */
#define PGQ_GROUP_RECHECK_USECS (10 * USECS_PER_SEC)

/*
 * A grouped queue's head is kept by a full walk of the SCHED bound for at
 * most this long while its rows of groups cost more than they paid
 * (pgq_refresh_all), and then lowered by its turn without a group
 * (pgq_take_grouped) if no full walk did.
 */
#define PGQ_GNULL_MAX_USECS (10 * USECS_PER_SEC)
static bool view_valid = false;
static bool pass_in_xact = false;
static SubTransactionId pass_subid = InvalidSubTransactionId;	/* the last
																 * pass's */
static uint64 pass_count = 0;
static TimestampTz next_refresh = 0;
static TimestampTz soonest_due = DT_NOEND;	/* after the last pass: the
											 * earliest next_due > its now */
static List *rate_windows = NIL;	/* this pass: the windows it opened */

/* The relations of one pass; the indexes of queue's slots, opened on demand. */
typedef struct PassRels
{
	PgqWrite	w;
	Relation	ready_idx[PGQ_MAX_SLOTS];	/* queue_ready_idx of slot i */
	Relation	sched_idx[PGQ_MAX_SLOTS];	/* queue_scheduled_idx of slot i */
	Relation	group_idx[PGQ_MAX_SLOTS];	/* queue_group_idx of slot i (1.2) */
	bool		group_missing[PGQ_MAX_SLOTS];	/* slot i has none */
	int64		entries_base[PGQ_MAX_SLOTS];	/* ready_idx's entries read at open */
} PassRels;

static int64 pgq_index_entries_read(Relation idx);

static int	pgq_ready_queue_names(PassRels *r, char ***names, uint32 **masks);

/* Tag of the job a queue in the ready heap offers. */
static inline double
pgq_tag(const QueueState *q)
{
	return q->start + 1.0 / q->weight;
}

static int
pgq_pos_cmp(const QueuePos *a, const QueuePos *b)
{
	if (a->np != b->np)
		return a->np < b->np ? -1 : 1;
	if (a->ra != b->ra)
		return a->ra < b->ra ? -1 : 1;
	return 0;
}

/* Ready heap: smallest tag first, then priority, due time, name. */
static int
pgq_ready_cmp(const pairingheap_node *a, const pairingheap_node *b, void *arg)
{
	const QueueState *qa = pairingheap_const_container(QueueState, node, a);
	const QueueState *qb = pairingheap_const_container(QueueState, node, b);
	double		ta = pgq_tag(qa);
	double		tb = pgq_tag(qb);
	int			c;

	/* pairingheap keeps the largest first */
	if (ta != tb)
		return ta < tb ? 1 : -1;
	c = pgq_pos_cmp(&qa->head, &qb->head);
	if (c != 0)
		return -c;
	return -strcmp(qa->name, qb->name);
}

/* Later heap: earliest due first. */
static int
pgq_later_cmp(const pairingheap_node *a, const pairingheap_node *b, void *arg)
{
	const QueueState *qa = pairingheap_const_container(QueueState, node, a);
	const QueueState *qb = pairingheap_const_container(QueueState, node, b);

	if (qa->next_due != qb->next_due)
		return qa->next_due < qb->next_due ? 1 : -1;
	return 0;
}

/* Forget everything (new tables, or a view that cannot be trusted). */
static void
pgq_view_reset(Oid relid)
{
	HASHCTL		ctl;

	if (queues != NULL)
	{
		HASH_SEQ_STATUS seq;
		QueueState *q;

		hash_seq_init(&seq, queues);
		while ((q = hash_seq_search(&seq)) != NULL)
			if (q->gcursor != NULL)
				pfree(q->gcursor);
		hash_destroy(queues);
	}
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = PGQ_MAX_NAME_BYTES + 1;
	ctl.entrysize = sizeof(QueueState);
	ctl.hcxt = TopMemoryContext;
	queues = hash_create("pgqueue scheduling view", 256, &ctl,
						 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	if (ready_heap == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		ready_heap = pairingheap_allocate(pgq_ready_cmp, NULL);
		later_heap = pairingheap_allocate(pgq_later_cmp, NULL);
		MemoryContextSwitchTo(old);
	}
	else
	{
		pairingheap_reset(ready_heap);
		pairingheap_reset(later_heap);
	}
	queues_relid = relid;
	vtime = 0;
	max_finish = 0;
	settings_gen = 0;
	view_valid = false;
}

/* Take q out of wherever it is (it becomes Q_IDLE). */
static void
pgq_unplace(QueueState *q)
{
	if (q->where == Q_READY)
		pairingheap_remove(ready_heap, &q->node);
	else if (q->where == Q_LATER)
		pairingheap_remove(later_heap, &q->node);
	q->where = Q_IDLE;
}

/* Put q into the ready heap: it may have a due job (or is held). */
static void
pgq_make_ready(QueueState *q)
{
	if (q->where == Q_READY || q->where == Q_HELD)
		return;
	pgq_unplace(q);
	if (q->paused)
	{
		q->where = Q_HELD;
		return;
	}
	q->start = Max(vtime, q->finish);
	q->where = Q_READY;
	pairingheap_add(ready_heap, &q->node);
}

/* The state of queue name, made (idle, defaults) if new (*is_new). */
static QueueState *
pgq_queue(const char *name, bool *is_new)
{
	bool		found;
	QueueState *q = hash_search(queues, name, HASH_ENTER, &found);

	if (is_new)
		*is_new = !found;
	if (!found)
	{
		q->where = Q_IDLE;
		q->finish = 0;
		q->head.np = PG_INT64_MIN;
		q->head.ra = DT_NOBEGIN;
		q->head.has_id = false;
		q->slots = PGQ_ALL_SLOTS;
		q->next_due = 0;
		q->weight = 1;
		q->max_in_flight = 0;
		q->paused = false;
		q->rate_limit = 0;
		q->rate_period = USECS_PER_SEC;
		q->rate_held = false;
		q->room_pass = 0;
		q->rate_pass = 0;
		q->cursor_pass = 0;
		q->mark = false;
		q->group_max_in_flight = 0;
		q->gcursor = NULL;
		q->gpass = 0;
		q->gfull_wait = false;
		q->gwalk_pass = 0;
		q->gnull_since = 0;
		q->gnull_rows = 0;
		q->gnull_takes = 0;
	}
	return q;
}

/* Lower q's head to key (-priority, run_after), every id. */
static void
pgq_lower_head(QueueState *q, int64 np, TimestampTz ra)
{
	QueuePos	k;

	k.np = np;
	k.ra = ra;
	k.has_id = false;
	if (pgq_pos_cmp(&k, &q->head) < 0 ||
		(pgq_pos_cmp(&k, &q->head) == 0 && q->head.has_id))
		q->head = k;
}

/*
 * Lower q's head to key (np, ra) as a refresh does, at now: a grouped
 * queue's walk of its rows of groups starts over (see "Groups").
 */
static void
pgq_lower_head_anew(QueueState *q, int64 np, TimestampTz ra, TimestampTz now)
{
	pgq_lower_head(q, np, ra);
	q->gnull_since = now;
	q->gnull_rows = 0;
	q->gnull_takes = 0;
}

/*
 * Load every queue's settings from pgqueue.queues (a small table, read when
 * a committed pgq_configure bumped the generation).
 */
static void
pgq_load_settings(PassRels *r)
{
	Oid			nsp = get_namespace_oid("pgqueue", false);
	Relation	rel = table_open(pgq_relid(nsp, "queues"), AccessShareLock);
	TupleDesc	desc = RelationGetDescr(rel);
	TableScanDesc scan = table_beginscan(rel, r->w.snapshot, 0, NULL);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	HASH_SEQ_STATUS seq;
	QueueState *q;

	/* queues without a row have the defaults */
	hash_seq_init(&seq, queues);
	while ((q = hash_seq_search(&seq)) != NULL)
	{
		q->weight = 1;
		q->max_in_flight = 0;
		q->paused = false;
		q->rate_limit = 0;
		q->rate_period = USECS_PER_SEC;
		q->was_grouped = q->group_max_in_flight > 0;
		q->group_max_in_flight = 0;
	}
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		char	   *name = NULL;
		int32		weight = 1;
		int32		cap = 0;
		bool		paused = false;
		int32		rate_limit = 0;
		int64		rate_period = USECS_PER_SEC;
		int32		group_max = 0;
		bool		is_new;
		int			i;

		slot_getallattrs(slot);
		for (i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute a = TupleDescAttr(desc, i);
			const char *col = NameStr(a->attname);

			if (a->attisdropped || slot->tts_isnull[i])
				continue;
			if (strcmp(col, "queue") == 0)
				name = TextDatumGetCString(slot->tts_values[i]);
			else if (strcmp(col, "weight") == 0)
				weight = DatumGetInt32(slot->tts_values[i]);
			else if (strcmp(col, "max_in_flight") == 0)
				cap = DatumGetInt32(slot->tts_values[i]);
			else if (strcmp(col, "paused") == 0)
				paused = DatumGetBool(slot->tts_values[i]);
			else if (strcmp(col, "rate_limit") == 0)
				rate_limit = DatumGetInt32(slot->tts_values[i]);
			else if (strcmp(col, "rate_period") == 0)
				rate_period = pgq_interval_usecs(slot->tts_values[i]);
			else if (strcmp(col, "group_max_in_flight") == 0)
				group_max = DatumGetInt32(slot->tts_values[i]);
		}
		if (name == NULL || strlen(name) > PGQ_MAX_NAME_BYTES)
			continue;
		q = pgq_queue(name, &is_new);
		if (is_new)
			q->was_grouped = false;
		q->weight = Max(weight, 1);
		q->max_in_flight = cap;
		q->paused = paused;
		q->rate_limit = Max(rate_limit, 0);
		q->rate_period = Max(rate_period, 1);
		q->group_max_in_flight = Max(group_max, 0);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	/*
	 * Paused queues are held, unpaused ones may have work; the ready heap is
	 * made again, its order depending on the weights.
	 */
	pairingheap_reset(ready_heap);
	hash_seq_init(&seq, queues);
	while ((q = hash_seq_search(&seq)) != NULL)
	{
		/*
		 * A queue no longer grouped: its walk of queue_ready_idx passed the
		 * rows of its groups (pgq_take_one), which are its own again.
		 */
		if (q->was_grouped && q->group_max_in_flight == 0)
		{
			q->head.np = PG_INT64_MIN;
			q->head.ra = DT_NOBEGIN;
			q->head.has_id = false;
			q->slots = PGQ_ALL_SLOTS;
			if (q->where == Q_LATER)
				pgq_unplace(q);
		}
		q->was_grouped = q->group_max_in_flight > 0;
		if (q->where == Q_READY)
		{
			if (q->paused)
				q->where = Q_HELD;
			else
				pairingheap_add(ready_heap, &q->node);
			continue;
		}
		if (q->paused && q->where != Q_IDLE)
		{
			pgq_unplace(q);
			q->where = Q_HELD;
		}
		else if (q->where == Q_LATER && q->rate_held)
		{
			/* waiting for its window, which the new settings may change */
			q->rate_held = false;
			pgq_unplace(q);
			pgq_make_ready(q);
		}
		else if (!q->paused && q->where == Q_HELD)
		{
			q->where = Q_IDLE;
			pgq_make_ready(q);
		}
	}
}

/*
 * Walk every queue name in the slots' queue_ready_idx: each becomes ready,
 * its head at from (or kept, when keep_heads and its head is a valid
 * bound), its slots those whose index has entries of it; a known queue
 * without an entry becomes idle.  Returns the lowest head, for the SCHED
 * bound.  When notes_read (the pass's notes were all read and applied), a
 * grouped queue waiting for a place to be freed (gfull_wait) keeps waiting:
 * no job pushed into it is unknown; and a grouped queue keeps its head
 * while the rows of groups its walk passed since its head was last lowered
 * outnumber the jobs its groups' turns took, for at most
 * PGQ_GNULL_MAX_USECS (see "Groups" below).
 */
static PgqKey
pgq_refresh_all(PassRels *r, PgqKey from, bool keep_heads, bool notes_read,
				TimestampTz now)
{
	char	  **names;
	uint32	   *masks;
	int			n = pgq_ready_queue_names(r, &names, &masks);
	int			i;
	HASH_SEQ_STATUS seq;
	QueueState *q;
	PgqKey		lowest;

	lowest.hi = PG_INT64_MAX;
	lowest.lo = DT_NOEND;
	hash_seq_init(&seq, queues);
	while ((q = hash_seq_search(&seq)) != NULL)
		q->mark = false;

	for (i = 0; i < n; i++)
	{
		char	   *name = names[i];
		bool		is_new;
		bool		keep;

		if (strlen(name) > PGQ_MAX_NAME_BYTES)
			continue;
		q = pgq_queue(name, &is_new);
		/* a grouped queue whose walk of its groups' rows has not paid: above */
		keep = !is_new &&
			(keep_heads ||
			 (notes_read && q->group_max_in_flight > 0 &&
			  q->gnull_rows > q->gnull_takes &&
			  now < q->gnull_since + PGQ_GNULL_MAX_USECS));
		if (!keep)
			pgq_lower_head_anew(q, from.hi, from.lo, now);
		q->slots = masks[i];
		q->mark = true;
		/* a grouped queue waiting for a place to be freed: see above */
		if (!(notes_read && q->gfull_wait) &&
			(q->where == Q_IDLE || q->where == Q_LATER))
		{
			q->gfull_wait = false;
			pgq_make_ready(q);
		}
		/*
		 * A grouped queue's head is past the rows of its groups (the walk
		 * of its groups serves them): it bounds nothing.
		 */
		if (q->group_max_in_flight > 0)
		{
			lowest.hi = PG_INT64_MIN;
			lowest.lo = DT_NOBEGIN;
		}
		if (q->head.np < lowest.hi || (q->head.np == lowest.hi && q->head.ra < lowest.lo))
		{
			lowest.hi = q->head.np;
			lowest.lo = q->head.ra;
		}
	}

	/* queues without an entry: idle; forget those that owe nothing */
	hash_seq_init(&seq, queues);
	while ((q = hash_seq_search(&seq)) != NULL)
	{
		if (q->mark)
			continue;
		pgq_unplace(q);
		if (q->finish <= vtime && q->weight == 1 && q->max_in_flight == 0 && !q->paused &&
			q->rate_limit == 0 && q->group_max_in_flight == 0)
		{
			if (q->gcursor != NULL)
				pfree(q->gcursor);
			(void) hash_search(queues, q->name, HASH_REMOVE, NULL);
		}
	}
	return lowest;
}

/* Index role ("ready_idx", "scheduled_idx") of queue's slot i, opened now. */
static Relation
pgq_pass_index(PassRels *r, int i, bool ready)
{
	Relation   *idx = ready ? &r->ready_idx[i] : &r->sched_idx[i];

	if (*idx == NULL)
	{
		PgqTable   *t = pgq_job_slot(&r->w, i);

		*idx = index_open(pgq_slot_index_relid(t->rel, ready ? "ready_idx" : "scheduled_idx"),
						  AccessShareLock);
		if (ready)
			r->entries_base[i] = pgq_index_entries_read(*idx);
	}
	return *idx;
}

/*
 * Room of capped queue q in this pass: its lock (pgq_try_queue_lock, without waiting),
 * then max_in_flight minus its jobs in work_queue.  0 when another open pass
 * holds the lock.
 *
 * The jobs are counted with a snapshot taken after the lock, not with the
 * pass's: a pass that scheduled into q and committed (releasing the lock)
 * after this pass took its snapshot is invisible to that snapshot, and its
 * jobs would be counted as room (specs/cap_race.spec).  A snapshot taken
 * once the lock is held sees every pass that held it before.
 */
static int64
pgq_room(PassRels *r, QueueState *q, text *qname)
{
	ScanKeyData key;
	Snapshot	snap;
	int64		n = 0;
	int32		h;
	int			i;

	if (q->room_pass == pass_count)
		return q->room;
	q->room_pass = pass_count;
	h = DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID,
											  PointerGetDatum(qname)));
	if (!pgq_try_queue_lock(PGQ_CAP_LOCK_KEY, h))
		return q->room = 0;
	snap = RegisterSnapshot(GetLatestSnapshot());
	for (i = 0; i < r->w.jobs_view.n; i++)
	{
		PgqTable   *t = pgq_job_slot(&r->w, i);
		Relation	idx = pgq_pass_index(r, i, false);
		IndexScanDesc scan;

		ScanKeyEntryInitialize(&key, 0, 1, BTEqualStrategyNumber, InvalidOid,
							   idx->rd_indcollation[0], F_TEXTEQ,
							   PointerGetDatum(qname));
		scan = pgq_index_beginscan(t->rel, idx, snap, 1, 0);
		index_rescan(scan, &key, 1, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, t->next))
			n++;
		index_endscan(scan);
		ExecClearTuple(t->next);
	}
	UnregisterSnapshot(snap);
	return q->room = Max(q->max_in_flight - n, 0);
}

/*
 * Releases rate-limited queue q may still have in this pass (rate.c): 0
 * when its window is full or another pass has it (q->rate NULL).  Its
 * window is opened once a pass, and written at the pass's end.
 */
static int64
pgq_rate_room(QueueState *q, TimestampTz now)
{
	if (q->rate_pass == pass_count)
		return q->rate_room;
	q->rate_pass = pass_count;
	q->rate = pgq_rate_open(q->name, q->rate_limit, q->rate_period, now,
							&q->rate_room);
	if (q->rate == NULL)
		q->rate_room = 0;
	else
		rate_windows = lappend(rate_windows, q->rate);
	return q->rate_room;
}

/*
 * Start a walk of queue qname's range of queue_ready_idx at pos: keys
 * (queue = qname) and (-priority, run_after[, id]) > or >= pos, the latter a
 * row comparison (nbtree's SK_ROW_HEADER), so that the walk starts right at
 * pos rather than at the start of its priority.
 */
static IndexScanDesc
pgq_walk_begin(PassRels *r, int slot, text *qname, const QueuePos *pos, bool after,
			   ScanKeyData *keys, ScanKeyData *row)
{
	Relation	ready_idx = pgq_pass_index(r, slot, true);
	IndexScanDesc scan;
	int			nrow = pos->has_id ? 3 : 2;
	StrategyNumber strat = after ? BTGreaterStrategyNumber : BTGreaterEqualStrategyNumber;
	int			nkeys = 1;

	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   ready_idx->rd_indcollation[0], F_TEXTEQ,
						   PointerGetDatum(qname));
	if (pos->np != PG_INT64_MIN || pos->ra != DT_NOBEGIN)
	{
		ScanKeyEntryInitialize(&row[0], SK_ROW_MEMBER, 2, strat, InvalidOid,
							   InvalidOid, F_BTINT8CMP, Int64GetDatum(pos->np));
		ScanKeyEntryInitialize(&row[1], SK_ROW_MEMBER | (nrow == 2 ? SK_ROW_END : 0),
							   3, strat, InvalidOid, InvalidOid, F_TIMESTAMP_CMP,
							   TimestampTzGetDatum(pos->ra));
		if (nrow == 3)
		{
			/* the key's own copy: the caller's position moves during the walk */
			pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));

			memcpy(id, &pos->id, sizeof(pg_uuid_t));
			ScanKeyEntryInitialize(&row[2], SK_ROW_MEMBER | SK_ROW_END, 4, strat,
								   InvalidOid, InvalidOid, F_UUID_CMP,
								   UUIDPGetDatum(id));
		}
		ScanKeyEntryInitialize(&keys[1], SK_ROW_HEADER, 2, strat, InvalidOid,
							   InvalidOid, InvalidOid, PointerGetDatum(row));
		nkeys = 2;
	}
	scan = pgq_index_beginscan(r->w.jobs[slot].rel, ready_idx, r->w.snapshot, nkeys, 0);
	index_rescan(scan, keys, nkeys, NULL, 0);
	return scan;
}

/*
 * Index entries the scans of idx returned to this backend so far, by its
 * pending statistics (0 when none are counted): the difference over a pass
 * is what its walks read, visible rows or not.
 */
static int64
pgq_index_entries_read(Relation idx)
{
	return idx->pgstat_info != NULL ? pgq_tabstat_tuples_returned(idx->pgstat_info) : 0;
}

/* The job row after it is taken: 'scheduled', one version more. */
static void
pgq_take_build(PgqTable *t, void *arg)
{
	bool		isnull;
	int32		version = DatumGetInt32(pgq_get(t, t->found, PGQ_COL_VERSION, &isnull));

	pgq_set(t, PGQ_COL_STATE, *(Datum *) arg, false);
	pgq_set(t, PGQ_COL_VERSION, Int32GetDatum(version + 1), false);
}

/* The enum values a pass compares job states with. */
typedef struct PassStates
{
	Oid			pending;
	Oid			retry;
	Datum		scheduled;
} PassStates;

/* One slot's walk in a walk of a queue's range over its slots. */
typedef struct SlotWalk
{
	int			i;				/* the slot's index in the view */
	PgqTable   *t;				/* its table: the row walked is in t->found */
	IndexScanDesc scan;
	ScanKeyData keys[2];
	ScanKeyData row[3];
	bool		has;			/* t->found holds its next row, at pos */
	QueuePos	pos;
	bool		saw_ready;		/* it returned a pending or retry row */
} SlotWalk;

/* Order of rows in queue_ready_idx: (-priority, run_after, id). */
static int
pgq_row_cmp(const QueuePos *a, const QueuePos *b)
{
	int			c = pgq_pos_cmp(a, b);

	return c != 0 ? c : memcmp(a->id.data, b->id.data, UUID_LEN);
}

/* The next row of a slot's walk, into sw->t->found and sw->pos. */
static void
pgq_walk_next(SlotWalk *sw)
{
	PgqTable   *t = sw->t;
	bool		isnull;

	sw->has = index_getnext_slot(sw->scan, ForwardScanDirection, t->found);
	if (!sw->has)
		return;
	sw->pos.np = -(int64) DatumGetInt32(pgq_get(t, t->found, PGQ_COL_PRIORITY, &isnull));
	sw->pos.ra = DatumGetTimestampTz(pgq_get(t, t->found, PGQ_COL_RUN_AFTER, &isnull));
	memcpy(&sw->pos.id, DatumGetUUIDP(pgq_get(t, t->found, PGQ_COL_ID, &isnull)),
		   sizeof(pg_uuid_t));
	sw->pos.has_id = true;
}

/*
 * The walks of the queue a pass served last, left open for its next take:
 * a pass that serves one queue many times in a row (a backlog spread over
 * slots) then descends each slot's index once, not once a job.  Only one
 * queue's at a time: the rows they read ahead are in the found slots of
 * the slots' tables, which another queue's walks use.
 */
typedef struct OpenWalks
{
	QueueState *q;				/* whose walks; NULL: none open */
	uint64		pass;			/* pass_count of the pass they belong to */
	int			n;
	int			taken;			/* the walk whose row was taken last: it
								 * reads its next row first */
	SlotWalk	walks[PGQ_MAX_SLOTS];
} OpenWalks;

static OpenWalks open_walks;

/*
 * End the open walks (before the pass closes its relations).  Walks of an
 * earlier pass are only forgotten: a pass that ended in an error (rolled
 * back to a savepoint, say) had its scans ended by the abort.
 */
static void
pgq_walks_close(void)
{
	int			k;

	if (open_walks.q == NULL || open_walks.pass != pass_count)
	{
		open_walks.q = NULL;
		return;
	}
	for (k = 0; k < open_walks.n; k++)
	{
		index_endscan(open_walks.walks[k].scan);
		ExecClearTuple(open_walks.walks[k].t->found);
	}
	open_walks.q = NULL;
}

/*
 * Open this pass's walks of q's range from cursor (after it, or at it when
 * not after): one in each slot of pgqueue.queue that may hold ready jobs of
 * q (q->slots; a slot past the mask's bits always), each read to its first
 * row.  They replace the walks open so far.  Returns how many.
 */
static int
pgq_walks_open(PassRels *r, QueueState *q, text *qname, const QueuePos *cursor,
			   bool after)
{
	SlotWalk   *walks = open_walks.walks;
	int			nwalks;
	int			k;

	pgq_walks_close();
	nwalks = 0;
	for (k = 0; k < r->w.jobs_view.n; k++)
	{
		uint32		bit = PGQ_SLOT_BIT(r->w.jobs_view.slot[k]);
		SlotWalk   *sw;

		if (bit != 0 && (q->slots & bit) == 0)
			continue;
		sw = &walks[nwalks++];
		sw->i = k;
		sw->t = pgq_job_slot(&r->w, k);
		sw->scan = pgq_walk_begin(r, k, qname, cursor, after, sw->keys, sw->row);
		sw->saw_ready = false;
		pgq_walk_next(sw);
	}
	open_walks.q = q;
	open_walks.pass = pass_count;
	open_walks.n = nwalks;
	return nwalks;
}

/*
 * Take the due job row that job->found holds, as SKIP LOCKED would: update
 * the version the snapshot sees to 'scheduled', without waiting; when that
 * succeeds (TM_Ok), insert its work_queue row into the current slot with
 * batch_order order and created now.  Returns the update's result: not
 * TM_Ok when another transaction holds the row (TM_WouldBlock,
 * TM_BeingModified) or changed it since the snapshot.
 */
static TM_Result
pgq_take_row(PassRels *r, PgqTable *job, text *qname, TimestampTz now, int32 order,
			 const PassStates *states)
{
	PgqTable   *work = r->w.work;	/* the current slot */
	bool		isnull;
	TM_Result	res;
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	PgqUpdateIndexes update_indexes;

	/* take it as SKIP LOCKED would: the version seen, without waiting */
	slot_getallattrs(job->found);
	ExecClearTuple(job->next);
	memcpy(job->next->tts_values, job->found->tts_values,
		   sizeof(Datum) * job->found->tts_tupleDescriptor->natts);
	memcpy(job->next->tts_isnull, job->found->tts_isnull,
		   sizeof(bool) * job->found->tts_tupleDescriptor->natts);
	pgq_take_build(job, (void *) &states->scheduled);
	res = table_tuple_update(job->rel, &job->found->tts_tid, job->next, r->w.cid,
							 r->w.snapshot, InvalidSnapshot, false, &tmfd,
							 &lockmode, &update_indexes);
	if (res == TM_Ok)
	{
		Datum		values[PGQ_NUM_COLS * 2];
		bool		nulls[PGQ_NUM_COLS * 2];
		int			natts = RelationGetDescr(work->rel)->natts;
		int			i;

		if (PGQ_UPDATE_NEEDS_INDEXES(update_indexes))
			pgq_table_indexes(job);
		if (PGQ_UPDATE_NEEDS_INDEXES(update_indexes) && job->rri->ri_NumIndices > 0)
			pgq_table_index_row(&r->w, job, true,
								PGQ_UPDATE_ONLY_SUMMARIZING(update_indexes));
		for (i = 0; i < natts; i++)
		{
			values[i] = (Datum) 0;
			nulls[i] = true;
		}
#define SETW(c, v) \
	do { if (work->att[c] != InvalidAttrNumber) { \
		values[work->att[c] - 1] = (v); nulls[work->att[c] - 1] = false; } } while (0)
		SETW(PGQ_COL_ID, pgq_get(job, job->next, PGQ_COL_ID, &isnull));
		SETW(PGQ_COL_QUEUE, PointerGetDatum(qname));
		SETW(PGQ_COL_CREATED, TimestampTzGetDatum(now));
		SETW(PGQ_COL_BATCH_ORDER, Int32GetDatum(order));
		SETW(PGQ_COL_VERSION, r->w.layout >= PGQ_V11
			 ? pgq_get(job, job->next, PGQ_COL_VERSION, &isnull) : Int32GetDatum(0));
		if (r->w.layout >= PGQ_V11)
			SETW(PGQ_COL_TRIES, pgq_get(job, job->next, PGQ_COL_TRIES, &isnull));
		/* 1.2: the job's own max_tries, where the end of a try reads it */
		if (r->w.layout >= PGQ_V12 && job->att[PGQ_COL_MAX_TRIES] != InvalidAttrNumber)
		{
			Datum		own = pgq_get(job, job->next, PGQ_COL_MAX_TRIES, &isnull);

			if (!isnull)
				SETW(PGQ_COL_MAX_TRIES, own);
		}
#undef SETW
		pgq_insert(&r->w, work, values, nulls);
	}
	return res;
}

/*
 * Take the next due job of q for this pass, walking its range from where
 * the pass left it (or from its head): update its row to 'scheduled' and
 * insert its work_queue row with batch_order order and created now.
 * Returns true if it took one.  Moves q's head past the rows it passed
 * (gone, or taken: a rolled-back pass resets the view), never past one held
 * by another transaction or not yet due; sets q->next_due to when the first
 * job left is due (DT_NOEND: none left, 0: maybe more now, or by the next
 * pass when another transaction holds one).
 *
 * The range is walked in each slot of pgqueue.queue that may hold ready
 * jobs of q (q->slots), the walks merged in the index's order.  A slot
 * whose walk from the head found no ready row leaves q->slots (a push or
 * a nack into it puts it back: the notes say which slot, publish.c).
 */
static bool
pgq_take_one(PassRels *r, QueueState *q, TimestampTz now, int32 order,
			 const PassStates *states)
{
	text	   *qname = cstring_to_text(q->name);
	SlotWalk   *walks = open_walks.walks;
	QueuePos	cursor;
	bool		after;
	bool		head_fixed = false;
	bool		took = false;
	bool		from_head;
	bool		first = true;
	bool		reuse;

	from_head = (q->cursor_pass != pass_count);
	if (!from_head)
	{
		cursor = q->cursor;
		after = true;
		head_fixed = q->head_fixed;
	}
	else
	{
		cursor = q->head;
		after = q->head.has_id;	/* after a row passed, or at a key */
		q->held_row = false;
		q->first_later = DT_NOEND;
	}

	/* the walks this pass left open for q go on after the cursor */
	reuse = !from_head && open_walks.q == q && open_walks.pass == pass_count;
	while (!took)
	{
		bool		restart = false;
		int			nwalks;
		int			k;

		if (reuse)
		{
			nwalks = open_walks.n;
			if (open_walks.taken >= 0)
				pgq_walk_next(&walks[open_walks.taken]);
			reuse = false;
		}
		else
			nwalks = pgq_walks_open(r, q, qname, &cursor, after);
		open_walks.taken = -1;

		while (!took && !restart)
		{
			SlotWalk   *sw = NULL;
			PgqTable   *job;
			bool		isnull;
			Oid			state;
			QueuePos	pos;
			TM_Result	res;

			/* the lowest row of the walks */
			for (k = 0; k < nwalks; k++)
				if (walks[k].has && (sw == NULL || pgq_row_cmp(&walks[k].pos, &sw->pos) < 0))
					sw = &walks[k];
			if (sw == NULL)
				break;
			job = sw->t;
			pos = sw->pos;
			cursor = pos;
			after = true;

			/* the entry may lead through a HOT chain to a row no longer ready */
			state = DatumGetObjectId(pgq_get(job, job->found, PGQ_COL_STATE, &isnull));
			if (state != states->pending && state != states->retry)
			{
				if (!head_fixed)
					q->head = pos;	/* passed: gone */
				pgq_walk_next(sw);
				continue;
			}

			/*
			 * A grouped queue's rows of a group are served by the walk of
			 * its groups (pgq_take_grouped): passed, as gone.
			 */
			if (q->group_max_in_flight > 0)
			{
				(void) pgq_get(job, job->found, PGQ_COL_GROUP_KEY, &isnull);
				if (!isnull)
				{
					if (!head_fixed)
						q->head = pos;
					q->gnull_rows++;
					pgq_walk_next(sw);
					continue;
				}
			}
			sw->saw_ready = true;

			if (pos.ra > now)
			{
				/*
				 * Not due, nor are the later rows of its priority: not
				 * passed; on to the next priority.
				 */
				head_fixed = true;	/* the head stays after the last row passed */
				q->first_later = Min(q->first_later, pos.ra);
				if (pos.np == PG_INT64_MAX)
					break;
				cursor.np = pos.np + 1;
				cursor.ra = DT_NOBEGIN;
				cursor.has_id = false;
				after = false;
				restart = true;
				continue;
			}

			res = pgq_take_row(r, job, qname, now, order, states);
			if (res == TM_Ok)
			{
				took = true;
				open_walks.taken = sw - walks;
				if (!head_fixed)
					q->head = pos;	/* passed: taken */
				continue;
			}
			else if (res == TM_WouldBlock || res == TM_BeingModified)
			{
				/*
				 * Held by another transaction: not passed, and to be looked
				 * at again by the next pass (a rollback publishes nothing).
				 */
				head_fixed = true;
				q->held_row = true;
			}
			else if (!head_fixed)
				q->head = pos;	/* changed since the snapshot: gone (or moved
								 * to slot 0: ring.c's note brings it back) */
			pgq_walk_next(sw);
			CHECK_FOR_INTERRUPTS();
		}

		/*
		 * A slot walked from the head to its end without a ready row has
		 * none of q's (rows committed after the snapshot come with notes).
		 */
		for (k = 0; k < nwalks; k++)
			if (first && from_head && !walks[k].has && !walks[k].saw_ready)
				q->slots &= ~PGQ_SLOT_BIT(r->w.jobs_view.slot[walks[k].i]);
		first = false;
		if (took)
			break;				/* the walks stay open for q's next take */
		pgq_walks_close();
		if (!restart)
			break;
	}

	/*
	 * The walk goes on after the row examined last.  The head is after the
	 * last row passed before the first one that was not (a row not yet due,
	 * or held by another transaction): so a row not passed whose key went
	 * down behind the API's back (an UPDATE of run_after), no lower than
	 * that, is still found.
	 */
	q->cursor = cursor;
	q->head_fixed = head_fixed;
	q->cursor_pass = pass_count;
	if (took || q->held_row)
		q->next_due = 0;		/* there may be more (now, or next pass) */
	else
		q->next_due = q->first_later;	/* DT_NOEND: none left */
	return took;
}

/*
 * Lower the heads of a trusted view by the notes of committed transactions,
 * then this transaction's own (its rows are visible to it before it
 * commits), and make their queues ready.  With known_only, queues the view
 * does not know are left to pgq_refresh_all (which walks them from the
 * start).
 */
static void
pgq_apply_notes(char **names, PgqKey *keys, uint32 *masks, int nnotes,
				char **own_names, PgqKey *own_keys, uint32 *own_masks, int nown,
				bool known_only)
{
	int			i;

	for (i = 0; i < nnotes + nown; i++)
	{
		bool		is_new;
		const char *name = i < nnotes ? names[i] : own_names[i - nnotes];
		PgqKey		key = i < nnotes ? keys[i] : own_keys[i - nnotes];
		uint32		mask = i < nnotes ? masks[i] : own_masks[i - nnotes];
		QueueState *q;

		if (known_only && hash_search(queues, name, HASH_FIND, NULL) == NULL)
			continue;
		q = pgq_queue(name, &is_new);
		if (is_new)
		{
			/* a trusted view knew every queue with entries: none below */
			q->head.np = key.hi;
			q->head.ra = key.lo;
			q->head.has_id = false;
			q->slots = mask;
		}
		else
		{
			pgq_lower_head(q, key.hi, key.lo);
			q->slots |= mask;
		}
		if (q->where == Q_IDLE || q->where == Q_LATER)
			pgq_make_ready(q);
	}
}

/*
 * Make ready the queues of the later heap whose first job is due by now;
 * soonest_due becomes the due time of the first queue left there
 * (DT_NOEND: none).
 */
static void
pgq_ready_due(TimestampTz now)
{
	QueueState *q;

	soonest_due = DT_NOEND;
	while (!pairingheap_is_empty(later_heap))
	{
		q = pairingheap_container(QueueState, node, pairingheap_first(later_heap));
		if (q->next_due > now)
		{
			soonest_due = q->next_due;
			break;
		}
		pgq_unplace(q);
		pgq_make_ready(q);
	}
}

/* ----------------------------------------------------------------
 * Groups (1.2): a queue with group_max_in_flight > 0
 *
 * Its jobs of a group (group_key not NULL) are served by the walk of its
 * groups, one turn a group, in the order of group_key from the group
 * served last (q->gcursor), wrapping around to the jobs without a group,
 * which take their turn as one group among the others (through
 * pgq_take_one, whose walk of queue_ready_idx passes the rows of groups).
 * A turn takes a group's next job: a due job in retry (it already holds
 * its place), else its first due pending job in order (priority, then
 * due time, then id) when fewer than group_max_in_flight of its jobs are
 * scheduled or in retry.  A pass goes round the groups until a whole round
 * took nothing; so a group's backlog delays another group's next job by
 * one turn, whatever its size.
 *
 * A group's jobs in flight are counted at each turn in queue_group_idx
 * (queue, group_key, state = 'pending', -priority, run_after, id), where
 * they come first: a descent per slot reads them, then the group's first
 * pending jobs.  Only passes put jobs in flight (a pending job becomes
 * scheduled); acks, nacks, cancels, failures and steals only take them out
 * or keep them.  So the count is right when it is read with a snapshot
 * taken once the pass holds the queue's pass lock (pgq_try_queue_lock, as
 * for max_in_flight: specs/cap_race.spec, specs/group_race.spec): every
 * pass that put a job of the queue in flight has committed or is this
 * one; a job leaving meanwhile is counted once more (its place is taken at
 * the next pass, which its commit wakes).  This pass's own takes are seen
 * as the rows it updated (their old version, pending, is still the one its
 * snapshot sees): counted in flight too.
 *
 * The turn of the jobs without a group walks queue_ready_idx from the
 * queue's head and passes the rows of groups, so the head soon lies past
 * them all.  A full walk of the SCHED bound (pgq_refresh_all, every second
 * or so) lowers every head back to the bound's start, and the next turn
 * passed every row of the queue's groups again: at 100,000 groups, a tenth
 * of a pass's time.  So when the pass's notes were read (every job pushed
 * or nacked below the head since is known), a grouped queue keeps its head
 * through the full walk while the rows of groups passed since the head was
 * last lowered outnumber the jobs its groups' turns took (the walk has not
 * paid for itself), but for PGQ_GNULL_MAX_USECS at most, when its next
 * turn without a group lowers it (pgq_take_grouped): a row whose key went
 * down behind the API's back (an UPDATE of run_after, a push in a PREPAREd
 * transaction) is found within that bound (t/039_group_null_walk.pl).
 * ----------------------------------------------------------------
 */

/* Index queue_group_idx of queue's slot i, opened now; NULL if it has none. */
static Relation
pgq_group_index(PassRels *r, int i)
{
	if (r->group_idx[i] == NULL && !r->group_missing[i])
	{
		PgqTable   *t = pgq_job_slot(&r->w, i);
		char	   *name = psprintf("%s_group_idx", RelationGetRelationName(t->rel));

		/* a slot restored from an older dump may lack it (hook.c makes it) */
		if (!OidIsValid(get_relname_relid(name, RelationGetNamespace(t->rel))))
			r->group_missing[i] = true;
		else
			r->group_idx[i] = index_open(pgq_slot_index_relid(t->rel, "group_idx"),
										 AccessShareLock);
		pfree(name);
	}
	return r->group_idx[i];
}

/*
 * Whether the visible row in slot was updated by this transaction in this
 * command: a row this pass took (its update is not visible to the pass's
 * snapshots, the old version is).
 */
static bool
pgq_taken_here(TupleTableSlot *slot)
{
	bool		should_free;
	HeapTuple	tup = ExecFetchSlotHeapTuple(slot, false, &should_free);
	HeapTupleHeader h = tup->t_data;
	bool		mine;

	mine = !(h->t_infomask & HEAP_XMAX_INVALID) &&
		!(h->t_infomask & HEAP_XMAX_IS_MULTI) &&
		!HEAP_XMAX_IS_LOCKED_ONLY(h->t_infomask) &&
		TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetRawXmax(h));
	if (should_free)
		heap_freetuple(tup);
	return mine;
}

/*
 * A grouped queue's walk of its groups in one pass: a scan of every slot's
 * queue_group_idx, each standing on an entry of the next group that slot
 * holds after the group served last (at[i]), and one snapshot, taken once
 * the queue's pass lock is held (see above).  A turn serves the least of
 * the slots' groups; the scans that stood on it read its entries and go on
 * to their next group, most often a few entries further on the same page:
 * a turn costs no descent.  A group with more than PGQ_GROUP_SKIP entries
 * left after its turn is passed with a new descent, and the round's wrap
 * to the first group takes one per slot.  The walk lives until the end of
 * the pass (pgq_group_walks_close), through the turns of every
 * pgq_take_grouped call of the queue in the pass.
 */
typedef struct GroupWalk
{
	Snapshot	snap;			/* registered */
	IndexScanDesc scans[PGQ_MAX_SLOTS]; /* NULL: not begun, or no index */
	int			nkeys[PGQ_MAX_SLOTS];	/* scans[i]'s keys: 1 or 2 */
	text	   *at[PGQ_MAX_SLOTS];	/* the group of the entry scans[i] stands
									 * on; NULL: none left */
	text	   *after[PGQ_MAX_SLOTS];	/* the group scans[i]'s key is after
										 * (its own copy: the key points to it) */
	text	   *qname;			/* the queue (the keys point to it) */
	int			n;				/* slots */
	Oid			coll;			/* the collation of group_key */
} GroupWalk;

#define PGQ_GROUP_SKIP 32

static List *group_walks = NIL; /* this pass's walks (pass memory) */
static uint64 group_walks_pass = 0; /* the pass group_walks belongs to */

/*
 * Whether groups a and b are the same: the same bytes (group_key has the
 * database's default collation, which is deterministic).
 */
static bool
pgq_same_group(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(b)) == 0;
}

/* Whether the entry scan stands on (xs_itup) is of group g. */
static bool
pgq_itup_of_group(IndexScanDesc scan, text *g)
{
	bool		isnull;
	Datum		d = index_getattr(scan->xs_itup, 2, scan->xs_itupdesc, &isnull);
	text	   *t;
	bool		same;

	if (isnull)
		return false;
	t = DatumGetTextPP(d);
	same = pgq_same_group(t, g);
	if ((Pointer) t != DatumGetPointer(d))
		pfree(t);
	return same;
}

/* Slot i's scan stands on a new entry (or none): at[i] becomes its group. */
static void
pgq_gwalk_stand(GroupWalk *walk, int i, bool found)
{
	bool		isnull = true;
	Datum		d = (Datum) 0;

	if (walk->at[i] != NULL)
		pfree(walk->at[i]);
	walk->at[i] = NULL;
	if (found)
		d = index_getattr(walk->scans[i]->xs_itup, 2, walk->scans[i]->xs_itupdesc, &isnull);
	if (!isnull)
		walk->at[i] = DatumGetTextPCopy(d);
}

/*
 * Set slot i's scan on the first entry of the queue's groups after group
 * after (NULL: of the first group): one descent.  The scan's keys point to
 * the walk's own copies of the queue's name and of after: a scan reads its
 * keys at each page it steps on, long after this call (the caller's after,
 * the group served last, is freed when the next group is served).
 */
static void
pgq_gwalk_seek(PassRels *r, GroupWalk *walk, int i, text *after)
{
	Relation	idx = pgq_group_index(r, i);
	ScanKeyData keys[2];
	int			nkeys = after != NULL ? 2 : 1;
	text	   *old_after = walk->after[i];

	if (idx == NULL)
		return;
	walk->after[i] = after == NULL ? NULL :
		(text *) memcpy(palloc(VARSIZE_ANY(after)), after, VARSIZE_ANY(after));
	walk->coll = idx->rd_indcollation[1];
	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   idx->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(walk->qname));
	if (after != NULL)
		ScanKeyEntryInitialize(&keys[1], 0, 2, BTGreaterStrategyNumber, InvalidOid,
							   walk->coll, F_TEXT_GT, PointerGetDatum(walk->after[i]));
	/* a scan's number of keys is fixed when it begins */
	if (walk->scans[i] != NULL && walk->nkeys[i] != nkeys)
	{
		index_endscan(walk->scans[i]);
		walk->scans[i] = NULL;
	}
	if (walk->scans[i] == NULL)
	{
		walk->scans[i] = pgq_index_beginscan(pgq_job_slot(&r->w, i)->rel, idx, walk->snap,
											 nkeys, 0);
		walk->scans[i]->xs_want_itup = true;
		walk->nkeys[i] = nkeys;
	}
	index_rescan(walk->scans[i], keys, nkeys, NULL, 0);
	if (old_after != NULL)
		pfree(old_after);		/* the scan's keys no longer point to it */
	pgq_gwalk_stand(walk, i, index_getnext_tid(walk->scans[i], ForwardScanDirection) != NULL);
}

/*
 * Slot i's scan stands among the entries of group g: move it to the first
 * entry of its next group.
 */
static void
pgq_gwalk_pass(PassRels *r, GroupWalk *walk, int i, text *g)
{
	int			k;

	for (k = 0; k < PGQ_GROUP_SKIP; k++)
	{
		bool		found = index_getnext_tid(walk->scans[i], ForwardScanDirection) != NULL;

		if (!found || !pgq_itup_of_group(walk->scans[i], g))
		{
			pgq_gwalk_stand(walk, i, found);
			return;
		}
	}
	pgq_gwalk_seek(r, walk, i, g);	/* a long group: a descent */
}

/*
 * Queue q's walk of its groups in this pass, begun (its snapshot taken, its
 * scans set after the group served last) if this is the pass's first turn
 * of q.  The caller holds q's pass lock.
 */
static GroupWalk *
pgq_gwalk(PassRels *r, QueueState *q, text *qname)
{
	GroupWalk  *walk;
	int			i;

	if (q->gwalk_pass == pass_count)
		return q->gwalk;
	if (group_walks_pass != pass_count)
	{
		group_walks = NIL;		/* an earlier pass's: ended with it */
		group_walks_pass = pass_count;
	}
	walk = palloc0(sizeof(GroupWalk));
	walk->n = r->w.jobs_view.n;
	walk->coll = DEFAULT_COLLATION_OID;
	walk->qname = (text *) memcpy(palloc(VARSIZE(qname)), qname, VARSIZE(qname));
	walk->snap = RegisterSnapshot(GetLatestSnapshot());
	group_walks = lappend(group_walks, walk);
	q->gwalk = walk;
	q->gwalk_pass = pass_count;
	for (i = 0; i < walk->n; i++)
		pgq_gwalk_seek(r, walk, i, q->gcursor);
	return walk;
}

/* The least group the walk's scans stand on (a copy); NULL: none. */
static text *
pgq_gwalk_least(GroupWalk *walk, Oid coll)
{
	text	   *least = NULL;
	int			i;

	for (i = 0; i < walk->n; i++)
		if (walk->at[i] != NULL &&
			(least == NULL ||
			 DatumGetInt32(DirectFunctionCall2Coll(bttextcmp, coll, PointerGetDatum(walk->at[i]),
												   PointerGetDatum(least))) < 0))
			least = walk->at[i];
	if (least == NULL)
		return NULL;
	return (text *) memcpy(palloc(VARSIZE(least)), least, VARSIZE(least));
}

/* End this pass's walks of groups (before the pass closes its relations). */
static void
pgq_group_walks_close(void)
{
	ListCell   *lc;

	if (group_walks_pass != pass_count)
	{
		group_walks = NIL;
		return;
	}
	foreach(lc, group_walks)
	{
		GroupWalk  *walk = (GroupWalk *) lfirst(lc);
		int			i;

		for (i = 0; i < walk->n; i++)
			if (walk->scans[i] != NULL)
				index_endscan(walk->scans[i]);
		UnregisterSnapshot(walk->snap);
	}
	group_walks = NIL;
}

/* A row of a group's walk that a turn may take. */
typedef struct GroupPick
{
	bool		has;
	int			slot;			/* index in the view */
	ItemPointerData tid;
	QueuePos	pos;
} GroupPick;

static void
pgq_group_pick(GroupPick *p, int slot, TupleTableSlot *row, const QueuePos *pos)
{
	if (p->has && pgq_row_cmp(&p->pos, pos) <= 0)
		return;
	p->has = true;
	p->slot = slot;
	p->tid = row->tts_tid;
	p->pos = *pos;
}

/*
 * The turn of group g in grouped queue q, the least group its walk stands
 * on: take its due job in retry, else its first due pending job when it has
 * room.  Returns whether it took one.  The scans that stood on g go on to
 * their next group.  The caller holds the queue's pass lock.
 */
static bool
pgq_take_group(PassRels *r, QueueState *q, text *qname, GroupWalk *walk, text *g,
			   TimestampTz now, int32 order, const PassStates *states)
{
	Oid			scheduled = DatumGetObjectId(states->scheduled);
	int64		in_flight = 0;
	GroupPick	retry;
	GroupPick	pending;
	GroupPick  *pick = NULL;
	bool		took = false;
	int			i;

	retry.has = pending.has = false;
	pgq_walks_close();			/* the slots' found rows are this turn's now */
	for (i = 0; i < walk->n; i++)
	{
		PgqTable   *t;
		IndexScanDesc scan = walk->scans[i];
		bool		standing = true;

		if (walk->at[i] == NULL || !pgq_same_group(walk->at[i], g))
			continue;
		t = pgq_job_slot(&r->w, i);
		for (;;)
		{
			bool		isnull;
			Oid			state;
			QueuePos	pos;
			bool		mine;

			/* the entry the scan stands on, then the group's next ones */
			if (!standing)
			{
				bool		found = index_getnext_tid(scan, ForwardScanDirection) != NULL;

				if (!found || !pgq_itup_of_group(scan, g))
				{
					pgq_gwalk_stand(walk, i, found);	/* on its next group */
					break;
				}
			}
			standing = false;
			if (!index_fetch_heap(scan, t->found))
				continue;		/* dead, or not visible */
			state = DatumGetObjectId(pgq_get(t, t->found, PGQ_COL_STATE, &isnull));
			pos.np = -(int64) DatumGetInt32(pgq_get(t, t->found, PGQ_COL_PRIORITY, &isnull));
			pos.ra = DatumGetTimestampTz(pgq_get(t, t->found, PGQ_COL_RUN_AFTER, &isnull));
			memcpy(&pos.id, DatumGetUUIDP(pgq_get(t, t->found, PGQ_COL_ID, &isnull)),
				   sizeof(pg_uuid_t));
			pos.has_id = true;
			mine = pgq_taken_here(t->found);
			if (state == scheduled)
				in_flight++;
			else if (state == states->retry)
			{
				in_flight++;
				if (mine)
					continue;
				if (pos.ra <= now)
					pgq_group_pick(&retry, i, t->found, &pos);
				else
					q->gfirst_later = Min(q->gfirst_later, pos.ra);
			}
			else if (state == states->pending)
			{
				if (mine)
				{
					in_flight++;	/* taken by this pass */
					continue;
				}
				if (pos.ra > now)
				{
					q->gfirst_later = Min(q->gfirst_later, pos.ra);
					continue;
				}
				/* the slot's first due pending job: the rest wait behind it */
				pgq_group_pick(&pending, i, t->found, &pos);
				pgq_gwalk_pass(r, walk, i, g);
				break;
			}
			CHECK_FOR_INTERRUPTS();
		}
		ExecClearTuple(t->found);
	}

	if (retry.has)
		pick = &retry;			/* it holds its place already */
	else if (pending.has && in_flight < q->group_max_in_flight)
		pick = &pending;
	else if (pending.has)
		q->gfull = true;		/* full: again when a place is freed */

	if (pick != NULL)
	{
		PgqTable   *t = pgq_job_slot(&r->w, pick->slot);
		TM_Result	res = TM_Invisible;

		if (table_tuple_fetch_row_version(t->rel, &pick->tid, walk->snap, t->found))
			res = pgq_take_row(r, t, qname, now, order, states);
		ExecClearTuple(t->found);
		if (res == TM_Ok)
			took = true;
		else
			q->gblocked = true; /* held or changed: the next pass looks again */
	}
	return took;
}

/*
 * Take the next job of grouped queue q (q->group_max_in_flight > 0): the
 * turns of its groups from the one after the group served last, until one
 * takes a job or a whole round took none (see above).  As pgq_take_one,
 * sets q->next_due when it took none: 0 when a group had a due job it
 * could not take now (full, held by another transaction, or the queue's
 * pass lock held by another pass), else when the first job not yet due is.
 */
static bool
pgq_take_grouped(PassRels *r, QueueState *q, TimestampTz now, int32 order,
				 const PassStates *states)
{
	text	   *qname = cstring_to_text(q->name);
	TimestampTz null_due = DT_NOEND;
	GroupWalk  *walk;

	if (q->gpass != pass_count)
	{
		int32		h = DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID,
															  PointerGetDatum(qname)));

		q->gpass = pass_count;
		q->gfull_wait = false;
		q->glocked = pgq_try_queue_lock(PGQ_CAP_LOCK_KEY, h);
		q->gidle = false;
		q->gidle_key = NULL;
		q->gblocked = false;
		q->gfull = false;
		q->gfirst_later = DT_NOEND;
	}
	if (!q->glocked)
	{
		/* another open pass puts this queue's jobs in flight */
		q->next_due = 0;
		return false;
	}

	walk = pgq_gwalk(r, q, qname);
	for (;;)
	{
		text	   *pos;
		bool		took;

		/* the group after the one served last; after the last, no group */
		pos = pgq_gwalk_least(walk, walk->coll);

		/*
		 * A whole round took nothing: back at (or past: its jobs may have
		 * gone meanwhile) the group where the round began.
		 */
		if (!q->gidle)
		{
			q->gidle = true;
			q->gidle_key = pos;
			q->gwrapped = false;
			q->gstarted = GetCurrentTimestamp();
		}
		else if (pos == NULL)
		{
			if (q->gwrapped || q->gidle_key == NULL)
				break;
			q->gwrapped = true;
		}
		else if (q->gwrapped &&
				 (q->gidle_key == NULL ||
				  DatumGetInt32(DirectFunctionCall2Coll(bttextcmp, walk->coll, PointerGetDatum(pos),
														PointerGetDatum(q->gidle_key))) >= 0))
			break;
		if (q->gcursor != NULL)
			pfree(q->gcursor);
		q->gcursor = pos == NULL ? NULL :
			(text *) MemoryContextAlloc(TopMemoryContext, VARSIZE(pos));
		if (pos != NULL)
			memcpy(q->gcursor, pos, VARSIZE(pos));
		if (pos == NULL)
		{
			int			i;

			/*
			 * Kept through the full walks for PGQ_GNULL_MAX_USECS: now
			 * lowered, even by a pass that is not one (a queue waiting
			 * for a place rounds again only at its recheck, which may
			 * fall between two full walks).
			 */
			if (now >= q->gnull_since + PGQ_GNULL_MAX_USECS)
				pgq_lower_head_anew(q, PG_INT64_MIN, DT_NOBEGIN, now);
			took = pgq_take_one(r, q, now, order, states);
			if (!took)
				null_due = q->next_due;
			/* the round wraps around: the scans go back to the first group */
			for (i = 0; i < walk->n; i++)
				pgq_gwalk_seek(r, walk, i, NULL);
		}
		else
			took = pgq_take_group(r, q, qname, walk, pos, now, order, states);
		if (took)
		{
			if (pos != NULL)
				q->gnull_takes++;
			q->gidle = false;
			return true;
		}
		CHECK_FOR_INTERRUPTS();
	}
	pgq_walks_close();
	q->next_due = q->gblocked ? 0 : Min(q->gfirst_later, null_due);

	/*
	 * Only full groups had a due job: the next round would find what this
	 * one found until a commit frees a place (or changes the settings), or
	 * a job is pushed or becomes due (the queue's notes, next_due).  The
	 * queue waits for that, but rounds again after 20 times this round's
	 * cost, at least 10 s after it, whatever happened (a round of 100,000
	 * full groups costs under a second): a place freed where no
	 * commit of this database says so (a prepared transaction's, an ack
	 * that read the queue's settings before it was grouped) is seen then.
	 */
	if (q->gfull && !q->gblocked)
	{
		TimestampTz end = GetCurrentTimestamp();

		q->gfull_wait = true;
		elog(DEBUG1, "pgqueue: queue \"%s\": every group with a due job is full, waiting for a place to be freed",
			 q->name);
		q->next_due = Min(q->next_due,
						  end + Max(PGQ_GROUP_RECHECK_USECS, 20 * (end - q->gstarted)));
	}
	return false;
}

/*
 * Take up to max_items jobs, each from the queue of the smallest tag in the
 * ready heap, which gets its next tag (fair queuing: see the file's
 * header); returns how many.  A capped queue without room in this pass is
 * set aside until its end; a queue without a due job left goes to the
 * later heap when it has a job due later.
 */
static int
pgq_take_by_tag(PassRels *r, TimestampTz now, int max_items, const PassStates *states)
{
	List	   *skipped = NIL;
	ListCell   *lc;
	QueueState *q;
	int			moved = 0;

	while (moved < max_items && !pairingheap_is_empty(ready_heap))
	{
		double		start;

		q = pairingheap_container(QueueState, node, pairingheap_remove_first(ready_heap));
		q->where = Q_IDLE;
		if (q->max_in_flight > 0 &&
			pgq_room(r, q, cstring_to_text(q->name)) <= 0)
		{
			skipped = lappend(skipped, q);	/* back after the pass */
			continue;
		}
		if (q->rate_limit > 0 && pgq_rate_room(q, now) <= 0)
		{
			if (q->rate == NULL || pgq_rate_free_at(q->rate) == DT_NOEND)
			{
				/*
				 * Another pass has its window (an open pgq_schedule call,
				 * or one with a later now wrote it): back after the pass,
				 * and the scheduler passes again in a moment.  That other
				 * pass's commit does not wake it: without the wake-up the
				 * queue waited for the next naptime.
				 */
				skipped = lappend(skipped, q);
				soonest_due = Min(soonest_due, now + PGQ_RATE_RETRY_USECS);
				continue;
			}
			/* its window is full: it waits until a release leaves it */
			q->next_due = pgq_rate_free_at(q->rate);
			q->rate_held = true;
			q->where = Q_LATER;
			pairingheap_add(later_heap, &q->node);
			soonest_due = Min(soonest_due, q->next_due);
			continue;
		}
		start = q->start;
		if (!(q->group_max_in_flight > 0 ?
			  pgq_take_grouped(r, q, now, moved + 1, states) :
			  pgq_take_one(r, q, now, moved + 1, states)))
		{
			if (q->next_due != DT_NOEND)
			{
				q->where = Q_LATER;
				pairingheap_add(later_heap, &q->node);
				if (q->next_due > now)
					soonest_due = Min(soonest_due, q->next_due);
			}
			continue;
		}
		moved++;
		if (q->max_in_flight > 0)
			q->room--;
		if (q->rate_limit > 0)
		{
			q->rate_room--;
			pgq_rate_count(q->rate);
		}
		vtime = Max(vtime, start);
		q->finish = pgq_tag(q);
		max_finish = Max(max_finish, q->finish);
		q->start = q->finish;
		q->where = Q_READY;
		pairingheap_add(ready_heap, &q->node);
	}
	foreach(lc, skipped)
	{
		q = (QueueState *) lfirst(lc);
		if (q->where == Q_IDLE)
		{
			q->where = Q_READY;
			pairingheap_add(ready_heap, &q->node);
		}
	}
	return moved;
}

/*
 * One scheduling pass of up to max_items jobs; returns how many it moved.
 * The caller must be inside a transaction; the jobs become claimable, and
 * waiting claims are woken, when that transaction commits.
 */
int
pgq_schedule_pass(int max_items)
{
	PassRels	r;
	TimestampTz now = GetCurrentTimestamp();	/* <= the rows' created */
	PgqScan		scan;
	char	  **names;
	PgqKey	   *keys;
	int			nnotes;
	char	  **own_names;
	PgqKey	   *own_keys;
	int			nown;
	bool		refresh;
	uint64		gen;
	uint64		pgen;
	int			moved;
	uint32	   *masks;
	uint32	   *own_masks;
	PassStates	states;
	PgqTable   *cur;
	int			i;

	pgq_write_begin(&r.w, "pgq_schedule", PGQ_OPEN_WORK | PGQ_OPEN_JOB);
	cur = r.w.job;
	memset(r.ready_idx, 0, sizeof(r.ready_idx));
	memset(r.sched_idx, 0, sizeof(r.sched_idx));
	memset(r.group_idx, 0, sizeof(r.group_idx));
	memset(r.group_missing, 0, sizeof(r.group_missing));

	/*
	 * No row of a slot is older than its low (ring.c: claims begin a slot's
	 * walk only there): a pass that began before its slot became current
	 * dates its rows from then.
	 */
	if (now < r.w.works_view.low[0])
		now = r.w.works_view.low[0];
	if (queues == NULL || queues_relid != r.w.jobs_view.parent)
		pgq_view_reset(r.w.jobs_view.parent);
	pass_count++;
	pass_in_xact = true;
	pass_subid = GetCurrentSubTransactionId();

	/* read before the snapshot: the bound (bounds.c), the notes, the settings */
	pgq_bound_begin(PGQ_BOUND_SCHED, true, &scan);
	scan.walk_goes_on = true;	/* the walks from the heads are the pass's */
	nnotes = pgq_read_ready_notes(&notes_pos, &names, &keys, &masks);
	nown = pgq_own_ready(&own_names, &own_keys, &own_masks);
	gen = pgq_settings_generation();
	pgen = pgq_places_generation();
	refresh = !view_valid || nnotes < 0 || nown < 0 || scan.full || now >= next_refresh ||
		IsolationUsesXactSnapshot();
	pgq_write_new_snapshot(&r.w);

	states.pending = DatumGetObjectId(pgq_state_datum(cur, "pending"));
	states.retry = DatumGetObjectId(pgq_state_datum(cur, "retry"));
	states.scheduled = pgq_state_datum(cur, "scheduled");

	if (!view_valid || gen != settings_gen)
	{
		settings_gen = gen;
		pgq_load_settings(&r);
	}

	/*
	 * Nothing was waiting since the last pass: virtual time catches up with
	 * the service given, so that a queue served then starts level with the
	 * others now (start-time fair queuing's idle rule).
	 */
	if (pairingheap_is_empty(ready_heap))
		vtime = Max(vtime, max_finish);

	if (refresh)
	{
		TimestampTz began = GetCurrentTimestamp();
		PgqKey		lowest;

		/*
		 * Every queue; heads from the SCHED bound, or from the start when its
		 * full walk is due; those of a trusted view are kept.
		 */
		bool		notes_read = view_valid && nnotes >= 0 && nown >= 0;
		bool		keep_heads = notes_read && !scan.full;

		/*
		 * A view kept through the refresh (one due by time, while the
		 * bound's full walk is not) takes the notes read for this pass
		 * too, before its lowest head is computed: they were read (and are
		 * not read again), and may lie below a queue's head (a higher
		 * priority, an earlier run_after).  Dropping them left such a job
		 * for the next full walk (specs/schedule_refresh.spec).  A full
		 * walk takes them too: its heads go back to the bound's start, but
		 * the notes say which grouped queues waiting for a place to be freed
		 * had a job pushed (those are made ready, the others keep waiting).
		 */
		if (notes_read)
			pgq_apply_notes(names, keys, masks, nnotes, own_names, own_keys, own_masks,
							nown, true);
		lowest = pgq_refresh_all(&r, scan.start, keep_heads, notes_read, now);
		pgq_bound_end(&scan, lowest);
		next_refresh = now + Max(1000 * INT64CONST(1000),
								 20 * (GetCurrentTimestamp() - began));
		view_valid = true;
	}
	else
		pgq_apply_notes(names, keys, masks, nnotes, own_names, own_keys, own_masks,
						nown, false);

	/*
	 * Places were freed since the last pass (an ack, a cancel, a failure
	 * ...; committed before pgen was read, so this pass's snapshots see
	 * them), or by this pass's own transaction: the grouped queues waiting
	 * for one round again.
	 */
	if (pgen != places_gen || pgq_own_places_freed())
	{
		HASH_SEQ_STATUS seq;
		QueueState *q;

		places_gen = pgen;
		hash_seq_init(&seq, queues);
		while ((q = hash_seq_search(&seq)) != NULL)
			if (q->gfull_wait)
			{
				elog(DEBUG1, "pgqueue: queue \"%s\": places were freed, its groups take turns again",
					 q->name);
				q->gfull_wait = false;
				if (q->where == Q_IDLE || q->where == Q_LATER)
					pgq_make_ready(q);
			}
	}

	/* queues whose jobs are due by now */
	pgq_ready_due(now);

	/* take the smallest tags */
	rate_windows = NIL;
	moved = pgq_take_by_tag(&r, now, max_items, &states);

	/* the releases of rate-limited queues count when this commits (rate.c) */
	{
		ListCell   *lc;

		foreach(lc, rate_windows)
			pgq_rate_save((PgqRateWindow *) lfirst(lc));
		list_free(rate_windows);
		rate_windows = NIL;
	}

	pgq_walks_close();
	pgq_group_walks_close();

	/*
	 * A full walk's cost is that of the walks from the heads it reset, not
	 * of the refresh (one descent per queue name): while VACUUM is held
	 * back they visit every entry left since, and the next full walk is
	 * spaced by what this one cost (bounds.c, rule 7).
	 */
	if (scan.owns_full)
	{
		scan.entries = 0;
		for (i = 0; i < r.w.jobs_view.n; i++)
			if (r.ready_idx[i] != NULL)
				scan.entries += pgq_index_entries_read(r.ready_idx[i]) - r.entries_base[i];
	}
	pgq_bound_full_done(&scan);

	/* a view from a transaction snapshot is older than the notes it read */
	if (IsolationUsesXactSnapshot())
		view_valid = false;

	for (i = 0; i < r.w.jobs_view.n; i++)
	{
		if (r.ready_idx[i] != NULL)
			index_close(r.ready_idx[i], NoLock);
		if (r.sched_idx[i] != NULL)
			index_close(r.sched_idx[i], NoLock);
		if (r.group_idx[i] != NULL)
			index_close(r.group_idx[i], NoLock);
	}
	pgq_write_end(&r.w);

	if (moved > 0)
	{
		/* its jobs stop counting for SCHED, its rows count for READY */
		pgq_bound_hold(PGQ_BOUND_SCHED);
		pgq_bound_lower_at_commit(PGQ_BOUND_READY, pgq_time_key(now));
		pgq_count(PGQ_SCHEDULED, moved);
		pgq_claimable_at_commit(moved);
	}
	return moved;
}

/*
 * When the earliest job that the last pass of this process saw not yet due
 * becomes due (its run_after), or DT_NOEND: none seen, or the view is not
 * to be trusted (the pass rolled back).  Jobs that were held by another
 * transaction, and jobs the pass did not look at, are not counted: the
 * scheduler's naptime covers them, as it covers jobs made ready behind the
 * API's back.
 */
TimestampTz
pgq_schedule_next_due(void)
{
	return view_valid ? soonest_due : DT_NOEND;
}

/*
 * Forget the view: the tables were written behind the API's back (a
 * restore, hook.c), so the next pass reloads the settings and walks every
 * queue from its start.
 */
void
pgq_schedule_forget(void)
{
	view_valid = false;
}

/*
 * At the end of a transaction: a pass that ran in it and rolled back took
 * jobs that are ready again below the heads it moved: walk everything next
 * time.  Called by publish.c's transaction callback (_PG_init registers
 * it there).
 */
void
pgq_schedule_at_xact_end(bool commit)
{
	if (pass_in_xact && !commit)
		view_valid = false;
	pass_in_xact = false;
	open_walks.q = NULL;		/* ended by the pass, or by the abort */
	group_walks = NIL;			/* the same */
}

/*
 * The same for a subtransaction that rolls back (ROLLBACK TO SAVEPOINT, an
 * exception block of PL/pgSQL) after a pass ran in it: its takes are undone
 * and no note says so, while the view had moved the heads past them (a
 * grouped queue keeps its head through full walks, and counted those takes
 * in flight).  Subtransaction ids grow, and every subtransaction begun
 * since the aborting one is inside it: the last pass ran in it if its id
 * is not below the aborting one's.  Registered by _PG_init.
 */
void
pgq_schedule_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							  SubTransactionId parentSubid, void *arg)
{
	if (event != SUBXACT_EVENT_ABORT_SUB || !pass_in_xact || pass_subid < mySubid)
		return;
	view_valid = false;
	open_walks.q = NULL;
	group_walks = NIL;
}

/*
 * The names of the queues that have entries in the queue_ready_idx of the
 * slots of pgqueue.queue, live, dead or marked dead, into *names, and for
 * each the slots whose index has some (PGQ_SLOT_BIT) into *masks; returns
 * how many.  They are read from the index tuples alone, one descent per
 * name and slot and no heap fetch: the entries that every scheduled job
 * leaves at the head of its queue's range (dead, but not removable while
 * an old snapshot holds VACUUM back) cost nothing here, where a loose index
 * scan in SQL would have to visit each of their heap tuples to learn that
 * it is gone.
 */
static int
pgq_ready_queue_names(PassRels *r, char ***names, uint32 **masks)
{
	HTAB	   *seen;
	HASHCTL		ctl;
	HASH_SEQ_STATUS seq;
	struct NameMask
	{
		char		name[PGQ_MAX_NAME_BYTES + 1];
		uint32		mask;
	}		   *e;
	int			n = 0;
	int			i;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = PGQ_MAX_NAME_BYTES + 1;
	ctl.entrysize = sizeof(struct NameMask);
	ctl.hcxt = CurrentMemoryContext;
	seen = hash_create("pgqueue queue names", 256, &ctl,
					   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);

	for (i = 0; i < r->w.jobs_view.n; i++)
	{
		PgqTable   *t = pgq_job_slot(&r->w, i);
		Relation	idx = pgq_pass_index(r, i, true);
		uint32		bit = PGQ_SLOT_BIT(r->w.jobs_view.slot[i]);
		IndexScanDesc scan;
		ScanKeyData key;
		Datum		last = (Datum) 0;

		scan = pgq_index_beginscan(t->rel, idx, GetActiveSnapshot(), 1, 0);
		scan->xs_want_itup = true;

		/*
		 * Entries marked dead (LP_DEAD, by scans that found their heap
		 * tuples gone) count too: once a long snapshot ends, other scans
		 * mark the many entries it kept, and skipping them, every descent
		 * here would walk all their leaf pages until VACUUM removes them.
		 */
		scan->ignore_killed_tuples = false;
		for (;;)
		{
			bool		isnull;
			bool		found;
			Datum		name;
			char	   *cname;

			/* first every name >= '', then the next one after the last found */
			if (last == (Datum) 0)
				ScanKeyEntryInitialize(&key, 0, 1, BTGreaterEqualStrategyNumber,
									   InvalidOid, idx->rd_indcollation[0],
									   F_TEXT_GE, CStringGetTextDatum(""));
			else
				ScanKeyEntryInitialize(&key, 0, 1, BTGreaterStrategyNumber,
									   InvalidOid, idx->rd_indcollation[0],
									   F_TEXT_GT, last);
			index_rescan(scan, &key, 1, NULL, 0);
			if (index_getnext_tid(scan, ForwardScanDirection) == NULL)
				break;
			name = index_getattr(scan->xs_itup, 1, scan->xs_itupdesc, &isnull);
			if (isnull)
				break;			/* queue is NOT NULL; NULLs sort last */
			last = PointerGetDatum(PG_DETOAST_DATUM_COPY(name));
			cname = TextDatumGetCString(last);
			if (strlen(cname) <= PGQ_MAX_NAME_BYTES)
			{
				e = hash_search(seen, cname, HASH_ENTER, &found);
				if (!found)
				{
					e->mask = 0;
					n++;
				}
				e->mask |= bit != 0 ? bit : PGQ_ALL_SLOTS;
			}
			CHECK_FOR_INTERRUPTS();
		}
		index_endscan(scan);
	}

	*names = palloc(sizeof(char *) * Max(n, 1));
	*masks = palloc(sizeof(uint32) * Max(n, 1));
	i = 0;
	hash_seq_init(&seq, seen);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		(*names)[i] = pstrdup(e->name);
		(*masks)[i++] = e->mask;
	}
	hash_destroy(seen);
	return n;
}
