# The removal of expired archive partitions:
# the scheduler retires them (DETACH, then a member of the extension, which
# pg_dump neither dumps nor locks) in a transaction of its own, without
# waiting for a session that uses one, and drops a retired table once no
# snapshot taken before its retirement is left (src/retire.c).
#
# - (10) a session holding a lock on an expired partition does not stall
#   the scheduler: jobs are scheduled and acks on a queue with a retention
#   complete while it holds it; the partition goes after it ends;
# - (11) pg_dump never fails across the removal: a REPEATABLE READ session
#   that read the partitions from pg_class LOCKs each by name after the
#   upkeep ran (pg_dump's window), a real pg_dump held in that window, and
#   pg_dump in a loop while partitions are retired and dropped; a retired
#   table stays until the snapshots from before its retirement are gone,
#   and is dropped then;
# - (12) a user's pgq_schedule() in an open transaction does not make acks
#   on a queue with a retention wait: with a scheduler running it runs no
#   upkeep of the archive.
#
# The upkeep runs once a minute; a restart of the scheduler makes it run
# at once (after the new scheduler's first pass).  A defect shows as a
# check that fails within seconds, not as a hang: every wait is bounded.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

my $node = pgq_node('retire', "pgqueue.naptime = '50ms'\n");
$node->start;
wait_for_scheduler($node, 'postgres');
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
$node->safe_psql('postgres', q{SELECT pgq_configure('r', retention => '1 day')});
# a table pg_dump locks before the partitions made below (it locks by OID)
$node->safe_psql('postgres', 'CREATE TABLE public.blocker (x int)');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# whether $sql returns true within $secs seconds
sub within
{
	my ($secs, $sql) = @_;
	my $until = time() + $secs;
	while (time() < $until)
	{
		return 1 if q1($sql) eq 't';
		usleep(100_000);
	}
	return 0;
}

# SQL: partition $name is attached to pgqueue.archive
sub attached_sql
{
	my ($name) = @_;
	return qq{SELECT EXISTS (SELECT 1 FROM pg_inherits
                WHERE inhparent = 'pgqueue.archive'::regclass
                  AND inhrelid = to_regclass('pgqueue.$name'))};
}

# SQL: table $name is retired (detached, a member of extension pgqueue)
sub retired_sql
{
	my ($name) = @_;
	return qq{SELECT EXISTS (
SELECT 1 FROM pg_class c
  JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pgqueue'
 WHERE c.oid = to_regclass('pgqueue.$name') AND NOT c.relispartition)};
}

sub gone_sql { return "SELECT to_regclass('pgqueue.$_[0]') IS NULL"; }

# Terminate the scheduler and wait for the new one (not for its passes:
# a scheduler stalled by its upkeep would make no pass); its upkeep runs
# after its first pass.
sub kick_scheduler
{
	my $old = scheduler_pid($node, 'postgres');
	q1("SELECT pg_terminate_backend($old)");
	wait_for_scheduler($node, 'postgres', $old);
}

# A job pushed now into queue $queue ('p', no retention, by default), or
# undef when not scheduled within $secs.
sub scheduled_within
{
	my ($secs, $queue) = @_;
	$queue //= 'p';
	my $id = q1(qq{SELECT pgq_push('$queue', '{}')});
	return within($secs, qq{
SELECT EXISTS (SELECT 1 FROM pgqueue.work_queue WHERE id = '$id')}) ? $id : undef;
}

# A job of queue r (which keeps an archive), scheduled and claimed by $key.
sub claimed_job
{
	my ($key) = @_;
	my $id = scheduled_within(30, 'r') or die 'a job is not scheduled';
	is(q1("SELECT string_agg(id::text, ',') FROM pgq_claim('$key', 10, '1 hour', ARRAY['r'])"),
		$id, "a job of queue r claimed by $key");
	return $id;
}

# Whether the ack of job $id by $key answers true within $secs seconds.
sub ack_within
{
	my ($id, $key, $secs) = @_;
	my ($rc, $out, $err) = $node->psql('postgres',
		"SET statement_timeout = '${secs}s'; SELECT pgq_ack('$id', '$key')");
	note "ack: $err" if $err ne '';
	return $rc == 0 && $out eq 't';
}

my $log_offset = -s $node->logfile;

# --- (10) a session holding a lock on an expired partition -------------------
my $job = claimed_job('w1');
expired_partition($node, 'archive_20200101', '2020-01-01');
expired_partition($node, 'archive_20200102', '2020-01-02');
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN');
is($reader->query_safe('SELECT count(*) FROM pgqueue.archive_20200102'),
	'1', 'a session reads an expired partition in an open transaction');
kick_scheduler();
ok(within(10, gone_sql('archive_20200101')),
	'(10) the expired partition nobody uses is removed');
ok(defined scheduled_within(5),
	'(10) jobs are scheduled while the session holds its lock');
ok(ack_within($job, 'w1', 5),
	'(10) an ack on a queue with a retention completes meanwhile');
ok(defined scheduled_within(5), '(10) and the passes go on');
is(q1(attached_sql('archive_20200102')), 't',
	'(10) the partition in use is left for a later run');
$reader->query_safe('COMMIT');
$reader->quit;
kick_scheduler();
ok(within(10, gone_sql('archive_20200102')), '(10) and goes once the session is done');

# --- (11) pg_dump's window: a snapshot from before, LOCKs by name after ------
expired_partition($node, 'archive_20200103', '2020-01-03');
my $old_snap = $node->background_psql('postgres', on_error_stop => 0);
$old_snap->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $listed = $old_snap->query_safe(q{
SELECT string_agg(format('%I.%I', n.nspname, c.relname), ',' ORDER BY c.relname)
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE i.inhparent = 'pgqueue.archive'::regclass AND c.relname < 'archive_2021'});
is($listed, 'pgqueue.archive_20200103', '(11) a snapshot lists the expired partition');
kick_scheduler();
ok(within(10, retired_sql('archive_20200103')),
	'(11) the upkeep retires it: detached, a member of the extension');
usleep(3_000_000);
is(q1(gone_sql('archive_20200103')), 'f',
	'(11) and does not drop it while a snapshot from before its retirement is open');
my ($locked, $failed) = $old_snap->query(
	join('; ', map { "LOCK TABLE $_ IN ACCESS SHARE MODE" } split(/,/, $listed))
	  . "; SELECT count(*) FROM pgqueue.archive_20200103");
is($old_snap->{stderr}, '', '(11) that snapshot LOCKs every table it listed, by name');
$old_snap->{stderr} = '';
is($locked, '1', '(11) and reads its rows');
my $dump_after = $PostgreSQL::Test::Utils::tmp_check . '/after.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump_after, '-d', 'postgres' ],
	'(11) pg_dump while the retired table waits for its drop');
my $toc = `pg_restore -l $dump_after`;
unlike($toc, qr/archive_20200103/, '(11) a dump taken after the retirement leaves it out');
like($toc, qr/TABLE DATA pgqueue archive_\d{8}/, '(11) and has the partitions in use');
$old_snap->query_safe('COMMIT');
$old_snap->quit;
ok(within(10, gone_sql('archive_20200103')),
	'(11) the retired table is dropped once that snapshot is gone');

# --- (11) a real pg_dump between its snapshot and its LOCKs ------------------
expired_partition($node, 'archive_20200104', '2020-01-04');
my $blocker = $node->background_psql('postgres');
$blocker->query_safe('BEGIN; LOCK TABLE public.blocker IN ACCESS EXCLUSIVE MODE');
my $dump_held = $PostgreSQL::Test::Utils::tmp_check . '/held.dump';
my ($dump_out, $dump_err) = ('', '');
my $dump = IPC::Run::start(
	[ 'pg_dump', '-Fc', '-f', $dump_held, '-d', $node->connstr('postgres') ],
	'>', \$dump_out, '2>', \$dump_err);
ok( $node->poll_query_until('postgres', q{
SELECT EXISTS (SELECT 1 FROM pg_locks
                WHERE relation = 'public.blocker'::regclass AND NOT granted)}),
	'(11) pg_dump waits for its LOCK of a table, its snapshot taken');
kick_scheduler();
ok(within(10, "SELECT NOT (" . attached_sql('archive_20200104') . ")"),
	'(11) meanwhile the upkeep removes the expired partition from the archive');
$blocker->query_safe('COMMIT');
$blocker->quit;
$dump->finish;
is($?, 0, '(11) pg_dump then succeeds');
is($dump_err, '', '(11) and says nothing');
like(`pg_restore -l $dump_held`, qr/TABLE DATA pgqueue archive_20200104/,
	'(11) it dumped the partition as its snapshot saw it');
ok(within(10, gone_sql('archive_20200104')),
	'(11) the retired table is dropped once that pg_dump is done');

# --- (11) pg_dump in a loop while partitions are retired and dropped ---------
my $stop = $PostgreSQL::Test::Utils::tmp_check . '/stop_dumps';
my $loop_dump = $PostgreSQL::Test::Utils::tmp_check . '/loop.dump';
my ($loop_out, $loop_err) = ('', '');
my $loop = IPC::Run::start(
	[
		'bash', '-c',
		'while [ ! -e "$1" ]; do
		   if pg_dump -Fc -f "$2" -d "$3"; then echo ok; else echo failed; fi
		   sleep 0.5
		 done', 'loop', $stop, $loop_dump, $node->connstr('postgres')
	],
	'>', \$loop_out, '2>', \$loop_err);
# A pg_dump holds ACCESS SHARE on every partition while it runs, and the
# upkeep leaves a partition in use for a later run: the scheduler is
# restarted until it found them free.
my $rounds = 6;
my $archive_202002 = q{
SELECT count(*) FROM pg_class c
 WHERE c.relname ~ '^archive_202002' AND c.relnamespace = 'pgqueue'::regnamespace};
for my $round (1 .. $rounds)
{
	for my $day (1 .. 3)
	{
		my $d = sprintf('2020-02-%02d', 3 * $round + $day);
		(my $name = "archive_$d") =~ s/-//g;
		expired_partition($node, $name, $d);
	}
	my $removed = 0;
	for (1 .. 20)
	{
		kick_scheduler();
		last if $removed = within(3, qq{
SELECT NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                    WHERE i.inhparent = 'pgqueue.archive'::regclass AND c.relname ~ '^archive_202002')});
	}
	ok($removed, "(11) round $round: three expired partitions removed from the archive");
	ok(within(20, "SELECT ($archive_202002) = 0"), "(11) round $round: and dropped");
}
open(my $fh, '>', $stop) or die "could not create $stop: $!";
close($fh);
$loop->finish;
my $dumps = () = $loop_out =~ /^ok$/mg;
my $dump_failures = () = $loop_out =~ /^failed$/mg;
ok($dumps >= $rounds, "(11) pg_dump ran $dumps times in a loop meanwhile");
is($dump_failures, 0, '(11) and never failed');
is($loop_err, '', '(11) nor said anything');

# --- (12) a user's pgq_schedule() in an open transaction ---------------------
restart_scheduler($node);
my $job2 = claimed_job('w2');
expired_partition($node, 'archive_20200105', '2020-01-05');
my $user = $node->background_psql('postgres');
$user->query_safe('BEGIN');
is($user->query_safe('SELECT pgq_schedule() >= 0'), 't',
	"(12) a user calls pgq_schedule() in a transaction left open");
ok(ack_within($job2, 'w2', 5),
	'(12) an ack on a queue with a retention completes meanwhile');
is(q1(attached_sql('archive_20200105')), 't',
	"(12) the user's call left the archive's upkeep to the scheduler");
$user->query_safe('COMMIT');
$user->quit;
kick_scheduler();
ok(within(10, gone_sql('archive_20200105')), '(12) which removes the partition');

# --- what is left --------------------------------------------------------------
is( q1(q{
SELECT count(*) FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
 WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pgqueue')
   AND c.relname ~ '^archive_'}),
	'0', 'no retired table is left');
is( q1(q{SELECT count(*) FROM pgqueue.archive WHERE queue = 'r'}),
	'2', 'the archive kept the rows that have not expired');
is(log_count($node, pgq_failure_re(), $log_offset), 0,
	'the scheduler logged no failure');

$node->stop;
done_testing();
