/*-------------------------------------------------------------------------
 *
 * pgq_compat.h
 *		The differences between the PostgreSQL majors pgqueue builds
 *		against, so that the rest of the code calls one name on each.
 *
 * Each difference is a macro or a static inline wrapper, guarded by the
 * exact range of PG_VERSION_NUM it holds for and naming the release (and,
 * where known, the upstream commit) that changed it.  The wrappers keep
 * the behaviour of the oldest major: a new argument gets the value that
 * does what the call did before.
 *
 * Built and tested against 15, 17 and 18.  The 16 branches are written
 * from the upstream changes named below but were never compiled here (no
 * PostgreSQL 16 was at hand); 16 shares every branch with 17 except those
 * guarded at 170000.  14 and older are refused: pgqueue needs 15's
 * shmem_request_hook, MarkGUCPrefixReserved and InitMaterializedSRF.
 *
 * Where 19 is known to change a call again, its branch is an #error
 * rather than a guess: see pgq_index_beginscan and
 * pgq_insert_index_tuples.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQ_COMPAT_H
#define PGQ_COMPAT_H

#include "access/genam.h"
#include "access/nbtxlog.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "catalog/pg_class.h"
#include "catalog/pg_database.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/bitmapset.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/rel.h"
#include "utils/relcache.h"

#if PG_VERSION_NUM < 150000
#error "pgqueue needs PostgreSQL 15 or later"
#endif

/* ----------------------------------------------------------------
 * Index scans
 * ----------------------------------------------------------------
 */

/*
 * index_beginscan: 18 adds IndexScanInstrumentation *instrument before
 * nkeys (postgres 0fbceae841c, "Show index search count in EXPLAIN
 * ANALYZE, take 2"); NULL asks for none, as before.  19 adds a flags word
 * at the end (postgres dcd8cc1c852).
 *   15-17: index_beginscan(heap, index, snapshot, nkeys, norderbys)
 *   18:    index_beginscan(heap, index, snapshot, instrument, nkeys, norderbys)
 */
#if PG_VERSION_NUM >= 190000
#error "pgq_index_beginscan: index_beginscan takes a flags argument from PostgreSQL 19; add its branch"
#elif PG_VERSION_NUM >= 180000
#define pgq_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define pgq_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/*
 * The relation's primary key index: 18 adds bool deferrable_ok (with
 * relcache's rd_ispkdeferrable; the upstream commit was not looked up);
 * false gives InvalidOid for a DEFERRABLE primary key, which 15-17 never
 * returned either (RelationGetIndexList skipped non-immediate indexes).
 *   15-17: RelationGetPrimaryKeyIndex(rel)
 *   18:    RelationGetPrimaryKeyIndex(rel, deferrable_ok)
 */
#if PG_VERSION_NUM >= 180000
#define pgq_primary_key_index(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define pgq_primary_key_index(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/* ----------------------------------------------------------------
 * Writes through the table access method (tables.c, archive.c,
 * schedule.c)
 * ----------------------------------------------------------------
 */

/*
 * What table_tuple_update says of the new version's index entries: bool
 * *update_indexes in 15; TU_UpdateIndexes * from 16 (postgres
 * 19d8e2308bc, "Ignore BRIN indexes when checking for HOT updates"):
 * TU_None, TU_All, or TU_Summarizing, a HOT update after which only the
 * summarizing (BRIN) indexes want entries.
 *
 * PGQ_UPDATE_NEEDS_INDEXES(u): whether ExecInsertIndexTuples is to be
 * called; PGQ_UPDATE_ONLY_SUMMARIZING(u): its only_summarizing argument
 * (pgq_insert_index_tuples).  Passing false after a TU_Summarizing update
 * would add btree entries for a heap-only tuple.
 */
#if PG_VERSION_NUM >= 160000
typedef TU_UpdateIndexes PgqUpdateIndexes;
#define PGQ_UPDATE_NEEDS_INDEXES(u) ((u) != TU_None)
#define PGQ_UPDATE_ONLY_SUMMARIZING(u) ((u) == TU_Summarizing)
#else
typedef bool PgqUpdateIndexes;
#define PGQ_UPDATE_NEEDS_INDEXES(u) (u)
#define PGQ_UPDATE_ONLY_SUMMARIZING(u) false
#endif

/*
 * ExecInsertIndexTuples without speculative insertion or arbiter indexes
 * (noDupErr false, specConflict NULL, arbiterIndexes NIL):
 *   15:    (rri, slot, estate, update, noDupErr, specConflict, arbiterIndexes)
 *   16-18: (..., arbiterIndexes, bool onlySummarizing)   (postgres 19d8e2308bc)
 * 19 reorders the arguments and folds the booleans into a flags word.
 */
static inline List *
pgq_insert_index_tuples(ResultRelInfo *rri, TupleTableSlot *slot,
						EState *estate, bool update, bool only_summarizing)
{
#if PG_VERSION_NUM >= 190000
#error "pgq_insert_index_tuples: ExecInsertIndexTuples changed in PostgreSQL 19; add its branch"
#elif PG_VERSION_NUM >= 160000
	return ExecInsertIndexTuples(rri, slot, estate, update, false, NULL, NIL,
								 only_summarizing);
#else
	Assert(!only_summarizing);
	return ExecInsertIndexTuples(rri, slot, estate, update, false, NULL, NIL);
#endif
}

/*
 * Range tables that pgqueue builds itself, of RTE_RELATION entries for
 * the tables it writes (tables.c's pool, archive.c's one entry).
 *
 * From 16 (postgres a61b1f74823, "Rework query relation permission
 * checking") what the executor knows of an entry's columns lives in an
 * RTEPermissionInfo of a list beside the range table, which the entry
 * points to (perminfoindex), and updatedCols moved there from the entry.
 * The executor reads it for every non-HOT update (index_unchanged_by_update
 * through ExecGetUpdatedCols) and for ExecConstraints' error detail: an
 * entry without one fails with "invalid perminfoindex 0 in RTE", one whose
 * relid differs from the entry's with "permission info at index ... does
 * not match".  pgqueue never checks permissions from them (no
 * ExecCheckPermissions): requiredPerms stays 0, as the entries' own did
 * in 15.
 *
 * So: entries are made by pgq_make_rte, which appends their
 * RTEPermissionInfo to *perminfos (NIL in 15); their relid and updated
 * columns are set with pgq_rte_set_relid and pgq_rte_set_updated_cols,
 * which keep the two in step; and pgq_init_range_table hands both lists
 * to the executor state.  pgq_estate_perminfos(estate) is the list an
 * executor state was given (NIL in 15).
 */
#if PG_VERSION_NUM >= 160000
#define pgq_estate_perminfos(estate) ((estate)->es_rteperminfos)
#else
#define pgq_estate_perminfos(estate) NIL
#endif

/* A new RTE_RELATION entry (no relation yet), in the current context. */
static inline RangeTblEntry *
pgq_make_rte(List **perminfos, LOCKMODE lockmode)
{
	RangeTblEntry *rte = makeNode(RangeTblEntry);

	rte->rtekind = RTE_RELATION;
	rte->relid = InvalidOid;
	rte->relkind = RELKIND_RELATION;
	rte->rellockmode = lockmode;
#if PG_VERSION_NUM >= 160000
	{
		RTEPermissionInfo *perminfo = makeNode(RTEPermissionInfo);

		perminfo->relid = InvalidOid;
		perminfo->inh = false;
		perminfo->checkAsUser = InvalidOid;
		*perminfos = lappend(*perminfos, perminfo);
		rte->perminfoindex = list_length(*perminfos);
	}
#else
	(void) perminfos;
#endif
	return rte;
}

#if PG_VERSION_NUM >= 160000
/* rte's RTEPermissionInfo in perminfos, whatever its relid. */
static inline RTEPermissionInfo *
pgq_rte_perminfo(List *perminfos, RangeTblEntry *rte)
{
	Assert(rte->perminfoindex > 0 && rte->perminfoindex <= list_length(perminfos));
	return list_nth_node(RTEPermissionInfo, perminfos, rte->perminfoindex - 1);
}
#endif

/* Make rte (made by pgq_make_rte with perminfos) an entry of relid. */
static inline void
pgq_rte_set_relid(List *perminfos, RangeTblEntry *rte, Oid relid)
{
	rte->relid = relid;
#if PG_VERSION_NUM >= 160000
	pgq_rte_perminfo(perminfos, rte)->relid = relid;
#else
	(void) perminfos;
#endif
}

/* The columns (attnum - FirstLowInvalidHeapAttributeNumber) the next update of rte changes. */
static inline void
pgq_rte_set_updated_cols(List *perminfos, RangeTblEntry *rte, Bitmapset *cols)
{
#if PG_VERSION_NUM >= 160000
	pgq_rte_perminfo(perminfos, rte)->updatedCols = cols;
#else
	(void) perminfos;
	rte->updatedCols = cols;
#endif
}

/*
 * ExecInitRangeTable for a range table of pgq_make_rte's entries:
 *   15:    ExecInitRangeTable(estate, rangeTable)
 *   16-17: ExecInitRangeTable(estate, rangeTable, permInfos)   (postgres a61b1f74823)
 *   18:    ExecInitRangeTable(estate, rangeTable, permInfos, unpruned_relids)
 *          (postgres cbc12791, "Track unpruned relids to avoid processing
 *          pruned relations")
 * In 18 every entry is unpruned (nothing here is pruned, and
 * ExecGetRangeTableRelation refuses a pruned entry); the set lives in the
 * executor state's memory.
 */
static inline void
pgq_init_range_table(EState *estate, List *rtable, List *perminfos)
{
#if PG_VERSION_NUM >= 180000
	MemoryContext old = MemoryContextSwitchTo(estate->es_query_cxt);
	Bitmapset  *unpruned = bms_add_range(NULL, 1, list_length(rtable));

	MemoryContextSwitchTo(old);
	ExecInitRangeTable(estate, rtable, perminfos, unpruned);
#elif PG_VERSION_NUM >= 160000
	ExecInitRangeTable(estate, rtable, perminfos);
#else
	Assert(perminfos == NIL);
	ExecInitRangeTable(estate, rtable);
#endif
}

/* ----------------------------------------------------------------
 * Statistics (schedule.c, ring.c)
 * ----------------------------------------------------------------
 */

/*
 * 16 dropped the prefixes of the table statistics' fields:
 * PgStat_TableStatus.t_counts became counts, PgStat_TableCounts's
 * t_tuples_returned tuples_returned, PgStat_StatTabEntry's
 * n_live_tuples/n_dead_tuples live_tuples/dead_tuples.  (Release 16 as
 * other extensions report it; the upstream commit was not looked up.)
 */
#if PG_VERSION_NUM >= 160000
#define pgq_tabstat_tuples_returned(ts) ((ts)->counts.tuples_returned)
#define pgq_tabentry_live_tuples(e) ((e)->live_tuples)
#define pgq_tabentry_dead_tuples(e) ((e)->dead_tuples)
#else
#define pgq_tabstat_tuples_returned(ts) ((ts)->t_counts.t_tuples_returned)
#define pgq_tabentry_live_tuples(e) ((e)->n_live_tuples)
#define pgq_tabentry_dead_tuples(e) ((e)->n_dead_tuples)
#endif

/* ----------------------------------------------------------------
 * Processes (shmem.c)
 * ----------------------------------------------------------------
 */

/*
 * This backend's PGPROC number, the index of its PGPROC in
 * ProcGlobal->allProcs (what SetLatch of another process is given):
 * MyProc->pgprocno up to 16; 17 removed the field for MyProcNumber, the
 * same value (Heikki Linnakangas's ProcNumber changes, postgres
 * 024c521117 among them).
 */
#if PG_VERSION_NUM >= 170000
#define pgq_my_procno() ((int) MyProcNumber)
#else
#define pgq_my_procno() (MyProc->pgprocno)
#endif

/*
 * A backend's number, which indexes pgq_shared->calls, and that of a
 * virtual transaction id's backend: BackendId up to 16 (1-based),
 * ProcNumber from 17 (0-based; postgres 024c521117, "Replace BackendIds
 * with 0-based ProcNumbers").  Both are below the number of PGPROCs.
 */
#if PG_VERSION_NUM >= 170000
#define pgq_my_backend() ((int) MyProcNumber)
#define pgq_vxid_backend(v) ((int) (v).procNumber)
#else
#define pgq_my_backend() ((int) MyBackendId)
#define pgq_vxid_backend(v) ((int) (v).backendId)
#endif

/* ----------------------------------------------------------------
 * Locks and rights (retire.c, hook.c)
 * ----------------------------------------------------------------
 */

/*
 * Whether this transaction holds lockmode itself on locktag: 17 merged
 * LockOrStrongerHeldByMe into LockHeldByMe (bool orstronger; postgres
 * 0cecc908e97); false asks what 15-16's LockHeldByMe did.
 */
#if PG_VERSION_NUM >= 170000
#define pgq_lock_held_by_me(locktag, lockmode) LockHeldByMe((locktag), (lockmode), false)
#else
#define pgq_lock_held_by_me(locktag, lockmode) LockHeldByMe((locktag), (lockmode))
#endif

/*
 * Whether roleid owns database dboid: 16 replaced the pg_*_ownercheck
 * functions with object_ownercheck (postgres afbfc029, "Replace
 * pg_foo_ownercheck() with object_ownercheck").
 */
#if PG_VERSION_NUM >= 160000
#define pgq_database_ownercheck(dboid, roleid) \
	object_ownercheck(DatabaseRelationId, (dboid), (roleid))
#else
#define pgq_database_ownercheck(dboid, roleid) pg_database_ownercheck((dboid), (roleid))
#endif

/* ----------------------------------------------------------------
 * WAL (retire.c)
 * ----------------------------------------------------------------
 */

/*
 * Fill a btree XLOG_BTREE_REUSE_PAGE record for relation rel and the
 * recovery conflict horizon horizon (block 0).  16 renamed its node to
 * locator (RelFileNode became RelFileLocator) and latestRemovedFullXid to
 * snapshotConflictHorizon, and added isCatalogRel (for logical decoding
 * on standbys): false, as for any table that is not a catalog.  (The
 * upstream commits were not looked up.)
 */
static inline void
pgq_fill_btree_reuse_page(xl_btree_reuse_page *xlrec, Relation rel,
						  FullTransactionId horizon)
{
	memset(xlrec, 0, sizeof(*xlrec));
#if PG_VERSION_NUM >= 160000
	xlrec->locator = rel->rd_locator;
	xlrec->snapshotConflictHorizon = horizon;
	xlrec->isCatalogRel = false;
#else
	xlrec->node = rel->rd_node;
	xlrec->latestRemovedFullXid = horizon;
#endif
	xlrec->block = 0;
}

#endif							/* PGQ_COMPAT_H */
