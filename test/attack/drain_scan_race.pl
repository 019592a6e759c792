# A race test driven by gdb, not part of the suite (it needs root to attach
# gdb to the scheduler): the final emptiness check of a live slot drained
# without SHARE (src/ring.c, slot_settled_empty) runs while transactions
# that locked the slot after the look that noted its lockers (claims,
# extends, nacks) may update its rows in place.  A non-HOT update whose new
# version does not fit on the row's page goes to another page; if that page
# is one the SnapshotDirty scan already passed, or one added after the scan
# read the relation's size, and the updater commits before the scan reaches
# the old version, that scan sees no row.
#
#  bp1 VirtualXactLock (lockers_over; the look's first scan found none):
#      the noted locker s0 (ROW EXCLUSIVE since before the turn, as a pass
#      or push that locked the slot while it was current) inserts the work
#      row of job J into the slot, fills its page (HOT updates), commits;
#  bp2 heapgetpage of the slot (the final scan has read its size): session
#      B claims J with a long lock_key (the new version goes to a new page)
#      and commits.
# Passes when the slot is not drained while J's row is in it and an ack of
# J under READ COMMITTED finds it (it failed before slot_settled_empty).
#
# Run (as root): cp test/attack/drain_scan_race.pl t/090_attack_scan_race.pl;
#   PGQ_ATTACK_CTL=/tmp/pgq-attack bash test/attack/drain_scan_race_gdb.sh &
#   then the TAP test t/090_attack_scan_race.pl as usual (TESTING.md).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

my $ctl = $ENV{PGQ_ATTACK_CTL} // '/tmp/pgq-attack';
mkdir $ctl;
chmod 0777, $ctl;
unlink glob("$ctl/*");

my $node = ring_node('attack_scan');
sub q1 { return $node->safe_psql('postgres', $_[0]); }
q1('CREATE EXTENSION pageinspect');

sub wait_file
{
	my ($f, $secs) = @_;
	my $until = time + $secs;
	while (!-e "$ctl/$f")
	{
		return 0 if time > $until;
		usleep(50_000);
	}
	return 1;
}

sub touch { open(my $fh, '>', "$ctl/$_[0]") or die; print $fh ($_[1] // ''); close $fh; }

# job J: due tomorrow, so that no pass schedules it (s0 does, as a pass would)
my $J = q1("SELECT pgq_push('x', '{}', now() + interval '1 day')");

turn_work_ring($node, 'a');
my $slot = current_slot($node, 'work_queue');
my $tbl = "pgqueue.work_queue_$slot";
my @s = map { $node->background_psql('postgres') } 0 .. 2;
my ($s0, $H, $B) = @s;
$s0->query_safe("BEGIN; LOCK TABLE $tbl IN ROW EXCLUSIVE MODE");

my ($from, $to) = turn_work_ring($node, 'a');
is($from, $slot, "the ring turned from slot $slot to slot $to");
is(q1("SELECT count(*) FROM $tbl"), '0', "slot $slot is empty");
usleep(1_000_000);    # a look notes s0 among the lockers
is(slot_state($node, 'work_queue', $slot), 'live', 'live while s0 is open');

# an old snapshot, so that the dead versions on J's page are not pruned
$H->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$H->query_safe('SELECT 1');

my $pid = scheduler_pid($node, 'postgres');
my $relnode = q1("SELECT pg_relation_filenode('$tbl')");
touch('info', "$pid $relnode\n");
note "scheduler $pid, slot $slot relfilenode $relnode";

ok(wait_file('go1', 120), 'gdb: the scheduler stopped in lockers_over') or BAIL_OUT('no gdb');
is(slot_state($node, 'work_queue', $slot), 'live', 'still live at bp1');
$s0->query_safe("UPDATE pgqueue.queue SET state = 'scheduled' WHERE id = '$J'");
$s0->query_safe(
	"INSERT INTO $tbl (id, queue, batch_order, slot, created) VALUES ('$J', 'x', 0, $slot, clock_timestamp())");
my $fill = $s0->query_safe(qq{
DO \$\$
DECLARE b int; fr int; i int := 0;
BEGIN
  LOOP
    SELECT (ctid::text::point)[0]::int INTO b FROM $tbl WHERE id = '$J';
    SELECT upper - lower INTO fr FROM page_header(get_raw_page('$tbl', b));
    EXIT WHEN fr <= 250 OR i > 500;
    UPDATE $tbl SET version = version + 1 WHERE id = '$J';
    i := i + 1;
  END LOOP;
END \$\$;
SELECT 'J at ' || ctid || ' of ' || pg_relation_size('$tbl') / 8192 || ' pages, page free ' || (SELECT upper - lower FROM page_header(get_raw_page('$tbl', (t.ctid::text::point)[0]::int))) FROM $tbl t WHERE id = '$J';});
note "s0: $fill";
$s0->query_safe('COMMIT');
touch('done1');

ok(wait_file('go2', 60), 'gdb: the scheduler stopped at the first page of its final scan');
my $key = 'w' . ('k' x 199);
my $upd = $B->query_safe(qq{SELECT string_agg(c.id::text, ',') FROM pgq_claim('$key', 1, '1 hour', ARRAY['x']) c});
note "B: pgq_claim returned [$upd]";
if ($upd ne $J)
{
	$upd = $B->query_safe(qq{
UPDATE $tbl SET lock_key = '$key', started = now(),
       lock_timeout = now() + interval '1 hour', version = version + 1
 WHERE id = '$J' RETURNING ctid});
	note "B: claim missed J; updated by hand";
}
$upd = q1("SELECT ctid FROM $tbl WHERE id = '$J'");
note "B: J now at $upd";
touch('done2');

poll_bounded($node, "SELECT state <> 'live' FROM pgqueue.slots WHERE tbl = 'work_queue' AND slot = $slot", 10);
my $state = slot_state($node, 'work_queue', $slot);
my $rows = q1("SELECT count(*) FROM $tbl");
note "slot $slot: $state with $rows rows";
ok(!($state eq 'drained' && $rows > 0), "slot $slot not drained while J's work row is in it (state $state, rows $rows)");
my ($arc, $ack, $aerr) = $node->psql('postgres', "SELECT pgq_ack('$J', '$key')");
note "ack: rc $arc out [$ack] err [$aerr]";
is($ack, 't', 'an ack under READ COMMITTED finds the work row of J');

$H->query_safe('COMMIT');
my $until = time + 15;
my $log = '';
while (time < $until)
{
	$log = slurp_file($node->logfile);
	last if $log =~ /drained slot $slot of pgqueue.work_queue has rows/;
	usleep(200_000);
}
note "log: drained slot has rows: " . ($log =~ /drained slot $slot of pgqueue.work_queue has rows/ ? 'yes' : 'no');
my ($brc, $back, $berr) = $node->psql('postgres', "SELECT pgq_ack('$J', '$key')");
note "ack after the truncation's look: rc $brc out [$back] err [$berr]";
note "slot $slot state at the end: " . slot_state($node, 'work_queue', $slot)
  . ', rows ' . q1("SELECT count(*) FROM $tbl");
$_->quit for @s;
$node->stop;
done_testing();
