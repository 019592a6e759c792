/*-------------------------------------------------------------------------
 *
 * jobs.c
 *		The per-job writes of the API on pgqueue's tables, in C (tables.c):
 *		push, extend, ack and nack.  The callers in api.c have checked the
 *		arguments.
 *
 * Lock order, to stay free of deadlocks: a call that touches an existing
 * job locks (writes) its work_queue row first and its job row second.
 *
 * Layer 4 of src/README (job operations): it may call the other files of
 * its layer, storage (tables.c, ring.c, retire.c, uuid7.c), shared memory
 * and wake-ups (shmem.c, publish.c, bounds.c), and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "jobs.h"

/* Backoff of pgq_nack without retry_in: 1 s doubling per try, at most 1 h. */
#define PGQ_BACKOFF_BASE_USECS	USECS_PER_SEC
#define PGQ_BACKOFF_CAP_USECS	(INT64CONST(3600) * USECS_PER_SEC)

/*
 * Read the settings of queue (a text datum) from pgqueue.queues, as
 * snapshot sees them; a queue without a row has the defaults.
 */
void
pgq_queue_settings(Datum queue, Snapshot snapshot, PgqQueueSettings *s)
{
	Oid			nsp = get_namespace_oid("pgqueue", false);
	Relation	rel = table_open(pgq_relid(nsp, "queues"), AccessShareLock);
	Relation	idx = index_open(pgq_primary_key_index(rel), AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	IndexScanDesc scan;
	ScanKeyData key;
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	s->found = false;
	s->weight = 1;
	s->max_in_flight = 0;
	s->max_tries = PGQ_DEFAULT_MAX_TRIES;
	s->paused = false;
	s->retention = 0;
	s->group_max_in_flight = 0;

	ScanKeyEntryInitialize(&key, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   idx->rd_indcollation[0], F_TEXTEQ, queue);
	scan = pgq_index_beginscan(rel, idx, snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		s->found = true;
		slot_getallattrs(slot);
		for (i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute a = TupleDescAttr(desc, i);
			const char *name = NameStr(a->attname);
			Datum		v = slot->tts_values[i];

			if (a->attisdropped || slot->tts_isnull[i])
				continue;
			if (strcmp(name, "weight") == 0)
				s->weight = DatumGetInt32(v);
			else if (strcmp(name, "max_in_flight") == 0)
				s->max_in_flight = DatumGetInt32(v);
			else if (strcmp(name, "max_tries") == 0)
				s->max_tries = DatumGetInt32(v);
			else if (strcmp(name, "paused") == 0)
				s->paused = DatumGetBool(v);
			else if (strcmp(name, "retention") == 0)
				s->retention = pgq_interval_usecs(v);
			else if (strcmp(name, "group_max_in_flight") == 0)
				s->group_max_in_flight = DatumGetInt32(v);
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
}

/* ----------------------------------------------------------------
 * push
 * ----------------------------------------------------------------
 */

/*
 * Insert n pending jobs (no dedup_key) into pgqueue.queue, the i-th with id
 * ids[i] and payload payloads[i] (a Jsonb datum), in one write: the table,
 * its indexes and the snapshot are opened once for the batch.  run_after
 * NULL (has_run_after false): due at the transaction's start, as "DEFAULT
 * now()".  max_tries > 0: the jobs' own limit of tries (1.2; 0: their
 * queue's).  waiting_for > 0: the jobs wait for that many parents
 * (flow.c; 1.2), in the state 'waiting'.  group_key: their group (1.2;
 * NULL: none).
 */
int32
pgq_push_jobs(pg_uuid_t *ids, Datum *payloads, int n, text *queue,
			  bool has_run_after, TimestampTz run_after, int32 priority,
			  int32 max_tries, int32 waiting_for, text *group_key)
{
	PgqWrite	w;
	PgqTable   *t;
	Datum		values[PGQ_NUM_COLS * 2];
	bool		isnull[PGQ_NUM_COLS * 2];
	TupleDesc	desc;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int32		slot;
	int			i;

	pgq_write_begin(&w, "pgq_push", PGQ_OPEN_JOB);
	t = w.job;
	desc = RelationGetDescr(t->rel);
	if (desc->natts > lengthof(values))
		elog(ERROR, "relation \"pgqueue.queue\" has %d columns", desc->natts);
	for (i = 0; i < desc->natts; i++)
	{
		values[i] = (Datum) 0;
		isnull[i] = true;
	}
#define SETCOL(c, v) \
	do { \
		if (t->att[c] == InvalidAttrNumber) \
			elog(ERROR, "column %s of \"pgqueue.queue\" is missing", #c); \
		values[t->att[c] - 1] = (v); \
		isnull[t->att[c] - 1] = false; \
	} while (0)
	SETCOL(PGQ_COL_CREATED, TimestampTzGetDatum(now));
	SETCOL(PGQ_COL_VERSION, Int32GetDatum(0));
	SETCOL(PGQ_COL_QUEUE, PointerGetDatum(queue));
	SETCOL(PGQ_COL_STATE, pgq_state_datum(t, waiting_for > 0 ? "waiting" : "pending"));
	SETCOL(PGQ_COL_TRIES, Int32GetDatum(0));
	SETCOL(PGQ_COL_PRIORITY, Int32GetDatum(priority));
	SETCOL(PGQ_COL_RUN_AFTER, TimestampTzGetDatum(has_run_after ? run_after : now));
	if (max_tries > 0)
		SETCOL(PGQ_COL_MAX_TRIES, Int32GetDatum(max_tries));
	if (waiting_for > 0)
		SETCOL(PGQ_COL_WAITING_FOR, Int32GetDatum(waiting_for));
	if (group_key != NULL)
		SETCOL(PGQ_COL_GROUP_KEY, PointerGetDatum(group_key));
	for (i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		SETCOL(PGQ_COL_ID, UUIDPGetDatum(&ids[i]));
		SETCOL(PGQ_COL_PAYLOAD, payloads[i]);
		pgq_insert(&w, t, values, isnull);
		/* what the index insertions computed for this row */
		ResetPerTupleExprContext(w.estate);
	}
#undef SETCOL
	slot = t->slot;
	pgq_write_end(&w);
	return slot;
}

/* Insert one job (no dedup_key) with id *id: pgq_push_jobs. */
int32
pgq_push_job(pg_uuid_t *id, text *queue, Jsonb *payload, bool has_run_after,
			 TimestampTz run_after, int32 priority, int32 max_tries,
			 int32 waiting_for, text *group_key)
{
	Datum		d = JsonbPGetDatum(payload);

	return pgq_push_jobs(id, &d, 1, queue, has_run_after, run_after, priority,
						 max_tries, waiting_for, group_key);
}

/* ----------------------------------------------------------------
 * extend
 * ----------------------------------------------------------------
 */

/* A row whose lock_key is the text arg: the claim is still held. */
static bool
pgq_held_by(PgqTable *t, void *arg)
{
	return pgq_text_equals(t, PGQ_COL_LOCK_KEY, (text *) arg);
}

typedef struct ExtendArgs
{
	text	   *key;
	TimestampTz deadline;
} ExtendArgs;

static bool
pgq_extend_check(PgqTable *t, void *arg)
{
	return pgq_held_by(t, ((ExtendArgs *) arg)->key);
}

static void
pgq_extend_build(PgqTable *t, void *arg)
{
	pgq_set(t, PGQ_COL_LOCK_TIMEOUT, TimestampTzGetDatum(((ExtendArgs *) arg)->deadline), false);
}

/*
 * Set the lease of job id to now + lease if key holds it; returns whether it
 * did, and the new deadline in *deadline.
 */
bool
pgq_extend_job(Datum id, text *key, Datum lease, TimestampTz *deadline)
{
	PgqWrite	w;
	ExtendArgs	a;
	bool		done = false;
	static const PgqCol changes[] = {PGQ_COL_LOCK_TIMEOUT};

	pgq_write_begin(&w, "pgq_extend", PGQ_OPEN_WORK);
	a.key = key;
	a.deadline = pgq_deadline(GetCurrentTimestamp(), lease);
	done = pgq_write_work(&w, id, pgq_extend_check, pgq_extend_build, &a,
						  changes, lengthof(changes));
	pgq_write_end(&w);

	if (done)
	{
		*deadline = a.deadline;
		pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
		pgq_bound_lower_at_commit(PGQ_BOUND_LEASE, pgq_time_key(a.deadline));
	}
	return done;
}

/* ----------------------------------------------------------------
 * ack
 * ----------------------------------------------------------------
 */

/*
 * Archive the job whose rows w just deleted (job->found, work->found) with
 * the given outcome and retention (archive.c).
 */
static void
pgq_archive_removed(PgqWrite *w, PgqOutcome outcome, int64 retention)
{
	PgqTable   *job = w->job;
	PgqFinishedJob f;
	bool		isnull;

	f.id = pgq_get(job, job->found, PGQ_COL_ID, &isnull);
	f.queue = pgq_get(job, job->found, PGQ_COL_QUEUE, &isnull);
	f.payload = pgq_get(job, job->found, PGQ_COL_PAYLOAD, &isnull);
	f.priority = DatumGetInt32(pgq_get(job, job->found, PGQ_COL_PRIORITY, &isnull));
	f.tries = DatumGetInt32(pgq_get(w->work, w->work->found, PGQ_COL_TRIES, &isnull));
	f.created = DatumGetTimestampTz(pgq_get(job, job->found, PGQ_COL_CREATED, &isnull));
	f.last_error = pgq_get(job, job->found, PGQ_COL_LAST_ERROR, &f.last_error_null);
	pgq_archive_job(&f, outcome, retention);
}

/*
 * Finish the jobs ids[0 .. n-1] that key holds: both rows go.  Returns how
 * many.  Ids not held by key are skipped.
 */
int
pgq_ack_jobs(Datum *ids, int n, text *key)
{
	PgqWrite	w;
	PgqTable   *job;
	int			done = 0;
	bool		wake_scheduler = false;
	Datum	   *acked = NULL;	/* 1.2: the parents whose children count down */
	int			nacked = 0;
	int			i;

	pgq_write_begin(&w, "pgq_ack", PGQ_OPEN_WORK);
	if (w.layout >= PGQ_V12)
		acked = palloc(sizeof(Datum) * n);
	for (i = 0; i < n; i++)
	{
		PgqQueueSettings s;
		bool		isnull;

		if (!pgq_write_work(&w, ids[i], pgq_held_by, NULL, key, NULL, 0))
			continue;
		done++;

		/* the job row; missing only if removed behind the API's back */
		if (!pgq_write_job_row(&w, ids[i], NULL, NULL, NULL, NULL, 0))
		{
			pgq_job_row_missing(ids[i]);
			continue;
		}
		job = w.job;
		pgq_queue_settings(pgq_get(job, job->found, PGQ_COL_QUEUE, &isnull),
						   w.snapshot, &s);
		/* a place under max_in_flight, or its group's, is free */
		if (s.max_in_flight > 0 || s.group_max_in_flight > 0)
			wake_scheduler = true;
		/* the queue keeps an archive (1.1; archive.c) */
		if (s.retention > 0)
			pgq_archive_removed(&w, PGQ_OUTCOME_ACKED, s.retention);
		/* a job that was pushed after it (flow.c) */
		if (acked != NULL &&
			DatumGetBool(pgq_get(job, job->found, PGQ_COL_HAS_CHILDREN, &isnull)) && !isnull)
			acked[nacked++] = ids[i];
		CHECK_FOR_INTERRUPTS();
	}
	pgq_write_end(&w);

	/* children whose last parent this was become pending (flow.c) */
	if (nacked > 0)
		pgq_flow_release(acked, nacked);

	pgq_count(PGQ_ACKED, done);
	if (done > 0)
		pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
	if (wake_scheduler)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER | PGQ_WAKE_PLACES);
	return done;
}

/* ----------------------------------------------------------------
 * nack
 * ----------------------------------------------------------------
 */

typedef struct NackArgs
{
	PgqLayout	layout;
	int32		tries;			/* 1.1: the attempt count from work_queue */
	int32		version;		/* 1.1: the version from work_queue */
	int32		max_tries;
	text	   *error;
	bool		has_retry_in;
	Datum		retry_in;
	double		jitter;
	text	   *queue;			/* out: the job's queue */
	bool		failed;			/* out: the new state */
	int64		np;				/* out: key of queue_ready_idx, if retry */
	TimestampTz run_after;
} NackArgs;

/* The job row after a nack: 'retry' with a new run_after, or 'failed'. */
static void
pgq_nack_build(PgqTable *t, void *arg)
{
	NackArgs   *a = (NackArgs *) arg;
	bool		isnull;
	int32		tries = a->tries;
	int32		version = a->version;

	if (a->layout == PGQ_V10)
	{
		tries = DatumGetInt32(pgq_get(t, t->found, PGQ_COL_TRIES, &isnull));
		version = DatumGetInt32(pgq_get(t, t->found, PGQ_COL_VERSION, &isnull));
	}
	a->failed = tries >= a->max_tries;
	a->queue = DatumGetTextPCopy(pgq_get(t, t->found, PGQ_COL_QUEUE, &isnull));
	a->np = -(int64) DatumGetInt32(pgq_get(t, t->found, PGQ_COL_PRIORITY, &isnull));
	a->run_after = DatumGetTimestampTz(pgq_get(t, t->found, PGQ_COL_RUN_AFTER, &isnull));
	if (!a->failed)
	{
		TimestampTz now = GetCurrentTimestamp();

		if (a->has_retry_in)
			a->run_after = pgq_deadline(now, a->retry_in);
		else
		{
			/* base * 2^(tries - 1), capped, times the jitter factor */
			int			exp = Max(Min(tries, 40), 1) - 1;
			double		delay = Min((double) PGQ_BACKOFF_BASE_USECS * ldexp(1.0, exp),
									(double) PGQ_BACKOFF_CAP_USECS);

			a->run_after = now + (int64) (a->jitter * delay);
		}
	}
	pgq_set(t, PGQ_COL_STATE, pgq_state_datum(t, a->failed ? "failed" : "retry"), false);
	pgq_set(t, PGQ_COL_RUN_AFTER, TimestampTzGetDatum(a->run_after), false);
	pgq_set(t, PGQ_COL_LAST_ERROR, PointerGetDatum(a->error), a->error == NULL);
	pgq_set(t, PGQ_COL_TRIES, Int32GetDatum(tries), false);
	pgq_set(t, PGQ_COL_VERSION, Int32GetDatum(version + 1), false);
}

/*
 * Give job id back after a failure if key holds it: 'retry' with run_after
 * now + retry_in (has_retry_in) or the backoff, or 'failed' when its tries
 * are used up, recording error (NULL: none).  Returns the new state, or
 * NULL when key does not hold the job.
 */
const char *
pgq_nack_job(Datum id, text *key, text *error, bool has_retry_in, Datum retry_in)
{
	PgqWrite	w;
	int32		slot = 0;
	NackArgs	a;
	PgqQueueSettings s;
	bool		isnull;
	bool		done = false;
	static const PgqCol changes[] = {PGQ_COL_STATE, PGQ_COL_RUN_AFTER,
	PGQ_COL_LAST_ERROR, PGQ_COL_TRIES, PGQ_COL_VERSION};

	pgq_write_begin(&w, "pgq_nack", PGQ_OPEN_WORK);
	if (pgq_write_work(&w, id, pgq_held_by, NULL, key, NULL, 0))
	{
		memset(&a, 0, sizeof(a));
		a.layout = w.layout;
		a.tries = DatumGetInt32(pgq_get(w.work, w.work->found, PGQ_COL_TRIES, &isnull));
		a.version = DatumGetInt32(pgq_get(w.work, w.work->found, PGQ_COL_VERSION, &isnull));
		a.error = error;
		a.has_retry_in = has_retry_in;
		a.retry_in = retry_in;
		a.jitter = 0.5 + 0.5 * pg_prng_double(&pg_global_prng_state);
		pgq_queue_settings(pgq_get(w.work, w.work->found, PGQ_COL_QUEUE, &isnull),
						   w.snapshot, &s);
		a.max_tries = s.max_tries;
		/* 1.2: the job's own, copied into its work_queue row when scheduled */
		if (w.layout >= PGQ_V12)
		{
			Datum		own = pgq_get(w.work, w.work->found, PGQ_COL_MAX_TRIES, &isnull);

			if (!isnull)
				a.max_tries = DatumGetInt32(own);
		}
		done = pgq_write_job_row(&w, id, NULL, pgq_nack_build, &a,
								 changes, lengthof(changes));
		if (done)
			slot = w.job->slot;
		else
			pgq_job_row_missing(id);
	}
	pgq_write_end(&w);

	if (!done)
		return NULL;
	pgq_count(PGQ_NACKED, 1);
	pgq_wake_at_commit(PGQ_WAKE_ON_ABORT);
	/* failed: a place is free; retry: its group may take it (schedule.c) */
	if (s.max_in_flight > 0 || s.group_max_in_flight > 0)
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER | PGQ_WAKE_PLACES);
	if (a.failed)
	{
		pgq_count(PGQ_FAILED, 1);
		return "failed";
	}
	/* ready again when this commits */
	{
		PgqKey		k;

		k.hi = a.np;
		k.lo = a.run_after;
		pgq_ready_at_commit(a.queue, k, PGQ_SLOT_BIT(slot));
	}
	if (a.run_after <= GetCurrentTimestamp())
		pgq_wake_at_commit(PGQ_WAKE_SCHEDULER);
	return "retry";
}
