-- sys5 consumer: claim one job under a 30 s lease (transaction 1), then ack it
-- (transaction 2), as sys1's; both through functions that name the slot's
-- partition (see sys5_schema.sql).  An empty poll does nothing more.
SELECT count(*) AS n, coalesce(max(slot), 0) AS slot, coalesce(max(id), 0) AS job_id
  FROM claim('30 seconds') \gset
\if :n > 0
SELECT ack(:slot, :job_id);
\endif
