# An emptied slot of work_queue is drained while calls keep locking it.
#
# Claims and acks lock (ROW EXCLUSIVE) every live slot they visit, until
# their transaction ends.  The scheduler once drained a live slot only
# when it had SHARE on it at once: under a steady flow of claims some
# transaction always held such a lock, empty slots stayed live for as
# long as the claims came, and each one kept live cost every claim a probe
# (the ring's drain ran slower than 1.0's, and the tables grew).  It now
# notes, at a look that finds the slot empty, the transactions that hold
# a lock on it, and drains it once they have all ended (src/ring.c, "Why
# no row is lost").
#
# - while a transaction that held a lock on the slot since before the
#   turn is open, the slot is not drained (it might still write it: a
#   call that locked the slot while it was current), even after many
#   looks at the ring;
# - once it has ended, the slot is drained although another transaction
#   holds a lock on it at every moment (a relay of sessions, each taking
#   the lock before the one before lets go): counted.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = ring_node('drain_busy');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# the first turn is from slot 0, which is never drained: one turn first
turn_work_ring($node, 'a');

# the slot current now, locked by a transaction from before the turn
my $slot = current_slot($node, 'work_queue');
my $tbl = "pgqueue.work_queue_$slot";
my @s = map { $node->background_psql('postgres') } 0 .. 2;
$s[0]->query_safe("BEGIN; LOCK TABLE $tbl IN ROW EXCLUSIVE MODE");

my ($from, $to) = turn_work_ring($node, 'a');
is($from, $slot, "the ring turned from slot $slot to slot $to");
is(q1("SELECT count(*) FROM $tbl"), '0', "slot $slot is empty (its jobs acked)");

# --- a locker from before: not drained while it is open ----------------------
my $looks = counter($node, 'postgres', 'scheduler_passes');
my $states = '';
for (1 .. 30)
{
	$states .= ' ' . slot_state($node, 'work_queue', $slot);
	usleep(100_000);
}
cmp_ok(counter($node, 'postgres', 'scheduler_passes') - $looks, '>', 5,
	'the scheduler ran passes (and looked at the ring) meanwhile');
unlike($states, qr/drained|free/,
	"slot $slot stays live while a transaction that locked it before the turn is open");

# --- a relay of lockers: drained all the same ---------------------------------
my $cur = 0;
my $relays = 0;
my $state = 'live';
for my $i (1 .. 40)
{
	my $next = ($cur + 1) % 3;
	$s[$next]->query_safe("BEGIN; LOCK TABLE $tbl IN ROW EXCLUSIVE MODE");
	$s[$cur]->query_safe('COMMIT');
	$relays++;
	$cur = $next;
	usleep(300_000);
	$state = slot_state($node, 'work_queue', $slot);
	last if $state ne 'live';
}
like($state, qr/^(drained|free)$/,
	"slot $slot drained while a lock on it was held at every moment ($relays relays)");
$s[$cur]->query_safe('COMMIT');
$_->quit for @s;

is(lost_jobs($node), '', 'no job scheduled without its work_queue row');
$node->stop;
done_testing();
