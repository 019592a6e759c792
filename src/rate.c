/*-------------------------------------------------------------------------
 *
 * rate.c
 *		Rate limits (1.2): a queue with a rate_limit (pgq_configure) has at
 *		most rate_limit of its jobs released into pgqueue.work_queue in any
 *		window of rate_period.  The scheduling pass (schedule.c) asks here
 *		how many it may release, and counts each one it releases.
 *
 * Released jobs are what counts: a job released and then nacked used its
 * share.  Each queue's releases are kept in a sliding window of
 * PGQ_RATE_BUCKETS buckets, a row of pgqueue.rate_windows written in the
 * pass's own transaction, so the count is exactly the releases committed:
 * a pass that rolls back released nothing and counted nothing, and the
 * window survives restarts and failovers with the jobs it counts.
 *
 * The buckets: rate_period is cut into PGQ_RATE_BUCKETS - 1 widths (width
 * rounded up), bucket number n covering [n * width, (n + 1) * width) of
 * the pass's clock (its now: the created time of the work_queue rows it
 * writes); the row keeps the last PGQ_RATE_BUCKETS of them, counts[last]
 * being bucket "newest".  A pass at now releases at most rate_limit minus
 * the sum of the buckets from newest - (PGQ_RATE_BUCKETS - 1) to newest,
 * after moving newest up to now's bucket.  Those buckets begin at least
 * rate_period before now, so every release of the last rate_period is
 * counted, and no window of rate_period ever holds more than rate_limit
 * releases.  The price: a release counts up to one width (1/256 of the
 * period) longer than it must, and a queue with a backlog gets 256/257 of
 * its rate_limit (0.4 % less).
 *
 * Passes of one queue go one at a time, in the order of their now: a pass
 * takes a transaction-level lock (PGQ_RATE_LOCK_KEY, hashtext(queue):
 * pgq_try_queue_lock, which no SQL can take) without waiting, and reads the row with a snapshot
 * taken once it holds the lock (as schedule.c's rooms under max_in_flight:
 * specs/cap_race.spec); a queue locked by another open pass, or whose row
 * a pass with a later now already wrote, gets nothing in this pass.  So
 * the created times of a queue's releases rise with the commits that
 * count them.
 *
 * The first release after pgq_configure changed rate_period counts every
 * release of the old window as made at once, now: the limit holds across
 * the change, and the queue waits at most one new period.
 *
 * Layer 4 of src/README (job operations): it may call the other files of
 * its layer, storage, shared memory and wake-ups, and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "jobs.h"

#define PGQ_RATE_LOCK_KEY 1885827446

static SPIPlanPtr plan_read = NULL;
static SPIPlanPtr plan_write = NULL;

/* Bucket width of a period, rounded up: 256 widths cover the period. */
static int64
pgq_rate_width(int64 period)
{
	return (period + PGQ_RATE_BUCKETS - 2) / (PGQ_RATE_BUCKETS - 1);
}

/* Move w's newest bucket up to bucket b (> w->newest): older ones drop out. */
static void
pgq_rate_advance(PgqRateWindow *w, int64 b)
{
	int64		d = b - w->newest;
	int			i;

	if (d >= PGQ_RATE_BUCKETS)
		memset(w->counts, 0, sizeof(w->counts));
	else
	{
		memmove(w->counts, w->counts + d, sizeof(int32) * (PGQ_RATE_BUCKETS - d));
		memset(w->counts + (PGQ_RATE_BUCKETS - d), 0, sizeof(int32) * d);
	}
	w->newest = b;
	w->total = 0;
	for (i = 0; i < PGQ_RATE_BUCKETS; i++)
		w->total += w->counts[i];
}

/*
 * Open queue's window for a pass at now, under a limit of limit releases
 * per period (usecs).  Returns NULL when the pass may release nothing of
 * the queue and should not wait for the window (another open pass holds
 * it, or one with a later now wrote it: the next pass tries again).
 * Otherwise *room is what it may release now: rate_limit minus the
 * window's count.  The window lives in the caller's memory context.
 */
PgqRateWindow *
pgq_rate_open(const char *queue, int32 limit, int64 period, TimestampTz now,
			  int64 *room)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	text	   *qname = cstring_to_text(queue);
	int32		h;
	PgqRateWindow *w;
	Snapshot	snap;
	int64		b;
	int			nest;
	int			i;

	h = DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID,
											  PointerGetDatum(qname)));
	if (!pgq_try_queue_lock(PGQ_RATE_LOCK_KEY, h))
		return NULL;

	w = palloc0(sizeof(PgqRateWindow));
	w->queue = pstrdup(queue);
	w->period = period;
	w->width = pgq_rate_width(period);
	b = now / w->width;
	w->newest = b;

	/* what the passes before this one committed: a snapshot taken now */
	args[0] = PointerGetDatum(qname);
	nest = pgq_spi_connect();
	snap = RegisterSnapshot(GetLatestSnapshot());
	if (SPI_execute_snapshot(pgq_keep_plan(&plan_read,
										   "SELECT period, newest, counts"
										   "  FROM pgqueue.rate_windows WHERE queue = $1",
										   1, types),
							 args, NULL, snap, InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the rate window of queue \"%s\"", queue);
	UnregisterSnapshot(snap);
	if (SPI_processed == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int64		old_period;
		int64		old_newest;
		ArrayType  *arr;
		Datum	   *elems;
		bool	   *elnulls;
		int			n;

		old_period = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		old_newest = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
		arr = DatumGetArrayTypeP(SPI_getbinval(tup, desc, 3, &isnull));
		deconstruct_array(arr, INT4OID, 4, true, TYPALIGN_INT, &elems, &elnulls, &n);
		if (old_period == period && n == PGQ_RATE_BUCKETS)
		{
			if (b < old_newest && old_newest <= GetCurrentTimestamp() / w->width)
			{
				/* a pass with a later now counted releases after ours */
				pgq_spi_finish(nest);
				return NULL;
			}
			if (b >= old_newest)
			{
				w->newest = old_newest;
				for (i = 0; i < n; i++)
					w->counts[i] = elnulls[i] ? 0 : DatumGetInt32(elems[i]);
				pgq_rate_advance(w, b);
				goto done;
			}

			/*
			 * The window's newest bucket lies ahead of the clock itself, not
			 * only of this pass's now: no pass that committed can have had a
			 * now later than the clock reads, so the clock was stepped back
			 * (NTP, a VM restored, a promoted standby whose clock lags).
			 * Waiting for the clock to reach that bucket again would stall
			 * the queue for as long as the step; its releases count as
			 * now's instead, as on a change of period below.
			 */
		}
		{
			/*
			 * The period changed, or the clock stepped back: the old
			 * window's releases count as now's.
			 */
			int64		sum = 0;

			for (i = 0; i < n; i++)
				sum += elnulls[i] ? 0 : DatumGetInt32(elems[i]);
			w->counts[PGQ_RATE_BUCKETS - 1] = (int32) Min(sum, PG_INT32_MAX);
			w->total = w->counts[PGQ_RATE_BUCKETS - 1];
			w->dirty = true;
		}
	}
done:
	pgq_spi_finish(nest);

	*room = Max((int64) limit - w->total, 0);
	return w;
}

/* When the oldest release that w counts leaves it (DT_NOEND: none counted). */
TimestampTz
pgq_rate_free_at(const PgqRateWindow *w)
{
	int			i;

	/* bucket newest - 256 + i leaves once newest reaches it + 257 */
	for (i = 0; i < PGQ_RATE_BUCKETS; i++)
		if (w->counts[i] > 0)
			return (w->newest + i + 1) * w->width;
	return DT_NOEND;
}

/* One more job of w's queue released by the pass (in its newest bucket). */
void
pgq_rate_count(PgqRateWindow *w)
{
	w->counts[PGQ_RATE_BUCKETS - 1]++;
	w->total++;
	w->dirty = true;
}

/* Write w, if it changed, in the pass's transaction. */
void
pgq_rate_save(PgqRateWindow *w)
{
	Oid			types[4] = {TEXTOID, INT8OID, INT8OID, INT4ARRAYOID};
	Datum		args[4];
	Datum		elems[PGQ_RATE_BUCKETS];
	Snapshot	snap;
	int			nest;
	int			i;

	if (!w->dirty)
		return;
	for (i = 0; i < PGQ_RATE_BUCKETS; i++)
		elems[i] = Int32GetDatum(w->counts[i]);
	args[0] = CStringGetTextDatum(w->queue);
	args[1] = Int64GetDatum(w->period);
	args[2] = Int64GetDatum(w->newest);
	args[3] = PointerGetDatum(construct_array(elems, PGQ_RATE_BUCKETS, INT4OID, 4, true,
											  TYPALIGN_INT));
	nest = pgq_spi_connect();
	/* the row the read saw, under the same lock: never a serialization failure */
	snap = RegisterSnapshot(GetLatestSnapshot());
	if (SPI_execute_snapshot(pgq_keep_plan(&plan_write,
											"INSERT INTO pgqueue.rate_windows AS w (queue, period, newest, counts)"
											" VALUES ($1, $2, $3, $4)"
											" ON CONFLICT (queue) DO UPDATE"
											"   SET period = excluded.period, newest = excluded.newest,"
											"       counts = excluded.counts",
											4, types),
							 args, NULL, snap, InvalidSnapshot, false, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write the rate window of queue \"%s\"", w->queue);
	UnregisterSnapshot(snap);
	pgq_spi_finish(nest);
	w->dirty = false;
}
