# The archive's upkeep by the background scheduler: once a minute (and at
# the first pass of a scheduler) it makes the partitions the retentions in
# use need and drops those whose days have passed, also while workers ack
# into the archive; a lock it cannot get in time, or an error, leaves the
# scheduling passes going and the work to a later run.
#
# Each check restarts the scheduler (pg_terminate_backend; the launcher
# starts it again within a second) so that it runs the upkeep at once
# (after its first pass) rather than within the minute.  Expired
# partitions are retired, then dropped (t/020_archive_retire.pl).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = pgq_node('upkeep', "pgqueue.naptime = '50ms'\n");
$node->start;
wait_for_scheduler($node, 'postgres');
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');

sub exists_rel
{
	my ($name) = @_;
	return $node->safe_psql('postgres', "SELECT to_regclass('pgqueue.$name') IS NOT NULL");
}

# does a partition take rows expiring at now() + $iv?
sub covered
{
	my ($iv) = @_;
	return $node->safe_psql('postgres', qq{
SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'pgqueue.archive'::regclass
                  AND c.relname = 'archive_' || to_char((now() + interval '$iv') AT TIME ZONE 'UTC', 'YYYYMMDD'))});
}

# wait until the scheduler has moved every due job of queue $queue
sub wait_scheduled
{
	my ($queue) = @_;
	return $node->poll_query_until('postgres', qq{
SELECT count(*) = 0 FROM pgqueue.queue
 WHERE queue = '$queue' AND state IN ('pending', 'retry') AND run_after <= now()});
}

# --- drops expired partitions, keeps the rest --------------------------------
$node->safe_psql('postgres', q{SELECT pgq_configure('a', retention => '1 day')});
$node->safe_psql('postgres',
	q{SELECT pgq_push('a', jsonb_build_object('n', g)) FROM generate_series(1, 5) g});
ok(wait_scheduled('a'), 'jobs scheduled');
is( $node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE pgq_ack(id, 'w1')) FROM pgq_claim('w1', 10, '1 hour')}),
	'5', 'and acked');
expired_partition($node, 'archive_20200101', '2020-01-01');
expired_partition($node, 'archive_20200102', '2020-01-02');
# a retention set behind pgq_configure's back: no partitions made for it
$node->safe_psql('postgres', q{
INSERT INTO pgqueue.queues (queue, retention) VALUES ('b', '5 days')});
is(covered('5 days'), 'f', 'no partition yet for a retention of 5 days');

restart_scheduler($node);
ok( $node->poll_query_until('postgres', q{
SELECT to_regclass('pgqueue.archive_20200101') IS NULL AND to_regclass('pgqueue.archive_20200102') IS NULL}),
	'the scheduler drops the expired partitions');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pgqueue.archive WHERE queue = 'a'}),
	'5', 'the rows that have not expired stay');
is(covered('5 days'), 't', 'and makes the partitions of the new retention');
is(covered('6 days'), 't', 'a day ahead');

# --- while workers ack into the archive --------------------------------------
# 500 rounds of push, claim, ack in short transactions, several seconds
my $load = $node->background_psql('postgres');
$load->query_until(qr/loading/, q{
\echo loading
DO $$
DECLARE
    i int;
    j uuid;
BEGIN
    PERFORM pgq_configure('load', retention => '1 day');
    COMMIT;
    FOR i IN 1 .. 500 LOOP
        PERFORM pgq_push('load', jsonb_build_object('i', i));
        COMMIT;
        FOR j IN SELECT id FROM pgq_claim('loader', 10, '1 minute') LOOP
            PERFORM pgq_ack(j, 'loader');
        END LOOP;
        COMMIT;
        PERFORM pg_sleep(0.01);
    END LOOP;
END
$$;
\echo loaded
});
ok( $node->poll_query_until('postgres',
		q{SELECT count(*) > 20 FROM pgqueue.archive WHERE queue = 'load'}),
	'the load acks into the archive');
expired_partition($node, 'archive_20200103', '2020-01-03');
restart_scheduler($node);
ok( $node->poll_query_until('postgres',
		q{SELECT to_regclass('pgqueue.archive_20200103') IS NULL}),
	'an expired partition is dropped while the acks go on');
is($node->safe_psql('postgres', q{SELECT count(*) < 500 FROM pgqueue.archive WHERE queue = 'load'}),
	't', '(the load was still running)');
$load->query_until(qr/loaded/, '');
$load->quit;
ok(wait_scheduled('load'), 'the load is done');
$node->safe_psql('postgres', q{
SELECT pgq_ack(id, 'loader') FROM pgq_claim('loader', 500, '1 minute')});
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM pgqueue.archive WHERE queue = 'load'}),
	'500', 'every job of the load was acked and archived');

# --- a lock it cannot get in time --------------------------------------------
# an ack in an open transaction holds the archive (ROW EXCLUSIVE)
expired_partition($node, 'archive_20200104', '2020-01-04');
$node->safe_psql('postgres', q{SELECT pgq_push('a', '{"n": "slow"}')});
ok(wait_scheduled('a'), 'a job to ack slowly');
my $slow = $node->background_psql('postgres');
$slow->query_safe('BEGIN');
is($slow->query_safe(q{SELECT pgq_ack(id, 'w2') FROM pgq_claim('w2', 1, '1 hour')}),
	't', 'acked in a transaction left open');
restart_scheduler($node);
$node->safe_psql('postgres', q{SELECT pgq_push('a', '{"n": "meanwhile"}')});
ok(wait_scheduled('a'), 'the passes go on while the drop cannot get its lock');
is(exists_rel('archive_20200104'), 't', 'the expired partition is still there');
$slow->query_safe('COMMIT');
$slow->quit;
restart_scheduler($node);
ok( $node->poll_query_until('postgres',
		q{SELECT to_regclass('pgqueue.archive_20200104') IS NULL}),
	'and goes at a later run, once the lock is free');

# --- an error in the upkeep --------------------------------------------------
# a table of the user's in the way of a partition the upkeep must make
my $in_the_way = $node->safe_psql('postgres', q{
SELECT 'archive_' || to_char((now() + interval '30 days') AT TIME ZONE 'UTC', 'YYYYMMDD')});
$node->safe_psql('postgres', qq{
DO \$\$ BEGIN CREATE TABLE pgqueue.$in_the_way (x int); END \$\$;
INSERT INTO pgqueue.queues (queue, retention) VALUES ('c', '30 days');
});
my $log_offset = -s $node->logfile;
restart_scheduler($node);
$node->safe_psql('postgres', q{SELECT pgq_push('a', '{"n": "despite"}')});
ok(wait_scheduled('a'), 'the passes go on when the upkeep fails');
my $logged = 0;
for (1 .. 100)
{
	$logged = log_count($node,
		qr/WARNING:  could not make archive partitions: relation "$in_the_way" already exists/,
		$log_offset);
	last if $logged;
	usleep(100_000);
}
ok($logged, 'the failure is logged');
$node->safe_psql('postgres', "DROP TABLE pgqueue.$in_the_way");
restart_scheduler($node);
ok( $node->poll_query_until('postgres', qq{
SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = 'pgqueue.archive'::regclass
                                          AND inhrelid = to_regclass('pgqueue.$in_the_way'))}),
	'once the table is gone the partition is made');
is(log_count($node, qr/background worker "pgqueue scheduler" \(PID \d+\) was terminated by signal/, 0),
	0, 'the scheduler never crashed');

$node->stop;
done_testing();
