/*-------------------------------------------------------------------------
 *
 * api.h
 *		The layer of SQL entry points (src/README): the job API (api.c)
 *		and the operator API (admin.c).  What one of them uses of the
 *		other, and the setting api.c reads.
 *
 * Includes the layer below, jobs.h, and through it the others.  Each SQL
 * function is declared by its PG_FUNCTION_INFO_V1; only those called from
 * C as well are here.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_API_H
#define PGQUEUE_API_H

#include "jobs.h"

/* api.c */
extern int	pgqueue_max_payload_kb;
extern Datum pgq_push(PG_FUNCTION_ARGS);

#endif							/* PGQUEUE_API_H */
