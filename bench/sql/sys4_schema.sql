-- sys4: pgqueue through its SQL API.  The extension's background worker
-- (shared_preload_libraries = 'pgqueue', pgqueue.database = 'bench') runs
-- the scheduling passes.  Its functions land in the schema the extension
-- is created in (public); its tables are pgqueue.queue / pgqueue.work_queue.
-- Run with search_path = sys4, <extension schema>.
CREATE EXTENSION IF NOT EXISTS pgqueue;
CREATE SCHEMA IF NOT EXISTS sys4;
