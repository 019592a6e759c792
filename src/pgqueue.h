/*-------------------------------------------------------------------------
 *
 * pgqueue.h
 *		The top of pgqueue (src/README): the scheduler's processes and
 *		the utility hook (worker.c, launcher.c, hook.c), and what _PG_init
 *		(pgqueue.c) registers of them.
 *
 * Includes the layer below, api.h, and through it every other header.
 * Which file is in which layer, and which files each may call: src/README.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGQUEUE_H
#define PGQUEUE_H

#include "nodes/pg_list.h"

#include "api.h"

/*
 * How long a CREATE, ALTER or DROP DATABASE waits, at most, for the
 * scheduler it holds off to be gone before it runs (hook.c); the command
 * then waits up to 5 s more for other sessions itself.
 */
#define PGQ_HOLD_WAIT_MS		10000

/* GUCs of the processes; _PG_init (pgqueue.c) defines them */
extern char *pgqueue_database;	/* launcher.c */
extern int	pgqueue_naptime;	/* worker.c */
extern int	pgqueue_batch_size; /* worker.c */

/* launcher.c */
PGDLLEXPORT void pgq_launcher_main(Datum main_arg);
extern List *pgq_database_list(void);

/* hook.c */
extern bool pgq_is_pgqueue_process;
extern void pgq_hook_install(void);

#endif							/* PGQUEUE_H */
