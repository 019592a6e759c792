/*-------------------------------------------------------------------------
 *
 * archive.c
 *		pgqueue.archive: the finished jobs of queues that have a retention,
 *		and the upkeep of its partitions.
 *
 * The archive is partitioned by RANGE on expires (when the row may go:
 * finished + the retention its queue had then), one partition per UTC day
 * of expiry, named archive_YYYYMMDD.  Once a day has passed, every row of
 * its partition has expired, whatever the retention of its queue, and the
 * partition is dropped whole: no row-by-row delete, no dead rows, no
 * vacuum.  A row is thus removed between its expiry and a day after it.
 *
 * Partitions are made ahead of need: for each retention in use, the days
 * now + retention to now + retention + PGQ_ARCHIVE_AHEAD_USECS, by the
 * scheduler once a minute (pgq_archive_maintain), and by pgq_configure
 * when it sets a retention.  A write whose day is missing all the same
 * (nothing ran maintenance for a day) makes it itself (pgq_archive_cover),
 * so that an ack never fails for want of a partition.
 *
 * An expired partition is not dropped at once: a pg_dump that read the
 * partitions with its snapshot and has yet to lock it by name would fail.
 * It is retired (detached and made a member of the extension, which
 * pg_dump skips) and dropped once no snapshot from before that is left
 * (retire.c).  Only the partitions that pgqueue names (archive_...) are
 * retired: retire.c drops retired tables of such names only.
 *
 * Locks on pgqueue.archive: writes take ROW EXCLUSIVE; making a partition
 * takes SHARE UPDATE EXCLUSIVE (CREATE TABLE, then ATTACH PARTITION, which
 * waits for no write); retiring expired partitions needs ACCESS EXCLUSIVE,
 * and on each partition too.  The upkeep waits at most
 * PGQ_ARCHIVE_LOCK_TIMEOUT_MS for a lock on the archive, so that writes
 * queue behind it for no longer than that, and not at all for a
 * partition: one in use (a reader, a pg_dump) is left for a later run.  It
 * runs in a transaction that ends with it: the scheduler's own, or the
 * statement of a user's pgq_schedule outside a transaction block (see
 * pgq_schedule), so that ACCESS EXCLUSIVE is held for a moment only.
 *
 * Layer 4 of src/README (job operations): it may call the other files of
 * its layer, storage (tables.c, ring.c, retire.c, uuid7.c), shared memory
 * and wake-ups (shmem.c, publish.c, bounds.c), and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "jobs.h"

/* Partitions exist this far past now + retention. */
#define PGQ_ARCHIVE_AHEAD_USECS		USECS_PER_DAY
/* The upkeep runs at most this often per backend (the scheduler: per database). */
#define PGQ_ARCHIVE_MAINTAIN_USECS	(INT64CONST(60) * USECS_PER_SEC)
/* How long the upkeep waits for a lock on pgqueue.archive, at most. */
#define PGQ_ARCHIVE_LOCK_TIMEOUT_MS "200"
/* The names of the partitions pgqueue makes (pgq_archive_create_day). */
#define PGQ_ARCHIVE_PREFIX "archive_"

static const char *const outcome_names[] = {"acked", "cancelled", "purged"};

static SPIPlanPtr plan_retentions = NULL;

/* When this backend may run the upkeep next (pgq_archive_maintain). */
static TimestampTz next_maintain = 0;

static Oid	pgq_archive_relid(void);
static TimestampTz pgq_day_start(TimestampTz t);
static Oid	pgq_archive_partition(Relation archive, TimestampTz t);
static void pgq_archive_insert(Oid part, const Datum *values, const bool *isnull);
static void pgq_archive_make(Oid relid, TimestampTz from, TimestampTz to);
static void pgq_archive_create_day(TimestampTz day);
static void pgq_archive_make_ahead(void *arg);
static List *pgq_archive_expired(Relation archive, TimestampTz now);
static void pgq_archive_retire_expired(void *arg);
static void pgq_archive_try(void (*fn) (void *), void *arg, const char *what);

/* OID of pgqueue.archive. */
static Oid
pgq_archive_relid(void)
{
	return pgq_relid(get_namespace_oid("pgqueue", false), "archive");
}

/* Start of the UTC day that holds t. */
static TimestampTz
pgq_day_start(TimestampTz t)
{
	TimestampTz r = t % USECS_PER_DAY;

	return r < 0 ? t - r - USECS_PER_DAY : t - r;
}

/*
 * The partition of archive (opened by the caller) that takes a row that
 * expires at t, or InvalidOid when none does.  In the range bounds of a
 * partitioned table, indexes[i] is the partition whose upper bound is
 * datums[i] (-1 for a gap), and a value belongs to the first upper bound
 * above it.
 */
static Oid
pgq_archive_partition(Relation archive, TimestampTz t)
{
	PartitionDesc pd = RelationGetPartitionDesc(archive, true);
	PartitionBoundInfo bi = pd->boundinfo;
	int			lo = 0;
	int			hi;

	if (pd->nparts == 0 || bi == NULL)
		return InvalidOid;
	hi = bi->ndatums;
	/* the first datum above t: bounds are exclusive at the top */
	while (lo < hi)
	{
		int			mid = lo + (hi - lo) / 2;

		PartitionRangeDatumKind kind = bi->kind[mid][0];

		if (kind == PARTITION_RANGE_DATUM_MAXVALUE ||
			(kind == PARTITION_RANGE_DATUM_VALUE &&
			 DatumGetTimestampTz(bi->datums[mid][0]) > t))
			hi = mid;
		else
			lo = mid + 1;
	}
	return bi->indexes[lo] >= 0 ? pd->oids[bi->indexes[lo]] : InvalidOid;
}

/*
 * Make the missing partitions for the days from from to to.  Takes SHARE
 * UPDATE EXCLUSIVE on archive (to the end of the transaction), which
 * serialises the makers of partitions and waits for no write.
 */
static void
pgq_archive_make(Oid relid, TimestampTz from, TimestampTz to)
{
	TimestampTz day;

	/* after the lock, the relcache shows what an earlier maker committed */
	LockRelationOid(relid, ShareUpdateExclusiveLock);
	for (day = pgq_day_start(from); day <= to; day += USECS_PER_DAY)
	{
		/* closed before the DDL, which wants archive unused in this backend */
		Relation	rel = table_open(relid, NoLock);
		bool		covered = OidIsValid(pgq_archive_partition(rel, day));

		table_close(rel, NoLock);
		if (!covered)
			pgq_archive_create_day(day);
	}
}

/*
 * Create the partition archive_YYYYMMDD for the rows expiring on UTC day
 * day: a table like archive with its index on id, then attached (CREATE
 * TABLE ... PARTITION OF would lock archive ACCESS EXCLUSIVE, against every
 * ack).  The bounds are made here, not given by a user, and go in as
 * quoted literals in UTC.  Run as pgqueue's own DDL (pgq_spi_ddl), which
 * the utility hook does not take for a restore.  The caller holds SHARE
 * UPDATE EXCLUSIVE on archive and does not have it open.
 */
static void
pgq_archive_create_day(TimestampTz day)
{
	int			y;
	int			m;
	int			d;
	int			y2;
	int			m2;
	int			d2;
	char	   *name;
	StringInfoData sql;

	j2date((int) (day / USECS_PER_DAY) + POSTGRES_EPOCH_JDATE, &y, &m, &d);
	j2date((int) (day / USECS_PER_DAY) + 1 + POSTGRES_EPOCH_JDATE, &y2, &m2, &d2);
	name = psprintf("archive_%04d%02d%02d", y, m, d);

	SPI_connect();
	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE TABLE pgqueue.%s"
					 " (LIKE pgqueue.archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
					 quote_identifier(name));
	if (pgq_spi_ddl(sql.data) != SPI_OK_UTILITY)
		elog(ERROR, "could not create archive partition %s", name);
	/* its own index, not a partition of one (see pgqueue--1.1.sql) */
	resetStringInfo(&sql);
	appendStringInfo(&sql, "CREATE INDEX %s ON pgqueue.%s (id)",
					 quote_identifier(psprintf("%s_id_idx", name)), quote_identifier(name));
	if (pgq_spi_ddl(sql.data) != SPI_OK_UTILITY)
		elog(ERROR, "could not create the index of archive partition %s", name);
	resetStringInfo(&sql);
	appendStringInfo(&sql,
					 "ALTER TABLE pgqueue.archive ATTACH PARTITION pgqueue.%s"
					 " FOR VALUES FROM (%s) TO (%s)",
					 quote_identifier(name),
					 quote_literal_cstr(psprintf("%04d-%02d-%02d 00:00:00+00", y, m, d)),
					 quote_literal_cstr(psprintf("%04d-%02d-%02d 00:00:00+00", y2, m2, d2)));
	if (pgq_spi_ddl(sql.data) != SPI_OK_UTILITY)
		elog(ERROR, "could not attach archive partition %s", name);
	SPI_finish();
}

/*
 * The partition that takes rows expiring at expires: a look at the
 * partition bounds when it exists, else it is made now (see
 * pgq_archive_make).  For writers of the archive; the caller is inside a
 * transaction of a 1.1 database.
 */
Oid
pgq_archive_cover(TimestampTz expires)
{
	Oid			relid = pgq_archive_relid();
	Relation	rel = table_open(relid, RowExclusiveLock);
	Oid			part = pgq_archive_partition(rel, expires);

	table_close(rel, NoLock);
	if (!OidIsValid(part))
	{
		pgq_archive_make(relid, expires, expires);
		rel = table_open(relid, NoLock);
		part = pgq_archive_partition(rel, expires);
		table_close(rel, NoLock);
		if (!OidIsValid(part))
			elog(ERROR, "no archive partition for rows expiring at %s",
				 timestamptz_to_str(expires));
	}
	return part;
}

/*
 * Make the partitions that the jobs of a queue with this retention will be
 * archived into over the next day (pgq_configure, when it sets one).
 */
void
pgq_archive_prepare(int64 retention_usecs)
{
	TimestampTz from = GetCurrentTimestamp() + retention_usecs;

	if (retention_usecs > 0)
		pgq_archive_make(pgq_archive_relid(), from, from + PGQ_ARCHIVE_AHEAD_USECS);
}

/* Microseconds of a retention (an interval), 0 when NULL or not positive. */
int64
pgq_retention_usecs(Datum retention, bool isnull)
{
	int64		usecs;

	if (isnull)
		return 0;
	usecs = pgq_interval_usecs(retention);
	return usecs > 0 ? usecs : 0;
}

/* The archive's columns, in the order of pgq_archive_insert's values. */
static const char *const archive_columns[] = {
	"id", "queue", "payload", "priority", "tries", "created", "finished",
	"outcome", "last_error", "expires"
};
#define PGQ_ARCHIVE_NCOLS lengthof(archive_columns)

/*
 * Insert one row (values and isnull in the order of archive_columns) into
 * the archive partition part, as the logical replication apply worker
 * inserts into a table: the heap tuple, then the entries of the
 * partition's indexes.  No SQL statement, no executor start-up, no routing
 * through the partitioned table: the caller found the partition.  Columns
 * are matched by name, so a partition whose columns lie otherwise (dropped
 * columns, a restore) is written right.  NOT NULL is checked here; the one
 * CHECK constraint (outcome) holds by construction, and ExecConstraints
 * would parse and compile it again for every row (a third of the
 * archive's cost when it did).  pgqueue.archive has no triggers; none
 * would fire.  A payload stored out of line in the removed job row is
 * fetched and stored again by the heap insert (toast_tuple_init).
 */
static void
pgq_archive_insert(Oid part, const Datum *values, const bool *isnull)
{
	Relation	rel = table_open(part, RowExclusiveLock);
	TupleDesc	desc = RelationGetDescr(rel);
	EState	   *estate = CreateExecutorState();
	List	   *perminfos = NIL;
	RangeTblEntry *rte = pgq_make_rte(&perminfos, RowExclusiveLock);
	ResultRelInfo *rri = makeNode(ResultRelInfo);
	TupleTableSlot *slot;
	int			found = 0;
	int			i;

	pgq_rte_set_relid(perminfos, rte, part);
	pgq_init_range_table(estate, list_make1(rte), perminfos);
	estate->es_output_cid = GetCurrentCommandId(true);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	ExecOpenIndices(rri, false);

	slot = ExecInitExtraTupleSlot(estate, desc, &TTSOpsVirtual);
	ExecClearTuple(slot);
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		int			c;

		slot->tts_values[i] = (Datum) 0;
		slot->tts_isnull[i] = true;
		for (c = 0; !att->attisdropped && c < PGQ_ARCHIVE_NCOLS; c++)
		{
			if (strcmp(NameStr(att->attname), archive_columns[c]) == 0)
			{
				slot->tts_values[i] = values[c];
				slot->tts_isnull[i] = isnull[c];
				found++;
				break;
			}
		}
		if (att->attnotnull && slot->tts_isnull[i])
			elog(ERROR, "archived job without %s", NameStr(att->attname));
	}
	if (found != PGQ_ARCHIVE_NCOLS)
		elog(ERROR, "archive partition \"%s\" lacks columns of pgqueue.archive",
			 RelationGetRelationName(rel));
	ExecStoreVirtualTuple(slot);

	table_tuple_insert(rel, slot, estate->es_output_cid, 0, NULL);
	if (rri->ri_NumIndices > 0)
		(void) pgq_insert_index_tuples(rri, slot, estate, false, false);

	ExecCloseIndices(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
	table_close(rel, NoLock);
}

/*
 * Archive one finished job with the given outcome, if retention_usecs > 0:
 * finished is now, expires now + retention.  Runs in the caller's
 * transaction (the ack, cancel or purge that finishes the job), at the
 * cost of a look at the partition bounds and one heap and one index
 * insert; the caller may be connected to SPI.
 */
void
pgq_archive_job(const PgqFinishedJob *job, PgqOutcome outcome, int64 retention_usecs)
{
	Datum		values[PGQ_ARCHIVE_NCOLS];
	bool		isnull[PGQ_ARCHIVE_NCOLS] = {false};
	TimestampTz finished = GetCurrentTimestamp();
	TimestampTz expires = finished + retention_usecs;

	if (retention_usecs <= 0)
		return;

	values[0] = job->id;
	values[1] = job->queue;
	values[2] = job->payload;
	values[3] = Int32GetDatum(job->priority);
	values[4] = Int32GetDatum(job->tries);
	values[5] = TimestampTzGetDatum(job->created);
	values[6] = TimestampTzGetDatum(finished);
	values[7] = CStringGetTextDatum(outcome_names[outcome]);
	values[8] = job->last_error;
	isnull[8] = job->last_error_null;
	values[9] = TimestampTzGetDatum(expires);
	pgq_archive_insert(pgq_archive_cover(expires), values, isnull);
}

/*
 * Archive the jobs of the first n rows of an SPI result whose columns
 * col, col + 1, ... are PGQ_ARCHIVE_COLUMNS (retention, id, queue,
 * priority, tries, created, last_error, payload): those whose retention is
 * positive.  payload may be NULL in rows without a retention.
 */
void
pgq_archive_spi_rows(SPITupleTable *tab, uint64 n, int col, PgqOutcome outcome)
{
	uint64		i;

	for (i = 0; i < n; i++)
	{
		HeapTuple	tup = tab->vals[i];
		TupleDesc	desc = tab->tupdesc;
		bool		isnull;
		Datum		d = SPI_getbinval(tup, desc, col, &isnull);
		int64		retention = pgq_retention_usecs(d, isnull);
		PgqFinishedJob job;

		if (retention == 0)
			continue;
		job.id = SPI_getbinval(tup, desc, col + 1, &isnull);
		job.queue = SPI_getbinval(tup, desc, col + 2, &isnull);
		job.priority = DatumGetInt32(SPI_getbinval(tup, desc, col + 3, &isnull));
		job.tries = DatumGetInt32(SPI_getbinval(tup, desc, col + 4, &isnull));
		job.created = DatumGetTimestampTz(SPI_getbinval(tup, desc, col + 5, &isnull));
		job.last_error = SPI_getbinval(tup, desc, col + 6, &job.last_error_null);
		job.payload = SPI_getbinval(tup, desc, col + 7, &isnull);
		if (isnull)
			elog(ERROR, "archived job without its payload");
		pgq_archive_job(&job, outcome, retention);
	}
}

/* ----------------------------------------------------------------
 * Upkeep
 * ----------------------------------------------------------------
 */

/* Make the partitions each retention in use needs over the next day. */
static void
pgq_archive_make_ahead(void *arg)
{
	Oid			relid = pgq_archive_relid();
	TimestampTz now = GetCurrentTimestamp();
	SPITupleTable *tab;
	uint64		n;
	uint64		i;

	SPI_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_retentions,
									   "SELECT DISTINCT s.retention FROM pgqueue.queues s"
									   " WHERE s.retention > '0'",
									   0, NULL),
						 NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the retentions of the queues");
	tab = SPI_tuptable;
	n = SPI_processed;
	for (i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		retention = SPI_getbinval(tab->vals[i], tab->tupdesc, 1, &isnull);
		int64		r;

		/*
		 * Not pgq_retention_usecs(SPI_getbinval(..., &isnull), isnull): C
		 * leaves the order of a call's arguments open, and gcc read isnull
		 * before the call set it (valgrind: a jump on an uninitialised
		 * value), so a retention could be taken for NULL and its
		 * partitions not made ahead.
		 */
		r = pgq_retention_usecs(retention, isnull);

		if (r > 0)
			pgq_archive_make(relid, now + r, now + r + PGQ_ARCHIVE_AHEAD_USECS);
	}
	SPI_finish();
}

/*
 * The partitions of archive (opened by the caller) whose upper bound is
 * not after now, all of whose rows have expired, and that pgqueue named.
 */
static List *
pgq_archive_expired(Relation archive, TimestampTz now)
{
	PartitionDesc pd = RelationGetPartitionDesc(archive, true);
	PartitionBoundInfo bi = pd->boundinfo;
	List	   *expired = NIL;
	int			i;

	for (i = 0; bi != NULL && i < bi->ndatums; i++)
	{
		Oid			part;
		char	   *name;

		if (bi->indexes[i] < 0 ||
			bi->kind[i][0] != PARTITION_RANGE_DATUM_VALUE ||
			DatumGetTimestampTz(bi->datums[i][0]) > now)
			continue;
		part = pd->oids[bi->indexes[i]];
		name = get_rel_name(part);
		if (name != NULL &&
			strncmp(name, PGQ_ARCHIVE_PREFIX, strlen(PGQ_ARCHIVE_PREFIX)) == 0)
			expired = lappend_oid(expired, part);
	}
	return expired;
}

/*
 * Retire every expired partition (pgq_archive_expired) that no session
 * uses (retire.c).  Looks first under ACCESS SHARE (released at once);
 * only when there is something to retire does it wait, at most
 * lock_timeout (pgq_archive_maintain sets it), for ACCESS EXCLUSIVE on the
 * archive, then takes it on each partition without waiting: a partition
 * in use is left for a later run.
 */
static void
pgq_archive_retire_expired(void *arg)
{
	Oid			relid = pgq_archive_relid();
	TimestampTz now = GetCurrentTimestamp();
	Relation	rel;
	List	   *expired;
	ListCell   *lc;

	rel = table_open(relid, AccessShareLock);
	expired = pgq_archive_expired(rel, now);
	table_close(rel, AccessShareLock);
	if (expired == NIL)
		return;

	/* with the lock, the relcache shows what others committed: look again */
	LockRelationOid(relid, AccessExclusiveLock);
	rel = table_open(relid, NoLock);
	expired = pgq_archive_expired(rel, now);
	/* closed before the DDL, which wants archive unused in this backend */
	table_close(rel, NoLock);
	foreach(lc, expired)
	{
		Oid			part = lfirst_oid(lc);

		if (!ConditionalLockRelationOid(part, AccessExclusiveLock))
		{
			ereport(DEBUG1,
					(errmsg_internal("expired archive partition %s is in use: retired at a later run",
									 get_rel_name(part))));
			continue;
		}
		pgq_retire_partition(relid, part);
	}
}

/* Run a step of the upkeep: a failure is logged, and tried again later. */
static void
pgq_archive_try(void (*fn) (void *), void *arg, const char *what)
{
	pgq_upkeep_try(fn, arg, what, "The upkeep tries again within a minute.");
}

/* Whether the archive's upkeep is due: once a minute per backend. */
bool
pgq_archive_maintain_wanted(void)
{
	return GetCurrentTimestamp() >= next_maintain;
}

/*
 * The archive's upkeep: make the partitions needed over the next day and
 * retire those whose rows have all expired (retire.c drops them later).
 * Only for 1.1 databases.  Waits at most PGQ_ARCHIVE_LOCK_TIMEOUT_MS for
 * each lock on pgqueue.archive, and not at all for a partition's.  Never
 * raises an error of its own (each step runs in a subtransaction).  The
 * caller runs it in a transaction that ends with it, so that ACCESS
 * EXCLUSIVE on the archive is held for a moment only: the scheduler in a
 * transaction of its own after its pass, a user's pgq_schedule only
 * outside a transaction block (see pgq_schedule); in a database where the
 * extension is installed.
 */
void
pgq_archive_maintain(void)
{
	int			nestlevel;

	next_maintain = GetCurrentTimestamp() + PGQ_ARCHIVE_MAINTAIN_USECS;
	if (pgq_layout() < PGQ_V11)
		return;
	nestlevel = NewGUCNestLevel();
	(void) set_config_option("lock_timeout", PGQ_ARCHIVE_LOCK_TIMEOUT_MS,
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	pgq_archive_try(pgq_archive_make_ahead, NULL, "make archive partitions");
	pgq_archive_try(pgq_archive_retire_expired, NULL, "retire expired archive partitions");
	AtEOXact_GUC(true, nestlevel);
}
