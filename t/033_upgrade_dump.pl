# pg_dump --schema-only of a database updated from 1.0 against a fresh
# install's, both at the default version (1.2 since 1.2 began: the bare
# ALTER EXTENSION pgqueue UPDATE goes 1.0 -> 1.1 -> 1.2 in one statement;
# t/035_upgrade_12.pl compares a 1.1 updated to 1.2 as well).
#
# t/006 checks the update of a live database and compares the catalogs it
# leaves with a fresh install's, query by query.  This compares what pg_dump
# writes of the two databases, so that nothing the queries do not look at
# (a default, a comment, a privilege, a trigger, a view's text, an
# extension-member mark) can differ unseen:
#
# - plain pg_dump --schema-only, what a user's dump holds of the extension;
# - pg_dump --schema-only --binary-upgrade, which writes every member of the
#   extension out in full (as pg_upgrade needs them), table by table,
#   function by function.
#
# The dumps are normalised, and only so: the comment lines and blank lines
# go; the \restrict and \unrestrict lines (17.6, 18: a random key per dump)
# go; the entries (the pieces pg_dump heads with a "-- Name: ...; Type: ..."
# comment) are sorted by that head, as pg_dump orders objects that share a
# type and name by their OIDs; what --binary-upgrade writes of the
# cluster's own history is masked: the identifiers it preserves for each
# object (binary_upgrade_set_next_*: OIDs, relfilenodes, and where the
# server has it, its columns' WAL positions), relfrozenxid and relminmxid
# (a TOAST table's by OID), and the configuration tables by OID with their
# conditions in that order (compared by name above).  One
# difference is accepted and checked for what it is: the columns the update
# added with a default to tables that already existed (queue_0.slot,
# work_queue_0.slot, work_queue_0.tries, queues.retention) carry a "missing
# value" (pg_attribute.attmissingval: the value rows written before the
# ALTER TABLE read), which --binary-upgrade restores with
# binary_upgrade_set_missing_value; a fresh install's tables never had rows
# without those columns.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# no scheduler in the databases compared: nothing is made at run time
# (slots, archive partitions) but what the test does
my $node = pgq_node('upgrade_dump', "pgqueue.enabled = off\n");
$node->start;

# --- a 1.0 database with jobs in several states, updated live ----------------
$node->safe_psql('postgres', 'CREATE DATABASE updated');
$node->safe_psql('updated', "CREATE EXTENSION pgqueue VERSION '1.0'");
$node->safe_psql('updated', q{
SELECT pgq_configure('capped', max_in_flight => 1);
SELECT pgq_configure('dead', max_tries => 1);
SELECT pgq_push('q', jsonb_build_object('n', g)) FROM generate_series(1, 4) g;
SELECT pgq_push('q', '{"n": "later"}', run_after => now() + interval '1 day');
SELECT pgq_push('q', '{"n": "once"}', dedup_key => 'once');
SELECT pgq_push('capped', jsonb_build_object('n', g)) FROM generate_series(1, 2) g;
SELECT pgq_push('dead', '{"n": "dead"}');
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w1', 2, '1 hour', ARRAY['q']);
SELECT pgq_ack(id, 'w2') FROM pgq_claim('w2', 1, '1 hour', ARRAY['q']);
SELECT pgq_nack(id, 'w3', 'try again', '1 hour') FROM pgq_claim('w3', 1, '1 hour', ARRAY['q']);
SELECT pgq_nack(id, 'w4', 'no more') FROM pgq_claim('w4', 1, '1 hour', ARRAY['dead']);
});
my $jobs_sql = q{
SELECT string_agg(format('%s|%s|%s|%s|%s', id, state, payload, tries, coalesce(lock_key, '-')),
                  E'\n' ORDER BY id)
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)};
# 1.0 keeps tries in queue only; 1.1 keeps an in-flight job's in work_queue
my $before = $node->safe_psql('updated', $jobs_sql =~ s/tries/q.tries/r);
is( $node->safe_psql('updated',
		'SELECT string_agg(state::text, \',\' ORDER BY state::text) FROM pgqueue.queue'),
	'failed,pending,pending,retry,scheduled,scheduled,scheduled,scheduled',
	'1.0: jobs pending, delayed, scheduled, in flight, retrying and failed');

$node->safe_psql('updated', 'ALTER EXTENSION pgqueue UPDATE');
is($node->safe_psql('updated', "SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'"),
	'1.2', 'updated to 1.2 (1.0 -> 1.1 -> 1.2 in one ALTER EXTENSION pgqueue UPDATE)');
is($node->safe_psql('updated', $jobs_sql =~ s/tries/coalesce(w.tries, q.tries)/r),
	$before, 'every job kept its state, payload, tries and holder');

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION pgqueue');

# the configuration tables pg_dump dumps the rows of, by name (the
# --binary-upgrade dump lists them by OID, masked below)
my $extconfig = q{
SELECT string_agg(format('%s %s', c::regclass, coalesce(w, '')), ', ' ORDER BY c::regclass::text)
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS x(c, w)
 WHERE e.extname = 'pgqueue'};
is($node->safe_psql('updated', $extconfig), $node->safe_psql('fresh', $extconfig),
	'the same configuration tables, with the same conditions');

# --- the dumps -----------------------------------------------------------------
my ($plain_updated) = schema_normalise(schema_dump($node, 'updated'));
my ($plain_fresh) = schema_normalise(schema_dump($node, 'fresh'));
like($plain_fresh, qr/^CREATE EXTENSION IF NOT EXISTS pgqueue WITH SCHEMA public;$/m,
	'the plain dump of a fresh install creates the extension');
same_schema('plain', $plain_updated, $plain_fresh,
	'pg_dump --schema-only: the updated database dumps as a fresh install does');

my ($full_updated, $missing_updated) = schema_normalise(schema_dump($node, 'updated', '--binary-upgrade'));
my ($full_fresh, $missing_fresh) = schema_normalise(schema_dump($node, 'fresh', '--binary-upgrade'));
like($full_fresh, qr/^CREATE TABLE pgqueue\.queue_0 /m,
	'the --binary-upgrade dump writes out the members of the extension');
same_schema('binary_upgrade', $full_updated, $full_fresh,
	'pg_dump --schema-only --binary-upgrade: every member of the extension is the same');

# the one accepted difference: missing values of the columns the update added
is($missing_fresh, '', 'a fresh install has no missing values');
my $added = join ',', map { s/=.*//r } split /,/, $missing_updated;
is($added,
	'pgqueue.queue_0.slot,pgqueue.queues.retention,pgqueue.work_queue_0.slot,pgqueue.work_queue_0.tries',
	'the updated database has missing values for the columns the update added, and only them')
  or diag("missing values: $missing_updated");
note("missing values of the updated database: $missing_updated");

$node->stop;
done_testing();
