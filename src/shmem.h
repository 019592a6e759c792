/*-------------------------------------------------------------------------
 *
 * shmem.h
 *		The layer of shared memory and wake-ups (src/README): what the
 *		layers above use of shmem.c (the per-database slots, who runs,
 *		restores and holds, the calls under way), publish.c (what a
 *		transaction publishes at commit, the sleep of a blocking claim)
 *		and bounds.c (the scan bounds).
 *
 * The layout of the shared memory itself is in shmem_internal.h, which
 * only those three files include.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_SHMEM_H
#define PGQUEUE_SHMEM_H

#include "storage/lock.h"
#include "utils/array.h"

#include "common.h"

/*
 * A scheduler pauses while a session loads pgqueue's tables in its database
 * (a restore), and for this long after its latest such statement or its
 * end (hook.c): long enough to cover the gap between the sections of a
 * restore run as separate pg_restore invocations.
 */
#define PGQ_RESTORE_GRACE_SECS	60
/* How long such a session waits, at most, for a pass already under way. */
#define PGQ_RESTORE_WAIT_MS		5000

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

/* What a committing transaction must tell others (publish.c). */
#define PGQ_WAKE_SCHEDULER	0x01	/* new or returned jobs to schedule */
#define PGQ_WAKE_CLAIMERS	0x02	/* new claimable rows in work_queue */
#define PGQ_WAKE_ON_ABORT	0x04	/* rows locked: a rollback frees them */
#define PGQ_WAKE_PLACES		0x08	/* places under a limit freed (1.2 groups) */

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
	bool		memo_ok;		/* rule 8: may use and keep a session's start */
	bool		from_memo;		/* it starts at the session's start */
	uint64		memo_gen;
} PgqScan;

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
extern uint64 pgq_places_generation(void);
extern bool pgq_own_places_freed(void);
extern void pgq_prepare_wait(bool filtered);
extern void pgq_wait_for_work(TimestampTz until);
extern void pgq_end_wait(bool completed);

/* bounds.c */
extern int	pgq_key_cmp(const PgqKey *a, const PgqKey *b);
extern PgqKey pgq_time_key(TimestampTz ts);
extern void pgq_bound_begin(PgqBoundId id, bool may_raise, PgqScan *scan);
extern void pgq_bound_end(PgqScan *scan, PgqKey first);
extern void pgq_bound_full_done(PgqScan *scan);
extern void pgq_bound_memo_apply(PgqScan *scan, ArrayType *queues);
extern void pgq_bound_memo_store(PgqScan *scan, ArrayType *queues, PgqKey upto,
								 int64 passed);
extern void pgq_bound_lower_at_commit(PgqBoundId id, PgqKey key);
extern void pgq_bound_hold(PgqBoundId id);
extern void pgq_bounds_at_xact_end(bool commit);
extern void pgq_bounds_at_prepare(void);

#endif							/* PGQUEUE_SHMEM_H */
