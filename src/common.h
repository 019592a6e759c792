/*-------------------------------------------------------------------------
 *
 * common.h
 *		The bottom layer of pgqueue (src/README): the helpers of every
 *		layer (common.c), the limits on user input, and the calls that
 *		differ between PostgreSQL majors (pgq_compat.h).
 *
 * Every other header of pgqueue includes this one, through the header of
 * the layer below its own.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_COMMON_H
#define PGQUEUE_COMMON_H

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"

#include "pgq_compat.h"

/* Limits on user input; documented in docs/sql-reference.md ("Limits and errors"). */
#define PGQ_MAX_NAME_BYTES		128		/* queue names */
#define PGQ_MAX_KEY_BYTES		256		/* lock_key, dedup_key */
#define PGQ_MAX_GROUP_BYTES		256		/* group_key (1.2) */
#define PGQ_MAX_ITEMS			10000	/* max_items of claim/schedule */
#define PGQ_MAX_QUEUES_FILTER	100		/* elements of pgq_claim(queues) */
#define PGQ_MAX_BATCH			10000	/* payloads of pgq_push_batch */
#define PGQ_MAX_LEASE_USECS		(INT64CONST(7) * USECS_PER_DAY)
#define PGQ_MAX_WAIT_USECS		(INT64CONST(60) * USECS_PER_SEC)
#define PGQ_MAX_RETRY_USECS		(INT64CONST(365) * USECS_PER_DAY)
#define PGQ_MAX_RETENTION_USECS	(INT64CONST(365) * USECS_PER_DAY)	/* pgq_configure */
#define PGQ_MAX_PERIOD_USECS	(INT64CONST(365) * USECS_PER_DAY)	/* pgq_push_periodic */
#define PGQ_MAX_DATABASES		32		/* entries of pgqueue.database */

/* common.c */

/* pgqueue.enabled; _PG_init (pgqueue.c) defines the GUC over it */
extern bool pgqueue_enabled;

/* A statement that pgq_subxact runs (pgq_execute_moving, admin.c). */
typedef struct PgqStatement
{
	SPIPlanPtr	plan;
	Datum	   *args;
	const char *nulls;
	int			rc;				/* SPI result code */
	bool		latest;			/* run with the latest snapshot ... */
	bool		crosscheck;		/* ... checked, under REPEATABLE READ, against
								 * the transaction's */
} PgqStatement;

extern int	pgq_spi_ddl(const char *sql);
extern bool pgq_in_own_ddl(void);
extern SPIPlanPtr pgq_keep_plan(SPIPlanPtr *cache, const char *sql,
								int nargs, Oid *argtypes);
extern int	pgq_spi_connect(void);
extern void pgq_spi_finish(int nest);
extern ErrorData *pgq_subxact(void (*fn) (void *), void *arg, int catch_code);
extern void pgq_upkeep_try(void (*fn) (void *), void *arg, const char *what,
						   const char *hint);
extern int	pgq_execute_moving(SPIPlanPtr plan, Datum *args, const char *nulls);
extern int	pgq_execute_moving_latest(SPIPlanPtr plan, Datum *args, const char *nulls,
									  bool crosscheck);
extern int64 pgq_interval_usecs(Datum interval);
extern TimestampTz pgq_deadline(TimestampTz from, Datum interval);
extern void pgq_require(FunctionCallInfo fcinfo, int argno, const char *argname);
extern text *pgq_checked_text_arg(FunctionCallInfo fcinfo, int argno,
								  const char *argname, int maxbytes);
extern char *pgq_text_arg(FunctionCallInfo fcinfo, int argno,
						  const char *argname, int maxbytes);
extern int64 pgq_length_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
							int64 min_usecs, int64 max_usecs, const char *range_text,
							const char *example);
extern int64 pgq_interval_arg(FunctionCallInfo fcinfo, int argno,
							  const char *argname, int64 min_usecs,
							  int64 max_usecs, const char *max_text);
extern int	pgq_max_items_arg(FunctionCallInfo fcinfo, int argno);
extern bool pgq_try_queue_lock(uint32 space, int32 hash);

#endif							/* PGQUEUE_COMMON_H */
