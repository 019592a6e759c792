/*-------------------------------------------------------------------------
 *
 * pgqueue.h
 *		Declarations shared by the pgqueue source files.
 *
 * src/pgqueue.c	entry point (_PG_init) and GUCs
 * src/api.c		the SQL-callable job API (push, claim, ack, ...)
 * src/schedule.c	the scheduling pass
 * src/worker.c		the background worker (scheduler loop)
 * src/shmem.c		shared memory: counters, scheduler latches, the
 *					condition variable blocking claims sleep on, and the
 *					transaction callback that publishes both at commit
 * src/uuid7.c		time-ordered job ids
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_H
#define PGQUEUE_H

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/pg_list.h"
#include "utils/array.h"
#include "utils/uuid.h"

/* Limits on user input; documented in README.md. */
#define PGQ_MAX_NAME_BYTES		128		/* queue names */
#define PGQ_MAX_KEY_BYTES		256		/* lock_key, dedup_key */
#define PGQ_MAX_ITEMS			10000	/* max_items of claim/schedule */
#define PGQ_MAX_QUEUES_FILTER	100		/* elements of pgq_claim(queues) */
#define PGQ_MAX_BATCH			10000	/* payloads of pgq_push_batch */
#define PGQ_MAX_LEASE_USECS		(INT64CONST(7) * USECS_PER_DAY)
#define PGQ_MAX_WAIT_USECS		(INT64CONST(60) * USECS_PER_SEC)
#define PGQ_MAX_RETRY_USECS		(INT64CONST(365) * USECS_PER_DAY)
#define PGQ_MAX_DATABASES		32		/* entries of pgqueue.database */

/* GUCs, defined in pgqueue.c */
extern char *pgqueue_database;
extern int	pgqueue_naptime;
extern int	pgqueue_batch_size;
extern bool pgqueue_enabled;
extern int	pgqueue_max_payload_kb;

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

/* Lower bounds for scans of work_queue's indexes (shmem.c). */
typedef enum PgqHint
{
	PGQ_HINT_READY = 0,			/* work_queue_ready_idx: created */
	PGQ_HINT_LEASE,				/* work_queue_lease_idx: lock_timeout */
	PGQ_NUM_HINTS
} PgqHint;

/* A key of queue_ready_idx after the queue: (-priority, run_after). */
typedef struct PgqReadyKey
{
	int64		np;
	TimestampTz ra;
} PgqReadyKey;

/* pgqueue.c */
extern List *pgq_database_list(void);

/* shmem.c */
extern void pgq_shmem_install_hooks(void);
extern void pgq_xact_callbacks_register(void);
extern void pgq_count(PgqCounter counter, int64 n);
extern void pgq_count_now(PgqCounter counter, int64 n);
extern void pgq_wake_at_commit(int what);
extern void pgq_claimable_at_commit(int64 n);
extern void pgq_scheduler_attach(int dbindex);
extern bool pgq_db_known(int dbindex, int set);
extern void pgq_prepare_wait(bool filtered);
extern void pgq_wait_for_work(TimestampTz until);
extern void pgq_end_wait(bool filtered);
extern bool pgq_hint_get(PgqHint h, TimestampTz *bound, uint64 *epoch,
						 bool claim_full);
extern void pgq_hint_set(PgqHint h, TimestampTz bound, uint64 epoch, bool full);
extern void pgq_hint_lower_at_commit(PgqHint h, TimestampTz bound);
extern void pgq_hint_hold(void);
extern int	pgq_key_cmp(const PgqReadyKey *a, const PgqReadyKey *b);
extern bool pgq_sched_bound_get(PgqReadyKey *bound, uint64 *ticket);
extern void pgq_sched_bound_set(const PgqReadyKey *found, uint64 ticket, bool full);
extern void pgq_sched_lower_at_commit(int64 np, TimestampTz ra);
extern void pgq_sched_moved(void);

/* schedule.c; caller must be connected to SPI inside a transaction */
extern int	pgq_schedule_pass(int max_items);

/* claimscan.c; caller must be inside a transaction */
extern ArrayType *pgq_lock_ready(int max_items, ArrayType *queues);
extern ArrayType *pgq_ready_queue_names(void);
extern TimestampTz pgq_first_expired(TimestampTz from, TimestampTz now, bool *found);
extern Oid	pgq_relid(Oid nsp, const char *name);

/* uuid7.c */
extern void pgq_uuid7(pg_uuid_t *uuid);

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

/* api.c helpers shared with schedule.c */
extern SPIPlanPtr pgq_keep_plan(SPIPlanPtr *cache, const char *sql,
								int nargs, Oid *argtypes);
extern PgqLayout pgq_layout(void);

#endif							/* PGQUEUE_H */
