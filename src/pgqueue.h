/*-------------------------------------------------------------------------
 *
 * pgqueue.h
 *		Declarations shared by the pgqueue source files.
 *
 * src/pgqueue.c	entry point (_PG_init) and GUCs
 * src/api.c		the SQL-callable job API (push, claim, ack, ...)
 * src/schedule.c	the scheduling pass
 * src/launcher.c	the launcher: starts a scheduler per database
 * src/worker.c		the scheduler background worker (scheduler loop)
 * src/shmem.c		shared memory: counters, scheduler latches, the
 *					condition variable blocking claims sleep on, and the
 *					transaction callback that publishes both at commit
 * src/uuid7.c		time-ordered job ids
 * src/admin.c		the operator API: retry, cancel, purge, periodic jobs
 * src/archive.c	pgqueue.archive: writing finished jobs, its partitions
 * src/ring.c		the slots of queue and work_queue: the view, the rings
 * src/retire.c		removing partitions made at run time without failing a
 *					pg_dump: retired first, dropped once no older
 *					snapshot is left
 * src/hook.c		the utility hook: restores pause the scheduler, and
 *					database commands hold it off
 * src/pgq_compat.h	the calls that differ between PostgreSQL majors
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_H
#define PGQUEUE_H

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/execnodes.h"
#include "nodes/pg_list.h"
#include "executor/tuptable.h"
#include "utils/array.h"
#include "utils/rel.h"
#include "utils/jsonb.h"
#include "utils/snapshot.h"
#include "utils/uuid.h"
#include "storage/lock.h"

#include "pgq_compat.h"

/* Limits on user input; documented in docs/sql-reference.md ("Limits and errors"). */
#define PGQ_MAX_NAME_BYTES		128		/* queue names */
#define PGQ_MAX_KEY_BYTES		256		/* lock_key, dedup_key */
#define PGQ_MAX_ITEMS			10000	/* max_items of claim/schedule */
#define PGQ_MAX_QUEUES_FILTER	100		/* elements of pgq_claim(queues) */
#define PGQ_MAX_BATCH			10000	/* payloads of pgq_push_batch */
#define PGQ_MAX_LEASE_USECS		(INT64CONST(7) * USECS_PER_DAY)
#define PGQ_MAX_WAIT_USECS		(INT64CONST(60) * USECS_PER_SEC)
#define PGQ_MAX_RETRY_USECS		(INT64CONST(365) * USECS_PER_DAY)
#define PGQ_MAX_RETENTION_USECS	(INT64CONST(365) * USECS_PER_DAY)	/* pgq_configure */
#define PGQ_MAX_PERIOD_USECS	(INT64CONST(365) * USECS_PER_DAY)	/* pgq_push_periodic */
#define PGQ_MAX_DATABASES		32		/* entries of pgqueue.database */

/*
 * A scheduler pauses while a session loads pgqueue's tables in its database
 * (a restore), and for this long after its latest such statement or its
 * end (hook.c): long enough to cover the gap between the sections of a
 * restore run as separate pg_restore invocations.
 */
#define PGQ_RESTORE_GRACE_SECS	60
/* How long such a session waits, at most, for a pass already under way. */
#define PGQ_RESTORE_WAIT_MS		5000
/*
 * How long a CREATE, ALTER or DROP DATABASE waits, at most, for the
 * scheduler it holds off to be gone before it runs (hook.c); the command
 * then waits up to 5 s more for other sessions itself.
 */
#define PGQ_HOLD_WAIT_MS		10000

/* max_tries of a queue without settings (pgq_configure, pgqueue.queues) */
#define PGQ_DEFAULT_MAX_TRIES	5

/* A queue's max_tries in SQL, s being its pgqueue.queues row (or NULL). */
#define PGQ_SQL_MAX_TRIES "coalesce(s.max_tries, " CppAsString2(PGQ_DEFAULT_MAX_TRIES) ")"

/*
 * The jobs found on their last try fail: the CTEs that end the statements
 * that steal expired leases (claim.c) and release a holder's jobs (api.c).
 * Each builds a CTE "j" (id, tries, version, max_tries, last_try, reason)
 * of the work_queue rows it locked; of those on their last try, these
 * delete the work_queue rows (dw) and set the jobs 'failed' with last_error
 * = reason (dq).  TRIES and VERSION are what the job row gets: its own
 * (1.0, where a claim wrote them there) or j's (1.1, from work_queue).
 */
#define PGQ_SQL_FAIL_LAST_TRIES(TRIES, VERSION) \
" dw AS (" \
"  DELETE FROM pgqueue.work_queue w" \
"   WHERE w.id = ANY (ARRAY(SELECT j.id FROM j WHERE j.last_try))" \
"  RETURNING w.id)," \
" dq AS (" \
"  UPDATE pgqueue.queue q" \
"     SET state = 'failed', tries = " TRIES ", version = " VERSION "," \
"         last_error = j.reason" \
"    FROM j" \
"   WHERE q.id = ANY (ARRAY(SELECT dw.id FROM dw)) AND j.id = q.id" \
"  RETURNING q.id)"

/* 1.0: the attempt count and max_tries of the job of CTE row "x". */
#define PGQ_SQL_JOB_TRIES_10(X) \
"CROSS JOIN LATERAL (" \
"  SELECT q.tries, coalesce((SELECT s.max_tries FROM pgqueue.queues s" \
"                             WHERE s.queue = q.queue), " CppAsString2(PGQ_DEFAULT_MAX_TRIES) ") AS max_tries" \
"    FROM pgqueue.queue q WHERE q.id = " X ".id LIMIT 1) q" 

/* GUCs, defined by _PG_init (pgqueue.c); each variable where it is used */
extern char *pgqueue_database;	/* launcher.c */
extern int	pgqueue_naptime;	/* worker.c */
extern int	pgqueue_batch_size; /* worker.c */
extern bool pgqueue_enabled;	/* common.c */
extern int	pgqueue_max_payload_kb; /* api.c */

/* Cumulative counters kept in shared memory (shmem.c). */
typedef enum PgqCounter
{
	PGQ_PUSHED = 0,
	PGQ_SCHEDULED,
	PGQ_CLAIMED,
	PGQ_ACKED,
	PGQ_NACKED,
	PGQ_FAILED,
	PGQ_STOLEN,
	PGQ_PASSES,
	PGQ_NUM_COUNTERS
} PgqCounter;

/* What a committing transaction must tell others (shmem.c). */
#define PGQ_WAKE_SCHEDULER	0x01	/* new or returned jobs to schedule */
#define PGQ_WAKE_CLAIMERS	0x02	/* new claimable rows in work_queue */
#define PGQ_WAKE_ON_ABORT	0x04	/* rows locked: a rollback frees them */

/* Scan bounds (bounds.c). */
typedef enum PgqBoundId
{
	PGQ_BOUND_READY = 0,		/* work_queue_ready_idx: (0, created) */
	PGQ_BOUND_LEASE,			/* work_queue_lease_idx: (0, lock_timeout) */
	PGQ_BOUND_SCHED,			/* queue_ready_idx: (-priority, run_after) */
	PGQ_NUM_BOUNDS
} PgqBoundId;

/* A key of a bound, compared as (hi, lo). */
typedef struct PgqKey
{
	int64		hi;
	TimestampTz lo;
} PgqKey;

/* A walk of a bound's index, from pgq_bound_begin to pgq_bound_end. */
typedef struct PgqScan
{
	PgqBoundId	id;
	PgqKey		start;			/* where to start the walk */
	bool		full;			/* from the start: the bound is not used */
	bool		owns_full;		/* this walk took the full walk that was due */
	bool		walk_goes_on;	/* pgq_bound_full_done is the caller's */
	int64		entries;		/* index entries it read, if counted (-1: not) */
	bool		raise;			/* its result may raise the bound */
	uint64		ticket;
	TimestampTz began;
} PgqScan;

/*
 * The layout of the pgqueue tables in the current database: the SQL objects
 * of version 1.0, or of 1.1 (work_queue keeps a job's tries and version,
 * no foreign key).  Values index arrays of statements.
 */
typedef enum PgqLayout
{
	PGQ_V10 = 0,
	PGQ_V11 = 1
} PgqLayout;

/* launcher.c */
PGDLLEXPORT void pgq_launcher_main(Datum main_arg);
extern List *pgq_database_list(void);

/* shmem.c */
extern void pgq_shmem_install_hooks(void);
extern void pgq_scheduler_attach(int dbindex);
extern bool pgq_scheduler_register(int dbindex);
extern pid_t pgq_scheduler_running(int dbindex);
extern void pgq_call_begin(void);
extern void pgq_call_end(void);
extern void pgq_calls_at_xact_end(void);
extern void pgq_calls_at_subxact_abort(SubTransactionId subid);
extern uint32 pgq_call_of(VirtualTransactionId vxid);
extern bool pgq_scheduler_attached(void);
extern bool pgq_restore_note(void);
extern bool pgq_restore_pass_begin(pid_t *restorer);
extern void pgq_restore_pass_end(void);
extern void pgq_restore_forget(void);
extern bool pgq_hold_take(int dbindex, pid_t *running);
extern void pgq_hold_release(void);
extern bool pgq_scheduler_held(int dbindex);
extern pid_t pgq_hold_holder(int dbindex);
extern void pgq_launcher_attach(void);

/* hook.c */
extern bool pgq_is_pgqueue_process;
extern void pgq_hook_install(void);

/* publish.c */
typedef void (*PgqXactEndCallback) (bool commit);
extern void pgq_xact_callbacks_register(PgqXactEndCallback at_xact_end);
extern void pgq_count(PgqCounter counter, int64 n);
extern void pgq_count_now(PgqCounter counter, int64 n);
extern void pgq_wake_at_commit(int what);
extern void pgq_claimable_at_commit(int64 n);
extern void pgq_ready_at_commit(text *queue, PgqKey key, uint32 slots);
extern void pgq_settings_changed_at_commit(void);
extern int	pgq_read_ready_notes(uint64 *pos, char ***names, PgqKey **keys, uint32 **slots);
extern int	pgq_own_ready(char ***names, PgqKey **keys, uint32 **slots);
extern uint64 pgq_settings_generation(void);
extern void pgq_prepare_wait(bool filtered);
extern void pgq_wait_for_work(TimestampTz until);
extern void pgq_end_wait(bool completed);

/* bounds.c */
extern int	pgq_key_cmp(const PgqKey *a, const PgqKey *b);
extern PgqKey pgq_time_key(TimestampTz ts);
extern void pgq_bound_begin(PgqBoundId id, bool may_raise, PgqScan *scan);
extern void pgq_bound_end(PgqScan *scan, PgqKey first);
extern void pgq_bound_full_done(PgqScan *scan);
extern void pgq_bound_lower_at_commit(PgqBoundId id, PgqKey key);
extern void pgq_bound_hold(PgqBoundId id);
extern void pgq_bounds_at_xact_end(bool commit);

/* schedule.c; caller must be connected to SPI inside a transaction */
extern int	pgq_schedule_pass(int max_items);
extern TimestampTz pgq_schedule_next_due(void);
extern void pgq_schedule_at_xact_end(bool commit);
extern void pgq_schedule_forget(void);

/* claim.c */
extern void pgq_claim_jobs(ReturnSetInfo *rsinfo, text *key, int max_items,
						   Datum lease, ArrayType *queues, TimestampTz wait_until);

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
	PGQ_NUM_COLS
} PgqCol;

/* One table opened for writing in a call. */
typedef struct PgqTable
{
	bool		is_open;
	bool		indexes_open;	/* rri's indexes opened (for inserts, updates) */
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
#define PGQ_MAX_SLOTS 64

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

/* jobs.c: push, extend, ack and nack of one job (or a few) */

/* A queue's settings (pgqueue.queues, or the defaults). */
typedef struct PgqQueueSettings
{
	bool		found;			/* the queue has a row */
	int32		weight;
	int32		max_in_flight;
	int32		max_tries;
	bool		paused;
	int64		retention;		/* usecs; 0: no archive */
} PgqQueueSettings;

extern void pgq_queue_settings(Datum queue, Snapshot snapshot, PgqQueueSettings *s);
extern int32 pgq_push_job(pg_uuid_t *id, text *queue, Jsonb *payload,
						  bool has_run_after, TimestampTz run_after, int32 priority);
extern int32 pgq_push_jobs(pg_uuid_t *ids, Datum *payloads, int n, text *queue,
						  bool has_run_after, TimestampTz run_after, int32 priority);
extern bool pgq_extend_job(Datum id, text *key, Datum lease, TimestampTz *deadline);
extern int	pgq_ack_jobs(Datum *ids, int n, text *key);
extern const char *pgq_nack_job(Datum id, text *key, text *error,
								bool has_retry_in, Datum retry_in);

/* uuid7.c */
extern void pgq_uuid7(pg_uuid_t *uuid);


/* common.c: the helpers of every layer */

/* A statement that pgq_subxact runs (pgq_execute_moving, admin.c). */
typedef struct PgqStatement
{
	SPIPlanPtr	plan;
	Datum	   *args;
	const char *nulls;
	int			rc;				/* SPI result code */
} PgqStatement;

extern int	pgq_spi_ddl(const char *sql);
extern bool pgq_in_own_ddl(void);
extern SPIPlanPtr pgq_keep_plan(SPIPlanPtr *cache, const char *sql,
								int nargs, Oid *argtypes);
extern int	pgq_spi_connect(void);
extern void pgq_spi_finish(int nest);
extern ErrorData *pgq_subxact(void (*fn) (void *), void *arg, int catch_code);
extern void pgq_upkeep_try(void (*fn) (void *), void *arg, const char *what,
						   const char *hint);
extern int	pgq_execute_moving(SPIPlanPtr plan, Datum *args, const char *nulls);
extern int64 pgq_interval_usecs(Datum interval);
extern TimestampTz pgq_deadline(TimestampTz from, Datum interval);
extern void pgq_require(FunctionCallInfo fcinfo, int argno, const char *argname);
extern text *pgq_checked_text_arg(FunctionCallInfo fcinfo, int argno,
								  const char *argname, int maxbytes);
extern char *pgq_text_arg(FunctionCallInfo fcinfo, int argno,
						  const char *argname, int maxbytes);
extern int64 pgq_interval_arg(FunctionCallInfo fcinfo, int argno,
							  const char *argname, int64 min_usecs,
							  int64 max_usecs, const char *max_text);
extern int	pgq_max_items_arg(FunctionCallInfo fcinfo, int argno);

/* api.c */
extern Datum pgq_push(PG_FUNCTION_ARGS);

/*
 * archive.c.  A job leaving pgqueue.queue is archived when its queue has a
 * retention (pgqueue.queues.retention > 0): the path that finishes it
 * reads the retention where it reads the queue's settings row, and, when
 * positive, calls pgq_archive_job in the same transaction with the values
 * of the job row it removed (tries from the work_queue row when it had
 * one).  1.1 databases only.
 */
typedef enum PgqOutcome
{
	PGQ_OUTCOME_ACKED = 0,
	PGQ_OUTCOME_CANCELLED,
	PGQ_OUTCOME_PURGED
} PgqOutcome;

typedef struct PgqFinishedJob
{
	Datum		id;				/* uuid */
	Datum		queue;			/* text */
	Datum		payload;		/* jsonb */
	int32		priority;
	int32		tries;
	TimestampTz created;
	Datum		last_error;		/* text, unless last_error_null */
	bool		last_error_null;
} PgqFinishedJob;

/*
 * The columns pgq_archive_spi_rows reads, in this order, from a statement
 * that removed jobs: the queue's retention (NULL: none), then the job's.
 */
#define PGQ_ARCHIVE_COLUMNS(RETENTION, TRIES, PAYLOAD) \
	RETENTION ", q.id, q.queue, q.priority, " TRIES ", q.created, q.last_error, " PAYLOAD

extern int64 pgq_retention_usecs(Datum retention, bool isnull);
extern void pgq_archive_job(const PgqFinishedJob *job, PgqOutcome outcome,
							int64 retention_usecs);
extern void pgq_archive_spi_rows(SPITupleTable *tab, uint64 n, int col,
								 PgqOutcome outcome);
extern Oid	pgq_archive_cover(TimestampTz expires);
extern void pgq_archive_prepare(int64 retention_usecs);
extern bool pgq_archive_maintain_wanted(void);
extern void pgq_archive_maintain(void);

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

#endif							/* PGQUEUE_H */
