/*-------------------------------------------------------------------------
 *
 * shmem_internal.h
 *		The layout of pgqueue's shared memory, for the files of its layer
 *		that use it directly (shmem.c, publish.c, bounds.c); the others
 *		go through what shmem.h declares.
 *
 * It exists only when the library is in shared_preload_libraries;
 * pgq_shared is NULL otherwise, and so is every slot.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_SHMEM_INTERNAL_H
#define PGQUEUE_SHMEM_INTERNAL_H

#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/spin.h"

#include "shmem.h"

/*
 * Slots: the first PGQ_MAX_DATABASES are reserved for the databases of
 * pgqueue.database, by their index there, so that a scheduler always finds
 * one; the PGQ_SHARED_SLOTS after them go to other databases on first use
 * (blocking claims there poll once they are all taken).
 */
#define PGQ_SHARED_SLOTS 64
#define PGQ_DB_SLOTS (PGQ_MAX_DATABASES + PGQ_SHARED_SLOTS)

/* One scan bound of a database (bounds.c), under its slot's bound_mutex. */
#define PGQ_MEMO_PREPARED 16

typedef struct PgqBoundState
{
	PgqKey		bound;			/* no claimable entry has a smaller key */
	PgqKey		low;			/* the lowest lowering since the last set */
	uint64		sets;			/* bumped by every set: the tickets */
	TimestampTz next_full;		/* when a walk from the start is due */
	uint64		memo_gen;		/* bumped where a session's own start may
								 * have passed an entry (rule 8) */
	TransactionId memo_prepared[PGQ_MEMO_PREPARED]; /* prepared transactions
												 * with lowerings (rule 8);
												 * 0: a free entry */
	bool		memo_prepared_lost; /* more than fit: no session starts
									 * of its own until a restart */
} PgqBoundState;

/*
 * Queues that committing transactions made ready work in (pushes, nacks,
 * retries): a ring that every scheduling process reads from its own
 * position, by sequence number (schedule.c).  A name of "" means "more than
 * a transaction could say": a reader walks every queue.
 */
#define PGQ_READY_RING 256

typedef struct PgqReadyNote
{
	uint64		seq;			/* written as note number seq (1, 2, ...) */
	PgqKey		key;			/* the lowest (-priority, run_after) made ready */
	uint32		slots;			/* the slots of pgqueue.queue they are in (bits) */
	char		queue[PGQ_MAX_NAME_BYTES + 1];
} PgqReadyNote;

/*
 * A session that loads or builds pgqueue's tables directly (a restore: see
 * hook.c) in a database; pid 0: a free entry.
 */
#define PGQ_MAX_RESTORERS 8

typedef struct PgqRestorer
{
	pid_t		pid;
	TimestampTz last;			/* the start of its latest such statement */
} PgqRestorer;

/*
 * A backend that holds a database's scheduler off (CREATE DATABASE from it
 * as a template, ALTER DATABASE ... RENAME or SET TABLESPACE, DROP
 * DATABASE: see hook.c); pid 0: a free entry.
 */
#define PGQ_MAX_HOLDS 16

typedef struct PgqHold
{
	pid_t		pid;
	int			dbindex;		/* in pgqueue.database */
} PgqHold;

/* What pgqueue keeps per database. */
typedef struct PgqDbSlot
{
	Oid			dboid;			/* InvalidOid: free */
	int			scheduler_procno;	/* pgprocno of its scheduler, or -1 */
	ConditionVariable work_cv;	/* claims of this database sleep here */
	pg_atomic_uint32 filtered_waiters;	/* of them, claims with a queues filter */
	slock_t		bound_mutex;	/* protects bounds[] */
	PgqBoundState bounds[PGQ_NUM_BOUNDS];
	pg_atomic_uint64 settings_gen;	/* bumped by commits that change settings */
	pg_atomic_uint64 places_gen;	/* bumped by commits that free places
									 * (PGQ_WAKE_PLACES) */
	slock_t		ready_mutex;	/* protects ready_seq and ready[] */
	uint64		ready_seq;		/* notes written so far */
	PgqReadyNote ready[PGQ_READY_RING];
	slock_t		restore_mutex;	/* protects the three fields below */
	PgqRestorer restorers[PGQ_MAX_RESTORERS];
	TimestampTz restore_last;	/* latest statement or end of a restorer
								 * no longer listed; 0: none */
	bool		pass_busy;		/* its scheduler is in a pass that it began
								 * while no restore was listed */
} PgqDbSlot;

typedef struct PgqShared
{
	slock_t		mutex;			/* protects slots[].dboid, scheduler_pid[],
								 * holds[] and launcher_procno */
	TimestampTz stats_reset;
	pg_atomic_uint64 counters[PGQ_NUM_COUNTERS];
	pid_t		scheduler_pid[PGQ_MAX_DATABASES];	/* by index in pgqueue.database:
													 * the running scheduler, or 0
													 * (launcher.c) */
	PgqHold		holds[PGQ_MAX_HOLDS];
	int			launcher_procno;	/* pgprocno of the launcher, or -1 */
	PgqDbSlot	slots[PGQ_DB_SLOTS];

	/*
	 * The pgqueue call under way in each backend, by its number (MyBackendId;
	 * MyProcNumber from 17), 0 when none: what the rings' truncation waits
	 * for (ring.c, note_waits).  ncalls entries.
	 */
	int			ncalls;
	pg_atomic_uint32 calls[FLEXIBLE_ARRAY_MEMBER];
} PgqShared;

/* shmem.c */
extern PgqShared *pgq_shared;
extern PgqDbSlot *pgq_my_slot(void);

/* bounds.c */
extern void pgq_bounds_reset(PgqDbSlot *slot);
extern void pgq_bounds_lower_all(PgqDbSlot *slot);

#endif							/* PGQUEUE_SHMEM_INTERNAL_H */
