/*-------------------------------------------------------------------------
 *
 * hook.c
 *		pgqueue's ProcessUtility hook, installed only when the library is
 *		preloaded (only then are there schedulers).  It looks at two kinds
 *		of statement; every other one costs a switch on its node tag.
 *
 * Restores pause the scheduler.  pg_restore and psql < dump build and load
 * pgqueue's tables directly: CREATE EXTENSION makes them empty, the dump's
 * CREATE TABLE and ALTER TABLE ... ATTACH PARTITION bring back the slots and
 * archive partitions made at run time, COPY loads the rows (by table name:
 * the jobs before the queue settings and pgqueue.slots), CREATE INDEX and
 * ADD CONSTRAINT come last.  A scheduler that runs in between sees a
 * half-restored database: it schedules a paused queue's jobs (the setting
 * is not in yet), takes restored slots for empty ones (their pgqueue.slots
 * rows are not in yet) and truncates or drops them, and writes
 * pgqueue.slots rows of its own, on which the dump's rows then fail.
 *
 * So such a statement, sent at top level by a superuser's session that is
 * not a pgqueue process (as pg_restore and psql send them; not one run by a
 * function or DO block, an extension's script, or pgqueue's own DDL,
 * pgq_spi_ddl), lists the session in shared memory for its database
 * (shmem.c, pgq_restore_note).  The statements: COPY ... FROM into a table
 * of schema pgqueue; CREATE TABLE or CREATE INDEX in it; ALTER TABLE or
 * ALTER INDEX of one of its tables that attaches a partition or adds a
 * constraint or an index.  Names must be schema-qualified, as pg_dump
 * writes them.  The scheduler of that database does nothing (no pass, no
 * upkeep of the rings or the archive) while the session is a backend of
 * the database, and for PGQ_RESTORE_GRACE_SECS after its latest such
 * statement or its end, whichever is later, which covers the gap between
 * the sections of a restore run as separate pg_restore invocations
 * (worker.c).  A pass already under way when the first such statement
 * comes is waited for before it runs.  A restore in a single transaction
 * (-1) shows nothing before it commits; the pause costs it nothing either.
 *
 * Database commands hold the scheduler off.  CREATE DATABASE (from its
 * TEMPLATE, template1 by default), ALTER DATABASE ... RENAME, ALTER
 * DATABASE ... SET TABLESPACE and DROP DATABASE fail with "being accessed
 * by other users" while another session is connected to the database they
 * act on, after waiting up to 5 s for such sessions to go
 * (CountOtherDBBackends); a scheduler, connected from start to end, even
 * before CREATE EXTENSION, is such a session.  As TimescaleDB's loader
 * does, before such a command on a database of pgqueue.database, run by a
 * role that may run it (a superuser, the database's owner, or for CREATE
 * DATABASE a role with CREATEDB: no one else can stop a scheduler this
 * way), the hook holds its scheduler off (shmem.c, pgq_hold_take): the
 * launcher does not start it, a running one is told to exit (SIGTERM: it
 * ends its pass and exits), one that starts sees the hold and exits before
 * it connects.  The command waits up to PGQ_HOLD_WAIT_MS for it to be gone
 * (out of the proc array, where CountOtherDBBackends looks), runs, and
 * releases the hold whether it succeeded or failed; a hold whose backend
 * died is released by the launcher.  The hold ends before the command
 * commits: from its check of other sessions on, the command holds the
 * database's lock (SHARE for a template, ACCESS EXCLUSIVE otherwise), which
 * a connecting scheduler waits for, and the launcher looks at the database
 * again once it is free (launcher.c).  After a RENAME or a DROP, the name
 * in pgqueue.database names no database: the launcher logs it once and
 * looks again every second (docs/operations.md: change pgqueue.database and restart).
 *
 * Layer 6 of src/README (processes and hooks): it may call the other
 * files of its layer, the SQL entry points (api.c, admin.c) and every
 * layer below them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "pgqueue.h"

/* Set by the launcher and the schedulers: their statements are ours. */
bool		pgq_is_pgqueue_process = false;

static ProcessUtility_hook_type prev_ProcessUtility = NULL;

/* Whether this session's database has a scheduler: -1 not yet known. */
static int	my_db_scheduled = -1;

static void pgq_process_utility(PlannedStmt *pstmt, const char *queryString,
								bool readOnlyTree, ProcessUtilityContext context,
								ParamListInfo params, QueryEnvironment *queryEnv,
								DestReceiver *dest, QueryCompletion *qc);
static void pgq_next_utility(PlannedStmt *pstmt, const char *queryString,
							 bool readOnlyTree, ProcessUtilityContext context,
							 ParamListInfo params, QueryEnvironment *queryEnv,
							 DestReceiver *dest, QueryCompletion *qc);
static bool pgq_in_schema(const RangeVar *rel);
static bool pgq_loads_tables(Node *parsetree);
static void pgq_restore_begins(void);
static void pgq_restore_slot_columns(AlterTableStmt *stmt);
static bool pgq_restore_failed_index(IndexStmt *stmt);
static void pgq_restore_group_index(const char *rel);
static const char *pgq_database_command(Node *parsetree, const char **what);
static bool pgq_may_run(Node *parsetree, const char *dbname);
static int	pgq_hold_schedulers(Node *parsetree, const char *dbname,
								int *dbindexes, pid_t *pids);
static void pgq_stop_scheduler(const char *dbname, int dbindex, pid_t pid,
							   const char *what);

/* Install the hook, chaining to the one before; from _PG_init, preloading. */
void
pgq_hook_install(void)
{
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = pgq_process_utility;
}

/*
 * The hook.  A statement that loads pgqueue's tables lists this session as
 * restoring before it runs; a command on a database whose scheduler would
 * be in its way holds that scheduler off while it runs.  Everything else
 * goes straight on.
 */
static void
pgq_process_utility(PlannedStmt *pstmt, const char *queryString,
					bool readOnlyTree, ProcessUtilityContext context,
					ParamListInfo params, QueryEnvironment *queryEnv,
					DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;
	const char *dbname = NULL;
	const char *what = NULL;
	int			dbindexes[PGQ_MAX_DATABASES];
	pid_t		pids[PGQ_MAX_DATABASES];
	int			nheld = 0;
	const char *group_index_of = NULL;

	switch (nodeTag(parsetree))
	{
		case T_CopyStmt:
		case T_CreateStmt:
		case T_IndexStmt:
		case T_AlterTableStmt:
			if (context == PROCESS_UTILITY_TOPLEVEL && pgq_loads_tables(parsetree))
			{
				pgq_restore_begins();
				if (IsA(parsetree, AlterTableStmt))
					pgq_restore_slot_columns((AlterTableStmt *) parsetree);
				if (IsA(parsetree, IndexStmt) &&
					pgq_restore_failed_index((IndexStmt *) parsetree))
				{
					/* the same statement on (queue, id): a copy, changed */
					IndexElem  *id = makeNode(IndexElem);

					pstmt = copyObject(pstmt);
					readOnlyTree = false;
					parsetree = pstmt->utilityStmt;
					id->name = pstrdup("id");
					id->ordering = SORTBY_DEFAULT;
					id->nulls_ordering = SORTBY_NULLS_DEFAULT;
					((IndexStmt *) parsetree)->indexParams =
						lappend(((IndexStmt *) parsetree)->indexParams, id);
					/* and 1.2's group_idx, which the dump has not */
					group_index_of = ((IndexStmt *) parsetree)->relation->relname;
				}
			}
			break;
		case T_CreatedbStmt:
		case T_DropdbStmt:
		case T_RenameStmt:
		case T_AlterDatabaseStmt:
			dbname = pgq_database_command(parsetree, &what);
			if (dbname != NULL && !pgq_is_pgqueue_process)
				nheld = pgq_hold_schedulers(parsetree, dbname, dbindexes, pids);
			break;
		default:
			break;
	}

	if (nheld == 0)
	{
		pgq_next_utility(pstmt, queryString, readOnlyTree, context,
						 params, queryEnv, dest, qc);
		if (group_index_of != NULL)
			pgq_restore_group_index(group_index_of);
		return;
	}
	PG_TRY();
	{
		int			i;

		for (i = 0; i < nheld; i++)
			pgq_stop_scheduler(dbname, dbindexes[i], pids[i], what);
		pgq_next_utility(pstmt, queryString, readOnlyTree, context,
						 params, queryEnv, dest, qc);
	}
	PG_FINALLY();
	{
		pgq_hold_release();
	}
	PG_END_TRY();
}

/* Run the statement: the hook before ours, or the standard processing. */
static void
pgq_next_utility(PlannedStmt *pstmt, const char *queryString,
				 bool readOnlyTree, ProcessUtilityContext context,
				 ParamListInfo params, QueryEnvironment *queryEnv,
				 DestReceiver *dest, QueryCompletion *qc)
{
	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree, context,
							params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/* ----------------------------------------------------------------
 * Restores
 * ----------------------------------------------------------------
 */

/* Whether rel is named as a relation of schema pgqueue. */
static bool
pgq_in_schema(const RangeVar *rel)
{
	return rel != NULL && rel->schemaname != NULL &&
		strcmp(rel->schemaname, "pgqueue") == 0;
}

/*
 * Whether parsetree (a COPY, CREATE TABLE, CREATE INDEX or ALTER TABLE,
 * sent at top level) loads or builds pgqueue's tables, as a restore does,
 * in a session of a user: not a pgqueue process, not an extension's script
 * (CREATE EXTENSION, ALTER EXTENSION UPDATE), not pgqueue's own DDL.  Looks
 * at the parse tree only.
 */
static bool
pgq_loads_tables(Node *parsetree)
{
	if (pgq_is_pgqueue_process || creating_extension || pgq_in_own_ddl())
		return false;
	switch (nodeTag(parsetree))
	{
		case T_CopyStmt:
			return ((CopyStmt *) parsetree)->is_from &&
				pgq_in_schema(((CopyStmt *) parsetree)->relation);
		case T_CreateStmt:
			return pgq_in_schema(((CreateStmt *) parsetree)->relation);
		case T_IndexStmt:
			return pgq_in_schema(((IndexStmt *) parsetree)->relation);
		case T_AlterTableStmt:
			{
				AlterTableStmt *stmt = (AlterTableStmt *) parsetree;
				ListCell   *lc;

				if (!pgq_in_schema(stmt->relation))
					return false;
				foreach(lc, stmt->cmds)
				{
					AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

					if (cmd->subtype == AT_AttachPartition ||
						cmd->subtype == AT_AddConstraint ||
						cmd->subtype == AT_AddIndex ||
						cmd->subtype == AT_AddIndexConstraint)
						return true;
				}
				return false;
			}
		default:
			return false;
	}
}

/*
 * A statement of this session loads pgqueue's tables: when its database
 * has a scheduler (is named in pgqueue.database) and the session's role
 * is a superuser, list the session as restoring (shmem.c), and say once
 * per session what that means.  The caller is inside a transaction.
 */
static void
pgq_restore_begins(void)
{
	static bool logged = false;

	if (my_db_scheduled < 0)
	{
		char	   *name = get_database_name(MyDatabaseId);
		ListCell   *lc;
		int			i = 0;

		my_db_scheduled = 0;
		foreach(lc, pgq_database_list())
		{
			if (i++ < PGQ_MAX_DATABASES && name != NULL &&
				strcmp((char *) lfirst(lc), name) == 0)
				my_db_scheduled = 1;
		}
	}
	if (my_db_scheduled == 0)
		return;

	/*
	 * Only a superuser restores pgqueue (CREATE EXTENSION pgqueue needs
	 * one, and its tables belong to it): another role that sends such a
	 * statement is refused by it, and must not pause the scheduler.
	 */
	if (!superuser())
		return;
	if (pgq_restore_note() && !logged)
	{
		logged = true;
		ereport(LOG,
				(errmsg("pgqueue: the scheduler of database \"%s\" pauses while this session loads pgqueue's tables (a restore)",
						get_database_name(MyDatabaseId)),
				 errdetail("It schedules nothing and leaves the slots and the archive alone until %d s after this session's last such statement, or its end.",
						   PGQ_RESTORE_GRACE_SECS)));
	}
}

/*
 * Columns that an update after 1.1 added to pgqueue.queue and
 * pgqueue.work_queue, all nullable without a default (pgqueue--1.1--1.2.sql).
 */
static const char *const pgq_later_columns[] = {"max_tries", "waiting_for", "has_children",
	"group_key"};

/*
 * A dump of an older version restored into this one: the dump's slots (and
 * only they: the extension's own tables are made by CREATE EXTENSION at
 * the new version) lack the columns the updates since added to their
 * parent, and their ATTACH PARTITION would fail ("table is missing column
 * max_tries").  Before such an ATTACH into pgqueue.queue or
 * pgqueue.work_queue (stmt, sent by a restore: pgq_loads_tables), each
 * missing column of pgq_later_columns that the parent has is added to the
 * slot, NULL in every restored row, as the update gives the rows of a
 * live database.  Only a superuser restores pgqueue (pgq_restore_begins).
 */
static void
pgq_restore_slot_columns(AlterTableStmt *stmt)
{
	ListCell   *lc;

	if (stmt->objtype != OBJECT_TABLE || !superuser() ||
		(strcmp(stmt->relation->relname, "queue") != 0 &&
		 strcmp(stmt->relation->relname, "work_queue") != 0))
		return;
	foreach(lc, stmt->cmds)
	{
		AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);
		PartitionCmd *pc;
		Oid			parent;
		Oid			slot;
		int			i;

		if (cmd->subtype != AT_AttachPartition)
			continue;
		pc = (PartitionCmd *) cmd->def;
		if (!pgq_in_schema(pc->name))
			continue;
		parent = RangeVarGetRelid(stmt->relation, NoLock, true);
		slot = RangeVarGetRelid(pc->name, NoLock, true);
		if (!OidIsValid(parent) || !OidIsValid(slot))
			continue;
		for (i = 0; i < lengthof(pgq_later_columns); i++)
		{
			const char *col = pgq_later_columns[i];
			AttrNumber	pattnum = get_attnum(parent, col);
			Oid			typid;
			int32		typmod;
			Oid			collid;
			int			nest;

			if (pattnum == InvalidAttrNumber ||
				get_attnum(slot, col) != InvalidAttrNumber)
				continue;
			get_atttypetypmodcoll(parent, pattnum, &typid, &typmod, &collid);
			nest = pgq_spi_connect();
			if (pgq_spi_ddl(psprintf("ALTER TABLE pgqueue.%s ADD COLUMN %s %s",
									 quote_identifier(pc->name->relname),
									 quote_identifier(col),
									 format_type_with_typemod(typid, typmod))) != SPI_OK_UTILITY)
				elog(ERROR, "could not add column %s to pgqueue.%s", col, pc->name->relname);
			pgq_spi_finish(nest);
			ereport(LOG,
					(errmsg("pgqueue: column \"%s\" added to the restored slot \"pgqueue.%s\" before it is attached",
							col, pc->name->relname),
					 errdetail("The dump comes from an older version of pgqueue; the column is NULL in its rows, as an update leaves them.")));
		}
	}
}

/*
 * A dump of 1.1 restored into 1.2 (as pgq_restore_slot_columns): whether
 * stmt is the dump's CREATE INDEX of a slot's failed jobs on (queue),
 * which 1.2 has on (queue, id) (pgqueue--1.1--1.2.sql, ring.c): the
 * caller then runs it with id added.  The slot is pgqueue.queue_N, the
 * index queue_N_failed_idx, and pgqueue.queue has 1.2's max_tries.
 */
static bool
pgq_restore_failed_index(IndexStmt *stmt)
{
	const char *rel = stmt->relation->relname;
	IndexElem  *only;
	Oid			parent;

	if (stmt->idxname == NULL || strncmp(rel, "queue_", 6) != 0 ||
		strspn(rel + 6, "0123456789") != strlen(rel + 6) || rel[6] == '\0' ||
		strcmp(stmt->idxname, psprintf("%s_failed_idx", rel)) != 0 ||
		list_length(stmt->indexParams) != 1)
		return false;
	only = linitial_node(IndexElem, stmt->indexParams);
	if (only->name == NULL || strcmp(only->name, "queue") != 0)
		return false;
	parent = get_relname_relid("queue", get_namespace_oid("pgqueue", true));
	if (!OidIsValid(parent) || get_attnum(parent, "max_tries") == InvalidAttrNumber)
		return false;
	ereport(LOG,
			(errmsg("pgqueue: index \"%s\" of the restored slot \"pgqueue.%s\" made on (queue, id)",
					stmt->idxname, rel),
			 errdetail("The dump comes from pgqueue 1.1, whose failed jobs' index is on (queue) alone.")));
	return true;
}

/*
 * After the failed jobs' index of a slot restored from a 1.1 dump
 * (pgq_restore_failed_index): the slot's group_idx, which 1.2 has in every
 * slot (pgqueue--1.1--1.2.sql, ring.c) and the dump has not.  Without it
 * the scheduler would not see the groups' jobs of the slot.
 */
static void
pgq_restore_group_index(const char *rel)
{
	Oid			nsp = get_namespace_oid("pgqueue", true);
	char	   *idx = psprintf("%s_group_idx", rel);
	Oid			parent;
	int			nest;

	if (!OidIsValid(nsp) || OidIsValid(get_relname_relid(idx, nsp)))
		return;
	parent = get_relname_relid("queue", nsp);
	if (!OidIsValid(parent) || get_attnum(parent, "group_key") == InvalidAttrNumber)
		return;
	nest = pgq_spi_connect();
	if (pgq_spi_ddl(pgq_group_index_ddl(rel)) != SPI_OK_UTILITY)
		elog(ERROR, "could not make index %s", idx);
	pgq_spi_finish(nest);
	ereport(LOG,
			(errmsg("pgqueue: index \"%s\" made for the restored slot \"pgqueue.%s\"", idx, rel),
			 errdetail("The dump comes from pgqueue 1.1, whose slots have no index of groups.")));
}

/* ----------------------------------------------------------------
 * Database commands
 * ----------------------------------------------------------------
 */

/*
 * The database that parsetree (CREATE DATABASE, DROP DATABASE, RENAME of
 * anything, ALTER DATABASE) needs no other session connected to, or NULL:
 * the template of CREATE DATABASE (template1 when not given), the database
 * of DROP DATABASE, ALTER DATABASE ... RENAME and ALTER DATABASE ... SET
 * TABLESPACE.  *what names the command, for the log.
 */
static const char *
pgq_database_command(Node *parsetree, const char **what)
{
	ListCell   *lc;

	switch (nodeTag(parsetree))
	{
		case T_CreatedbStmt:
			{
				const char *template = "template1";

				foreach(lc, ((CreatedbStmt *) parsetree)->options)
				{
					DefElem    *opt = lfirst_node(DefElem, lc);

					if (strcmp(opt->defname, "template") == 0 &&
						opt->arg != NULL && IsA(opt->arg, String))
						template = strVal(opt->arg);
				}
				*what = "CREATE DATABASE";
				return template;
			}
		case T_DropdbStmt:
			*what = "DROP DATABASE";
			return ((DropdbStmt *) parsetree)->dbname;
		case T_RenameStmt:
			if (((RenameStmt *) parsetree)->renameType != OBJECT_DATABASE)
				return NULL;
			*what = "ALTER DATABASE ... RENAME";
			return ((RenameStmt *) parsetree)->subname;
		case T_AlterDatabaseStmt:
			foreach(lc, ((AlterDatabaseStmt *) parsetree)->options)
			{
				if (strcmp(lfirst_node(DefElem, lc)->defname, "tablespace") == 0)
				{
					*what = "ALTER DATABASE ... SET TABLESPACE";
					return ((AlterDatabaseStmt *) parsetree)->dbname;
				}
			}
			return NULL;
		default:
			return NULL;
	}
}

/*
 * Whether parsetree may get as far as its check of other sessions on
 * database dbname, as far as it matters here: the database exists, is not
 * the current one (unless it is CREATE DATABASE's template), and the role
 * is a superuser, or for CREATE DATABASE has CREATEDB, or else owns the
 * database.  The command checks all that for itself; this only keeps a
 * command that would fail anyway from stopping a scheduler (any role could
 * otherwise stop one again and again).  The caller is inside a
 * transaction.
 */
static bool
pgq_may_run(Node *parsetree, const char *dbname)
{
	Oid			dboid = get_database_oid(dbname, true);
	bool		create = IsA(parsetree, CreatedbStmt);

	if (!OidIsValid(dboid) || (!create && dboid == MyDatabaseId))
		return false;
	if (superuser())
		return true;
	if (create)
	{
		HeapTuple	tup = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
		bool		createdb = false;

		if (HeapTupleIsValid(tup))
		{
			createdb = ((Form_pg_authid) GETSTRUCT(tup))->rolcreatedb;
			ReleaseSysCache(tup);
		}
		return createdb;
	}
	return pgq_database_ownercheck(dboid, GetUserId());
}

/*
 * Hold off the schedulers of database dbname (every entry of
 * pgqueue.database that names it) for a command of parsetree's kind; their
 * indexes in dbindexes[] and the pids they ran under (0: none) in pids[].
 * Returns how many were held: 0 when dbname has no scheduler or the role
 * may not run the command.  Raises no error once a hold is taken: the
 * caller releases them all (pgq_hold_release) whatever happens next.
 */
static int
pgq_hold_schedulers(Node *parsetree, const char *dbname, int *dbindexes, pid_t *pids)
{
	List	   *names = pgq_database_list();
	ListCell   *lc;
	bool		named = false;
	int			nheld = 0;
	int			i = 0;

	foreach(lc, names)
	{
		if (i < PGQ_MAX_DATABASES && strcmp((char *) lfirst(lc), dbname) == 0)
			named = true;
		i++;
	}
	if (!named || !pgq_may_run(parsetree, dbname))
		return 0;

	i = 0;
	foreach(lc, names)
	{
		if (i < PGQ_MAX_DATABASES && strcmp((char *) lfirst(lc), dbname) == 0 &&
			pgq_hold_take(i, &pids[nheld]))
			dbindexes[nheld++] = i;
		i++;
	}
	return nheld;
}

/*
 * Make sure the scheduler of database dbname (index dbindex, held off by
 * this backend; pid: the one that ran when the hold was taken, or 0) is
 * gone before what runs: SIGTERM, then wait, at most PGQ_HOLD_WAIT_MS,
 * until it has left the proc array.  Past that the command runs all the
 * same (and waits 5 s more itself).
 */
static void
pgq_stop_scheduler(const char *dbname, int dbindex, pid_t pid, const char *what)
{
	TimestampTz give_up;

	if (pid == 0)
		return;
	ereport(LOG,
			(errmsg("pgqueue: stopping the scheduler of database \"%s\" for %s",
					dbname, what),
			 errdetail("It starts again when the command has finished.")));
	if (kill(pid, SIGTERM) != 0 && errno != ESRCH)
		ereport(LOG,
				(errmsg("pgqueue: could not signal the scheduler of database \"%s\": %m",
						dbname)));
	give_up = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), PGQ_HOLD_WAIT_MS);
	while (pgq_scheduler_running(dbindex) == pid || BackendPidGetProc(pid) != NULL)
	{
		if (GetCurrentTimestamp() >= give_up)
		{
			ereport(LOG,
					(errmsg("pgqueue: the scheduler of database \"%s\" did not stop within %d ms",
							dbname, PGQ_HOLD_WAIT_MS)));
			return;
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}
