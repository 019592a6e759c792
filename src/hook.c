/*-------------------------------------------------------------------------
 *
 * hook.c
 *		pgqueue's ProcessUtility hook, installed only when the library is
 *		preloaded (only then are there schedulers).  It looks at the
 *		statements that build or load tables; every other one costs a
 *		switch on its node tag.
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
 * So such a statement, sent at top level by a session that is not a
 * pgqueue process (as pg_restore and psql send them; not one run by a
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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"

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

/* Install the hook, chaining to the one before; from _PG_init, preloading. */
void
pgq_hook_install(void)
{
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = pgq_process_utility;
}

/*
 * The hook.  A statement that loads pgqueue's tables lists this session as
 * restoring before it runs.  Everything else goes straight on.
 */
static void
pgq_process_utility(PlannedStmt *pstmt, const char *queryString,
					bool readOnlyTree, ProcessUtilityContext context,
					ParamListInfo params, QueryEnvironment *queryEnv,
					DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;

	switch (nodeTag(parsetree))
	{
		case T_CopyStmt:
		case T_CreateStmt:
		case T_IndexStmt:
		case T_AlterTableStmt:
			if (context == PROCESS_UTILITY_TOPLEVEL && pgq_loads_tables(parsetree))
				pgq_restore_begins();
			break;
		default:
			break;
	}
	pgq_next_utility(pstmt, queryString, readOnlyTree, context,
					 params, queryEnv, dest, qc);
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
 * has a scheduler (is named in pgqueue.database), list the session as
 * restoring (shmem.c), and say once per session what that means.  The
 * caller is inside a transaction.
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
