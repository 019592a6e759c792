/*-------------------------------------------------------------------------
 *
 * jobs.h
 *		The layer of job operations (src/README): push, extend, ack and
 *		nack of one job or a few (jobs.c), claims (claim.c), the
 *		scheduling pass (schedule.c), and the archive of finished jobs
 *		(archive.c).
 *
 * Includes the layer below, storage.h, and through it the others.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_JOBS_H
#define PGQUEUE_JOBS_H

#include "access/xact.h"
#include "nodes/execnodes.h"
#include "utils/array.h"
#include "utils/jsonb.h"

#include "storage.h"

/* max_tries of a queue without settings (pgq_configure, pgqueue.queues) */
#define PGQ_DEFAULT_MAX_TRIES	5

/* A queue's max_tries in SQL, s being its pgqueue.queues row (or NULL). */
#define PGQ_SQL_MAX_TRIES "coalesce(s.max_tries, " CppAsString2(PGQ_DEFAULT_MAX_TRIES) ")"

/* 1.2: a job's max_tries in SQL: its own (in its row W), else its queue's. */
#define PGQ_SQL_JOB_MAX_TRIES(W) \
	"coalesce(" W ".max_tries, s.max_tries, " CppAsString2(PGQ_DEFAULT_MAX_TRIES) ")"

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
	int32		group_max_in_flight;	/* 1.2; 0: no limit */
} PgqQueueSettings;

extern void pgq_queue_settings(Datum queue, Snapshot snapshot, PgqQueueSettings *s);
extern int32 pgq_push_job(pg_uuid_t *id, text *queue, Jsonb *payload,
						  bool has_run_after, TimestampTz run_after, int32 priority,
						  int32 max_tries, int32 waiting_for, text *group_key);
extern int32 pgq_push_jobs(pg_uuid_t *ids, Datum *payloads, int n, text *queue,
						  bool has_run_after, TimestampTz run_after, int32 priority,
						  int32 max_tries, int32 waiting_for, text *group_key);
extern bool pgq_extend_job(Datum id, text *key, Datum lease, TimestampTz *deadline);
extern int	pgq_ack_jobs(Datum *ids, int n, text *key);
extern const char *pgq_nack_job(Datum id, text *key, text *error,
								bool has_retry_in, Datum retry_in);

/* flow.c: jobs that wait for other jobs (1.2) */
#define PGQ_MAX_PARENTS 1000

extern bool pgq_flows_exist(void);
extern ArrayType *pgq_flow_lock_parents(ArrayType *after, int *n);
extern void pgq_flow_link(ArrayType *parents, pg_uuid_t *children, int n);
extern int	pgq_flow_release(Datum *ids, int n);
extern uint64 pgq_flow_cancel(Datum ids, const char *how);

/* claim.c */
extern void pgq_claim_jobs(ReturnSetInfo *rsinfo, text *key, int max_items,
						   Datum lease, ArrayType *queues, TimestampTz wait_until);

/*
 * rate.c: the sliding window of a rate-limited queue's releases, as one
 * scheduling pass reads and writes it (pgqueue.rate_windows).
 */
#define PGQ_RATE_BUCKETS 257
/* a pass that found a queue's window taken tries it again this much later */
#define PGQ_RATE_RETRY_USECS (10 * INT64CONST(1000))

typedef struct PgqRateWindow
{
	char	   *queue;
	int64		period;			/* rate_period, usecs */
	int64		width;			/* usecs a bucket */
	int64		newest;			/* the bucket number of counts[last] */
	int64		total;			/* sum of counts */
	bool		dirty;			/* to be written */
	int32		counts[PGQ_RATE_BUCKETS];	/* releases by bucket, oldest first */
} PgqRateWindow;

extern PgqRateWindow *pgq_rate_open(const char *queue, int32 limit, int64 period,
									TimestampTz now, int64 *room);
extern TimestampTz pgq_rate_free_at(const PgqRateWindow *w);
extern void pgq_rate_count(PgqRateWindow *w);
extern void pgq_rate_save(PgqRateWindow *w);

/* schedule.c; caller must be connected to SPI inside a transaction */
extern int	pgq_schedule_pass(int max_items);
extern TimestampTz pgq_schedule_next_due(void);
extern void pgq_schedule_at_xact_end(bool commit);
extern void pgq_schedule_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
										  SubTransactionId parentSubid, void *arg);
extern void pgq_schedule_forget(void);

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

#endif							/* PGQUEUE_JOBS_H */
