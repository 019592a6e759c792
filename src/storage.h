/*-------------------------------------------------------------------------
 *
 * storage.h
 *		The storage layer (src/README): pgqueue's tables as the layers
 *		above use them.  tables.c finds and writes their rows by primary
 *		key, ring.c says which slots (partitions) of pgqueue.queue and
 *		pgqueue.work_queue calls visit and turns their rings, retire.c
 *		removes partitions made at run time without failing a pg_dump,
 *		uuid7.c makes job ids.
 *
 * Includes the layer below, shmem.h, and through it common.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_STORAGE_H
#define PGQUEUE_STORAGE_H

#include "executor/tuptable.h"
#include "utils/rel.h"
#include "utils/snapshot.h"
#include "utils/uuid.h"

#include "shmem.h"

/*
 * The layout of the pgqueue tables in the current database: the SQL objects
 * of version 1.0, of 1.1 (work_queue keeps a job's tries and version, no
 * foreign key), or of 1.2 (a job's own max_tries, in its queue row and,
 * once scheduled, its work_queue row).  Values index arrays of statements;
 * each layout has what the one before it has ("layout >= PGQ_V11").
 */
typedef enum PgqLayout
{
	PGQ_V10 = 0,
	PGQ_V11 = 1,
	PGQ_V12 = 2
} PgqLayout;

#define PGQ_NUM_LAYOUTS 3

/* tables.c: direct access to pgqueue's tables for the per-job calls */

/* Columns of pgqueue.queue and pgqueue.work_queue, by name. */
typedef enum PgqCol
{
	PGQ_COL_ID = 0,
	PGQ_COL_QUEUE,
	PGQ_COL_CREATED,
	PGQ_COL_VERSION,
	PGQ_COL_TRIES,
	PGQ_COL_STATE,
	PGQ_COL_PRIORITY,
	PGQ_COL_RUN_AFTER,
	PGQ_COL_PAYLOAD,
	PGQ_COL_DEDUP_KEY,
	PGQ_COL_LAST_ERROR,
	PGQ_COL_BATCH_ORDER,
	PGQ_COL_STARTED,
	PGQ_COL_LOCK_KEY,
	PGQ_COL_LOCK_TIMEOUT,
	PGQ_COL_SLOT,
	PGQ_COL_MAX_TRIES,			/* 1.2 */
	PGQ_COL_WAITING_FOR,		/* 1.2, pgqueue.queue only */
	PGQ_COL_HAS_CHILDREN,		/* 1.2, pgqueue.queue only */
	PGQ_COL_GROUP_KEY,			/* 1.2, pgqueue.queue only */
	PGQ_NUM_COLS
} PgqCol;

/* One table opened for writing in a call. */
typedef struct PgqTable
{
	bool		indexes_open;	/* rri's indexes opened (for inserts, updates) */
	Oid			group_idx;		/* 1.2: its group_idx, opened when a row with
								 * a group_key is written (pgq_table_indexes) */
	bool		group_idx_last; /* ... opened: rri's last index, which a row
								 * without a group_key leaves out */
	int32		slot;			/* the slot it is (1.1), its slot column's value */
	Relation	rel;
	Relation	pkey;			/* the primary key index, on id */
	struct ResultRelInfo *rri;	/* with the indexes opened */
	TupleTableSlot *found;		/* the row found (pgq_find) */
	TupleTableSlot *next;		/* the version being written */
	AttrNumber	att[PGQ_NUM_COLS];	/* InvalidAttrNumber: no such column */
} PgqTable;

/*
 * Most slots a table has (ring.c): 32 as a rule, up to 64 while readers
 * pin slots the ring cannot reuse.  The pass's slot masks have a bit for
 * slots 0-31; a slot past them is always walked.
 */
#define PGQ_MAX_SLOTS 64		/* a bit of a uint64 each (PgqWrite) */

/*
 * The slots of pgqueue.queue or pgqueue.work_queue that calls visit, as
 * the ring's last committed state says (ring.c): the current slot first
 * (where rows are inserted), then the others that may hold rows, newest
 * first.  A 1.0 database's table is one slot.
 */
typedef struct PgqRingView
{
	Oid			parent;			/* the table (a 1.0 table is its own slot) */
	int			n;
	Oid			relid[PGQ_MAX_SLOTS];
	int32		slot[PGQ_MAX_SLOTS];
	TimestampTz low[PGQ_MAX_SLOTS];	/* no row of the slot has an older created */
	TimestampTz since[PGQ_MAX_SLOTS];	/* when it last became current */
} PgqRingView;

/* A slot number's bit in a mask of slots (0: a number past the mask's). */
#define PGQ_SLOT_BIT(s) ((s) >= 0 && (s) < 32 ? ((uint32) 1) << (s) : (uint32) 0)
#define PGQ_ALL_SLOTS	((uint32) 0xFFFFFFFF)

/* A call writing pgqueue's tables: pgq_write_begin .. pgq_write_end. */
typedef struct PgqWrite
{
	struct EState *estate;
	Snapshot	snapshot;
	CommandId	cid;
	PgqLayout	layout;
	uint64		works_open;		/* a bit for each of works[] opened */
	uint64		jobs_open;		/* the same for jobs[] */
	PgqRingView works_view;		/* work_queue's slots */
	PgqRingView jobs_view;		/* queue's slots */
	PgqTable	works[PGQ_MAX_SLOTS];	/* opened on demand (pgq_work_slot) */
	PgqTable   *work;			/* the current slot of work_queue, or where
								 * pgq_find_work found a row */
	PgqTable	jobs[PGQ_MAX_SLOTS];	/* opened on demand (pgq_job_slot) */
	PgqTable   *job;			/* the current slot of queue (pgq_write_job),
								 * or where pgq_find_job found a row */
	bool		row_gone;		/* a write found its row deleted meanwhile */
} PgqWrite;

typedef bool (*PgqRowCheck) (PgqTable *t, void *arg);
typedef void (*PgqRowBuild) (PgqTable *t, void *arg);

#define PGQ_OPEN_WORK	0x01		/* open pgqueue.work_queue */
#define PGQ_OPEN_JOB	0x02		/* open pgqueue.queue */

extern void pgq_write_begin(PgqWrite *w, const char *fn, int open);
extern void pgq_write_new_snapshot(PgqWrite *w);
extern PgqTable *pgq_write_job(PgqWrite *w);
extern void pgq_table_indexes(PgqTable *t);
extern void pgq_table_index_row(PgqWrite *w, PgqTable *t, bool update,
								bool only_summarizing);
extern void pgq_write_end(PgqWrite *w);
extern void pgq_write_changes(PgqWrite *w, PgqTable *t, const PgqCol *cols, int ncols);
extern bool pgq_find(PgqWrite *w, PgqTable *t, Datum id);
extern PgqTable *pgq_work_slot(PgqWrite *w, int i);
extern PgqTable *pgq_find_work(PgqWrite *w, Datum id);
extern void pgq_work_slot_used(PgqTable *t);
extern bool pgq_write_work(PgqWrite *w, Datum id, PgqRowCheck check, PgqRowBuild build,
						   void *arg, const PgqCol *changes, int nchanges);
extern PgqTable *pgq_job_slot(PgqWrite *w, int i);
extern PgqTable *pgq_find_job(PgqWrite *w, Datum id);
extern bool pgq_write_job_row(PgqWrite *w, Datum id, PgqRowCheck check, PgqRowBuild build,
							  void *arg, const PgqCol *changes, int nchanges);
extern void pgq_job_row_missing(Datum id);
typedef bool (*PgqRowMatch) (Relation rel, TupleTableSlot *slot, void *arg);
extern int	pgq_rel_rows(Oid relid, Snapshot snap, PgqRowMatch match, void *arg, int max);
extern bool pgq_delete_found(PgqWrite *w, PgqTable *t, PgqRowCheck check, void *arg);
extern bool pgq_update_found(PgqWrite *w, PgqTable *t, PgqRowCheck check,
							 PgqRowBuild build, void *arg);
extern void pgq_insert(PgqWrite *w, PgqTable *t, Datum *values, bool *isnull);
extern Datum pgq_get(PgqTable *t, TupleTableSlot *slot, PgqCol c, bool *isnull);
extern void pgq_set(PgqTable *t, PgqCol c, Datum value, bool isnull);
extern bool pgq_text_equals(PgqTable *t, PgqCol c, text *key);
extern Datum pgq_state_datum(PgqTable *t, const char *label);
extern Oid	pgq_relid(Oid nsp, const char *name);
extern PgqLayout pgq_layout(void);
extern Oid	pgq_slot_index_relid(Relation rel, const char *role);

/* ring.c: the slots of pgqueue.queue and pgqueue.work_queue */
extern int	pgqueue_slot_size_kb;
extern void pgq_ring_view(Oid nsp, const char *name, PgqRingView *v);
extern void pgq_ring_check_full(void);
extern bool pgq_ring_maintain_wanted(void);
extern void pgq_ring_maintain(void);
extern bool pgq_ring_move_wanted(void);
extern void pgq_ring_move(void);
extern bool pgq_ring_shrink_wanted(void);
extern void pgq_ring_shrink(void);
extern bool pgq_ring_stats_flush_wanted(void);
extern void pgq_ring_forget(void);
extern char *pgq_group_index_ddl(const char *slot);

/*
 * retire.c: a partition made at run time is retired (detached, made a
 * member of the extension: pg_dump skips it) instead of dropped, and
 * dropped once no snapshot from before its retirement is left.
 */
extern void pgq_retire_partition(Oid parent, Oid relid);
extern bool pgq_snapshots_before(TransactionId xid);
extern bool pgq_standby_snapshots_before(TransactionId xid);
extern void pgq_standby_conflict(Relation rel, TransactionId xid);
extern bool pgq_retired_drop_wanted(void);
extern void pgq_retired_drop(void);

/* uuid7.c */
extern void pgq_uuid7(pg_uuid_t *uuid);

#endif							/* PGQUEUE_STORAGE_H */
