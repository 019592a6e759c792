# Any role that can connect
# stops the scheduling of a database, for as long as it stays connected
# and 60 s after, with one statement that fails.
#
# hook.c lists a session as restoring (the scheduler pauses: no pass, no
# upkeep) when it sends at top level a COPY ... FROM, CREATE TABLE, CREATE
# INDEX or an ALTER TABLE ... ATTACH/ADD CONSTRAINT naming a table of
# schema pgqueue.  It looks at the parse tree only, before the statement
# runs: no check of who sends it or whether it may run.  A role with no
# right on schema pgqueue sends "CREATE TABLE pgqueue.x (a int)", which
# fails (permission denied for schema pgqueue): the session is listed all
# the same, and nothing is scheduled in the database while it is
# connected.  The database commands' hold (pgq_may_run) checks the role so
# that "no one else can stop a scheduler this way"; the restore pause does
# not.
#
# Now only a superuser's statements pause the scheduler (hook.c).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ring_node('restore_pause_dos');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{CREATE ROLE nobody LOGIN});
my $j0 = q1(q{SELECT pgq_push('dos', '{}')});
ok(poll_bounded($node, "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$j0'", 10),
	'a job is scheduled');

my $n = $node->background_psql('postgres', on_error_stop => 0,
	extra_params => [ '-U', 'nobody' ]);
$n->query(q{CREATE TABLE pgqueue.x (a int)});
like($n->{stderr}, qr/permission denied for schema pgqueue/,
	'a role without rights on schema pgqueue: its CREATE TABLE fails');

my $j = q1(q{SELECT pgq_push('dos', '{}')});
ok(poll_bounded($node, "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$j'", 10),
	'a job pushed afterwards is scheduled while that session stays connected');
note('scheduler: ' . q1(q{SELECT query FROM pg_stat_activity WHERE backend_type LIKE 'pgqueue scheduler%'}));
$n->quit;

$node->stop;
done_testing();
