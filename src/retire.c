/*-------------------------------------------------------------------------
 *
 * retire.c
 *		Removing a partition that pgqueue made at run time (an expired day
 *		of pgqueue.archive, a slot of a ring) without failing a pg_dump
 *		that is running: first retire it, drop it later.
 *
 * Why not DROP TABLE at once.  pg_dump reads pg_class with its snapshot,
 * then LOCKs by name each table it will dump.  A table dropped in between
 * makes it fail ("relation ... does not exist"), and a backup that fails
 * at random is a backup not taken.  pg_dump neither dumps nor locks the
 * tables that are members of an extension (checked with pg_dump 15), so a
 * table is retired by making it one:
 *
 *	 ALTER TABLE parent DETACH PARTITION t;
 *	 ALTER EXTENSION pgqueue ADD TABLE t;
 *
 * Every pg_dump whose snapshot is taken after that commits leaves t out;
 * one whose snapshot is older still finds t under its name, locks it and
 * dumps it as the partition its snapshot shows (a restore attaches it
 * again, and the restored upkeep retires it again).  So t may be dropped
 * once no snapshot taken before its retirement can still be in use
 * (pgq_snapshots_before): then pgq_retired_drop drops it.
 *
 * Which snapshots.  A backend of this database whose xmin precedes the
 * next transaction id read after the retirement committed (an older
 * snapshot has an xmin no later than the retiring transaction's id, which
 * precedes it); VACUUM's, which reads no row it returns, excepted.  A
 * standby with hot_standby_feedback reports the xmin of its oldest
 * snapshot: its walsender's xmin, or its replication slot's.  Backends of
 * other databases cannot read our tables.  The next transaction id is
 * read when this backend first sees the table retired, which after a
 * restart is later than the retirement: later is conservative (more
 * snapshots count as older).
 *
 * Locks.  Retiring takes ACCESS EXCLUSIVE on the parent and the table (the
 * caller takes them, within a bounded time or without waiting); dropping
 * takes ACCESS EXCLUSIVE on the retired table only, without waiting.  Both
 * take SHARE UPDATE EXCLUSIVE on the extension (ALTER EXTENSION), without
 * waiting.  Nothing here waits for a lock without bound.
 *
 * Layer 3 of src/README (storage): it may call the other files of its
 * layer, those of shared memory and wake-ups (shmem.c, publish.c,
 * bounds.c), and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/nbtxlog.h"
#include "access/rmgr.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xloginsert.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "storage.h"

/*
 * How often pgq_retired_drop looks, at most: after a look that found
 * retired tables (dropped, or waiting for old snapshots), and after one
 * that found none (a table retired by another backend, or before a
 * restart, is found so).  A retirement by this backend makes the next
 * call look at once.
 */
#define PGQ_RETIRED_RETRY_USECS		(INT64CONST(1) * USECS_PER_SEC)
#define PGQ_RETIRED_LOOK_USECS		(INT64CONST(60) * USECS_PER_SEC)

/* A retired table this backend has seen, by OID. */
typedef struct RetiredEntry
{
	Oid			relid;			/* hash key */
	TransactionId next_xid;		/* the next xid when first seen retired */
	bool		seen;			/* found by the current look */
} RetiredEntry;

/* A retired table found by a look, that may be dropped now. */
typedef struct RetiredTable
{
	Oid			relid;
	char	   *name;			/* schema-qualified, quoted */
} RetiredTable;

static HTAB *retired = NULL;
static TimestampTz next_look = 0;
static bool retired_found = false;	/* the last look found retired tables */
static SPIPlanPtr plan_retired = NULL;
static SPIPlanPtr plan_standbys = NULL;

static char *pgq_qualified_relname(Oid relid);
static void pgq_lock_extension_nowait(Oid extoid, const char *why);
static void pgq_retire_ddl(const char *sql);
static List *pgq_retired_tables(void);
static void pgq_retired_drop_all(void *arg);
static void pgq_retired_drop_one(void *arg);

/* schema.name of relation relid, quoted; an error when it is gone. */
static char *
pgq_qualified_relname(Oid relid)
{
	char	   *name = get_rel_name(relid);
	char	   *nsp = get_namespace_name(get_rel_namespace(relid));

	if (name == NULL || nsp == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", relid)));
	return quote_qualified_identifier(nsp, name);
}

/*
 * SHARE UPDATE EXCLUSIVE on extension pgqueue, which ALTER EXTENSION takes,
 * had at once or an error (55P03): it conflicts with another ALTER
 * EXTENSION and with DROP EXTENSION, which are not waited for.
 */
static void
pgq_lock_extension_nowait(Oid extoid, const char *why)
{
	if (!ConditionalLockDatabaseObject(ExtensionRelationId, extoid, 0,
									   ShareUpdateExclusiveLock))
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not lock extension pgqueue to %s", why),
				 errdetail("Another session is altering or dropping the extension.")));
}

/* Run one statement of DDL (pgqueue's own: hook.c); the caller is connected to SPI. */
static void
pgq_retire_ddl(const char *sql)
{
	if (pgq_spi_ddl(sql) != SPI_OK_UTILITY)
		elog(ERROR, "could not run \"%s\"", sql);
}

/*
 * Retire partition relid of parent: detach it and make it a member of
 * extension pgqueue, so that no pg_dump whose snapshot is taken after this
 * commits dumps or locks it; pgq_retired_drop drops it later.  The caller
 * holds ACCESS EXCLUSIVE on parent and relid, taken without waiting or
 * within a bounded time, in a transaction that ends soon after (its own,
 * or a statement's that commits with it); the caller may be connected to
 * SPI.  Raises 55P03 when the extension is being altered or dropped.
 */
void
pgq_retire_partition(Oid parent, Oid relid)
{
	Oid			extoid = get_extension_oid("pgqueue", false);
	char	   *parent_name = pgq_qualified_relname(parent);
	char	   *name = pgq_qualified_relname(relid);
	LOCKTAG		tag;
	int			nest;

	SET_LOCKTAG_RELATION(tag, MyDatabaseId, parent);
	if (!pgq_lock_held_by_me(&tag, AccessExclusiveLock))
		elog(ERROR, "retiring %s without ACCESS EXCLUSIVE on %s", name, parent_name);
	SET_LOCKTAG_RELATION(tag, MyDatabaseId, relid);
	if (!pgq_lock_held_by_me(&tag, AccessExclusiveLock))
		elog(ERROR, "retiring %s without ACCESS EXCLUSIVE on it", name);
	pgq_lock_extension_nowait(extoid, psprintf("retire %s", name));

	nest = pgq_spi_connect();
	pgq_retire_ddl(psprintf("ALTER TABLE %s DETACH PARTITION %s", parent_name, name));
	pgq_retire_ddl(psprintf("ALTER EXTENSION pgqueue ADD TABLE %s", name));
	pgq_spi_finish(nest);

	next_look = 0;				/* pgq_retired_drop: look at once */
	ereport(DEBUG1, (errmsg_internal("retired %s", name)));
}

/*
 * Whether a snapshot that may have been taken before xid was assigned can
 * still be in use (see the file's header): a backend of this database,
 * other than this one and VACUUM, whose xmin precedes xid; or a standby
 * (pgq_standby_snapshots_before).  Pass the next transaction id read
 * after the event that such snapshots must not miss has committed.  The
 * caller is inside a transaction that began after that event, and may be
 * connected to SPI.
 */
bool
pgq_snapshots_before(TransactionId xid)
{
	TransactionId limit = xid;
	VirtualTransactionId *vxids;
	int			n;

	/* xmin <= xid - 1: older than xid */
	TransactionIdRetreat(limit);
	vxids = GetCurrentVirtualXIDs(limit, true, false, PROC_IN_VACUUM, &n);
	pfree(vxids);
	return n > 0 || pgq_standby_snapshots_before(xid);
}

/*
 * Whether a hot standby may hold a snapshot taken before xid was assigned:
 * the xmin a standby reports with hot_standby_feedback, which its
 * walsender holds (or its replication slot, which keeps it while the
 * standby is away), precedes xid.  A standby's snapshots are known only as
 * that oldest xmin.  The walsenders' xmins are read from pg_stat_activity,
 * which a transaction reads once: the caller is inside a transaction that
 * began after the event such snapshots must not miss, and may be connected
 * to SPI.
 */
bool
pgq_standby_snapshots_before(TransactionId xid)
{
	int			nest;
	uint64		i;
	bool		found = false;

	nest = pgq_spi_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_standbys,
									   "SELECT a.backend_xmin FROM pg_catalog.pg_stat_activity a"
									   " WHERE a.backend_type = 'walsender' AND a.backend_xmin IS NOT NULL"
									   " UNION ALL"
									   " SELECT s.xmin FROM pg_catalog.pg_replication_slots s"
									   " WHERE s.xmin IS NOT NULL",
									   0, NULL),
						 NULL, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the xmin of the standbys");
	for (i = 0; i < SPI_processed && !found; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);

		found = !isnull && TransactionIdPrecedes(DatumGetTransactionId(d), xid);
	}
	pgq_spi_finish(nest);
	return found;
}

/*
 * Make a hot standby cancel, before it replays what this transaction does
 * next (a TRUNCATE of rel), every query whose snapshot may have been taken
 * before xid was assigned: the recovery conflict that VACUUM's cleanup
 * raises for the snapshots that could still see the rows it removes.
 *
 * hot_standby_feedback lets the primary wait for the standby's snapshots
 * (pgq_standby_snapshots_before), but only as far as the primary knows
 * them: a standby that runs without it, one that is away, and a
 * replication slot whose xmin a crash of the primary set back to what the
 * last checkpoint saved (an invalid one, if no checkpoint saved the
 * standby's feedback) report nothing, and a standby snapshot taken before
 * the slot's rows were deleted, reading the slot after the truncation was
 * replayed, would find it empty: a wrong answer, without an error.  With
 * this record replay waits for such a query up to
 * max_standby_streaming_delay, then cancels it (SQLSTATE 40001, "conflict
 * with recovery"), as it does for VACUUM.
 *
 * The record is a btree XLOG_BTREE_REUSE_PAGE, whose replay does nothing
 * but that (ResolveRecoveryConflictWithSnapshotFullXid for its horizon in
 * its relation's database; it names no page to read), and which every
 * standby replays without pgqueue loaded: a resource manager of our own
 * would make a standby without pgqueue in shared_preload_libraries fail to
 * replay.  Its horizon is xid - 1: every snapshot whose xmin is not later
 * (the ones that may not see every transaction before xid as ended) is
 * cancelled.  Pass the next transaction id read after the slot's last rows
 * were found deleted (waits_over).  With hot_standby_feedback on and the
 * standby connected, no standby snapshot is that old when the primary
 * truncates, and nothing is cancelled.
 */
void
pgq_standby_conflict(Relation rel, TransactionId xid)
{
	xl_btree_reuse_page xlrec;
	FullTransactionId next;
	FullTransactionId horizon;
	uint32		epoch;

	if (!XLogStandbyInfoActive() || !TransactionIdIsNormal(xid))
		return;

	/* xid was read before next: in next's epoch, or the one before */
	next = ReadNextFullTransactionId();
	epoch = EpochFromFullTransactionId(next);
	if (xid > XidFromFullTransactionId(next) && epoch > 0)
		epoch--;
	horizon = FullTransactionIdFromEpochAndXid(epoch, xid);
	FullTransactionIdRetreat(&horizon);

	pgq_fill_btree_reuse_page(&xlrec, rel, horizon);

	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, SizeOfBtreeReusePage);
	(void) XLogInsert(RM_BTREE_ID, XLOG_BTREE_REUSE_PAGE);
}

/* Whether pgq_retired_drop is due (see PGQ_RETIRED_RETRY_USECS). */
bool
pgq_retired_drop_wanted(void)
{
	return GetCurrentTimestamp() >= next_look;
}

/*
 * The retired tables of this database that no snapshot from before their
 * retirement can use any more, as a List of RetiredTable, each noted in
 * retired (first seen now: the next xid now); forgets the tables no longer
 * retired.  Retired tables are plain tables of schema pgqueue, members of
 * extension pgqueue (pg_depend, deptype 'e'), named as pgqueue names the
 * tables it makes at run time: the extension's own tables are none of
 * these.  A table that the current transaction retired is left out: its
 * retirement is not committed, and a snapshot taken before the commit
 * would not see it.
 */
static List *
pgq_retired_tables(void)
{
	Oid			types[2] = {OIDOID, OIDOID};
	Datum		args[2];
	MemoryContext outer = CurrentMemoryContext;
	HASH_SEQ_STATUS seq;
	RetiredEntry *e;
	List	   *found = NIL;
	List	   *ready = NIL;
	ListCell   *lc;
	int			nest;
	uint64		i;

	if (retired == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(RetiredEntry);
		ctl.hcxt = TopMemoryContext;
		retired = hash_create("pgqueue retired tables", 16, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	hash_seq_init(&seq, retired);
	while ((e = hash_seq_search(&seq)) != NULL)
		e->seen = false;

	args[0] = ObjectIdGetDatum(get_extension_oid("pgqueue", false));
	args[1] = ObjectIdGetDatum(get_namespace_oid("pgqueue", false));
	nest = pgq_spi_connect();
	if (SPI_execute_plan(pgq_keep_plan(&plan_retired,
									   "SELECT c.oid, n.nspname, c.relname, d.xmin"
									   "  FROM pg_catalog.pg_depend d"
									   "  JOIN pg_catalog.pg_class c ON c.oid = d.objid"
									   "  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
									   " WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass"
									   "   AND d.objsubid = 0 AND d.deptype = 'e'"
									   "   AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass"
									   "   AND d.refobjid = $1 AND c.relnamespace = $2"
									   "   AND c.relkind = 'r' AND NOT c.relispartition"
									   "   AND (c.relname OPERATOR(pg_catalog.~) '^(queue|work_queue)_[0-9]+$'"
									   "        OR c.relname OPERATOR(pg_catalog.~) '^archive_')",
									   2, types),
						 args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not look for retired tables");
	/* the tables, copied out of SPI's memory */
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		TransactionId xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 4, &isnull));
		MemoryContext spicxt;
		RetiredTable *t;

		retired_found = true;
		if (TransactionIdIsCurrentTransactionId(xmin))
			continue;
		spicxt = MemoryContextSwitchTo(outer);
		t = palloc(sizeof(RetiredTable));
		t->relid = DatumGetObjectId(SPI_getbinval(tup, desc, 1, &isnull));
		t->name = quote_qualified_identifier(SPI_getvalue(tup, desc, 2),
											 SPI_getvalue(tup, desc, 3));
		found = lappend(found, t);
		MemoryContextSwitchTo(spicxt);
	}
	pgq_spi_finish(nest);

	foreach(lc, found)
	{
		RetiredTable *t = lfirst(lc);
		bool		known;

		e = hash_search(retired, &t->relid, HASH_ENTER, &known);
		if (!known)
			e->next_xid = ReadNextTransactionId();
		e->seen = true;
		if (!pgq_snapshots_before(e->next_xid))
			ready = lappend(ready, t);
	}

	hash_seq_init(&seq, retired);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (!e->seen)
			(void) hash_search(retired, &e->relid, HASH_REMOVE, NULL);
	return ready;
}

/*
 * Drop one retired table (a RetiredTable) that no old snapshot can use:
 * under ACCESS EXCLUSIVE had at once (a session that reads it by name
 * keeps it to a later look), out of the extension, then dropped.
 */
static void
pgq_retired_drop_one(void *arg)
{
	RetiredTable *t = (RetiredTable *) arg;
	int			nest;

	if (!ConditionalLockRelationOid(t->relid, AccessExclusiveLock))
		return;
	/* dropped, or attached again, meanwhile */
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(t->relid)) ||
		get_rel_relispartition(t->relid))
	{
		UnlockRelationOid(t->relid, AccessExclusiveLock);
		return;
	}
	pgq_lock_extension_nowait(get_extension_oid("pgqueue", false),
							  psprintf("drop %s", t->name));
	nest = pgq_spi_connect();
	pgq_retire_ddl(psprintf("ALTER EXTENSION pgqueue DROP TABLE %s", t->name));
	pgq_retire_ddl(psprintf("DROP TABLE %s", t->name));
	pgq_spi_finish(nest);
	(void) hash_search(retired, &t->relid, HASH_REMOVE, NULL);
	ereport(DEBUG1, (errmsg_internal("dropped retired table %s", t->name)));
}

/* pgq_retired_drop's look, then a subtransaction per table it may drop. */
static void
pgq_retired_drop_all(void *arg)
{
	ListCell   *lc;

	foreach(lc, pgq_retired_tables())
	{
		RetiredTable *t = lfirst(lc);

		pgq_upkeep_try(pgq_retired_drop_one, t, psprintf("drop retired table %s", t->name),
					   "It is dropped at a later run of the upkeep.");
	}
}

/*
 * Drop the retired tables of this database that no snapshot taken before
 * their retirement can still use (see the file's header), each if
 * ACCESS EXCLUSIVE on it is had at once; the others wait for a later call.
 * Never waits for a lock, and never raises an error of its own (each step
 * runs in a subtransaction; a failure is logged).  Called in a transaction
 * of its own, or at least one that ends soon after (a user's pgq_schedule
 * outside a transaction block), in a database where the extension is
 * installed.
 */
void
pgq_retired_drop(void)
{
	retired_found = false;
	pgq_upkeep_try(pgq_retired_drop_all, NULL, "look for retired tables",
				   "It is tried again at a later run of the upkeep.");
	/* soon again while there were some: dropped, or waiting */
	next_look = GetCurrentTimestamp() +
		(retired_found ? PGQ_RETIRED_RETRY_USECS : PGQ_RETIRED_LOOK_USECS);
}
