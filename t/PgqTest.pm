# Helpers shared by the pgqueue TAP tests (t/*.pl).
#
# Load with:
#   use FindBin;
#   use lib $FindBin::RealBin;
#   use PgqTest;
package PgqTest;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

our @EXPORT = qw(
  pgq_node
  slot_oids
  slot_files
  wait_slots_free
  scheduler_pid
  wait_for_scheduler
  scheduler_count
  launcher_pid
  wait_for_launcher
  pgq_exit_re
  pgq_failure_re
  counter
  wait_passes_stable
  poll_start
  log_count
  drain_queue
  ring_node
  restart_scheduler
  expired_partition
  schema_dump
  schema_normalise
  same_schema
);

# A new node that preloads pgqueue.  $conf is appended to postgresql.conf
# after the defaults (pgqueue.database = 'postgres'), so it can override
# them.  %init_opts go to init (allows_streaming => 1, ...).
sub pgq_node
{
	my ($name, $conf, %init_opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%init_opts);
	$node->append_conf(
		'postgresql.conf', qq{
shared_preload_libraries = 'pgqueue'
pgqueue.database = 'postgres'
log_line_prefix = '%m [%p] %b '
} . ($conf // ''));
	return $node;
}

# SQL condition selecting the scheduler of database $db in pg_stat_activity
# (a scheduler connected to no database yet when $db is undef).
sub _sched_where
{
	my ($db) = @_;
	return "backend_type = 'pgqueue scheduler' AND "
	  . (defined $db ? "datname = '$db'" : "datname IS NULL");
}

# How many schedulers of database $db show in pg_stat_activity.
sub scheduler_count
{
	my ($node, $db) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE " . _sched_where($db));
}

# The pid of the one scheduler of database $db ('' when there is none).
sub scheduler_pid
{
	my ($node, $db) = @_;
	return $node->safe_psql('postgres',
		    "SELECT pid FROM pg_stat_activity WHERE "
		  . _sched_where($db)
		  . " ORDER BY pid LIMIT 1");
}

# Wait until exactly one scheduler of database $db shows in
# pg_stat_activity, other than $not_pid when given; return its pid.
# Also works while the server restarts (poll_query_until retries failed
# connections).
sub wait_for_scheduler
{
	my ($node, $db, $not_pid) = @_;
	my $where = _sched_where($db);
	$where .= " AND pid <> $not_pid" if $not_pid;
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE $where")
	  or die "no scheduler for database " . ($db // '(none)');
	return scheduler_pid($node, $db);
}

# The pid of the launcher ('' when there is none).
sub launcher_pid
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgqueue launcher' ORDER BY pid LIMIT 1"
	);
}

# Wait until exactly one launcher shows in pg_stat_activity, other than
# $not_pid when given; return its pid.
sub wait_for_launcher
{
	my ($node, $not_pid) = @_;
	my $where = "backend_type = 'pgqueue launcher'";
	$where .= " AND pid <> $not_pid" if $not_pid;
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE $where")
	  or die "no launcher";
	return launcher_pid($node);
}

# The postmaster's line for a pgqueue process (launcher or scheduler) that
# exited with a non-zero code (one that exits with 0 is logged at DEBUG1).
sub pgq_exit_re
{
	return qr/background worker "pgqueue [a-z]+" \(PID \d+\) exited with exit code/;
}

# A log line of a pgqueue process that looks like a failure: its ERROR,
# FATAL, PANIC or WARNING (by the backend type of log_line_prefix), or the
# postmaster's line for its non-zero exit.
sub pgq_failure_re
{
	my $exit = pgq_exit_re();
	return qr/\] pgqueue (?:launcher|scheduler) (?:ERROR|FATAL|PANIC|WARNING):|$exit/;
}

# One column of pgq_counters().
sub counter
{
	my ($node, $db, $name) = @_;
	return $node->safe_psql($db, "SELECT $name FROM pgq_counters()");
}

# Wait until pgq_counters().scheduler_passes stops moving (two reads
# $gap_ms apart agree); return its value.
sub wait_passes_stable
{
	my ($node, $db, $gap_ms) = @_;
	$gap_ms //= 400;
	my $prev = counter($node, $db, 'scheduler_passes');
	for (1 .. 100)
	{
		usleep($gap_ms * 1000);
		my $now = counter($node, $db, 'scheduler_passes');
		return $now if $now == $prev;
		$prev = $now;
	}
	die "scheduler_passes never stopped moving";
}

# Start a node whose previous postmaster was killed with SIGKILL: its
# children may hold the old shared memory for a moment, so retry as core's
# src/test/recovery/t/017_shm.pl does.
sub poll_start
{
	my ($node) = @_;
	my $max_attempts = 10 * $PostgreSQL::Test::Utils::timeout_default;
	for (1 .. $max_attempts)
	{
		return 1 if $node->start(fail_ok => 1);
		usleep(100_000);
		$node->stop('fast', fail_ok => 1);
	}
	return $node->start;
}

# How many times $re matches in the server log, from byte $offset on.
sub log_count
{
	my ($node, $re, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset // 0);
	my $n = () = $log =~ /$re/g;
	return $n;
}

# Claim every job of queue $q on $node, 100 at a time, and ack them;
# returns the n of their payloads ({"n": ...}) in the order claimed.
sub drain_queue
{
	my ($node, $q) = @_;
	my @n;
	for (;;)
	{
		my $out = $node->safe_psql('postgres', qq{
WITH c AS (SELECT * FROM pgq_claim('k', 100, '1 minute', ARRAY['$q']))
SELECT (c.payload->>'n')::int, pgq_ack(c.id, 'k') FROM c});
		last if $out eq '';
		for my $line (split /\n/, $out)
		{
			my ($n, $acked) = split /\|/, $line;
			die "ack of job $n failed" unless $acked eq 't';
			push @n, $n;
		}
	}
	return @n;
}

# The OIDs of the tables of slots @slots of ring $tbl (queue, work_queue),
# as a list for SQL's IN.
sub slot_oids
{
	my ($node, $tbl, @slots) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(format('pgqueue.%I', '${tbl}_' || s)::regclass::oid::text, ',')
		   FROM unnest(ARRAY[" . join(',', @slots) . "]) s");
}

# The relfilenodes of the tables of $oids (slot_oids), in the same order:
# a TRUNCATE gives a table a new one.
sub slot_files
{
	my ($node, $oids) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(pg_relation_filenode(o)::text, ',' ORDER BY n)
		   FROM unnest(ARRAY[$oids]::oid[]) WITH ORDINALITY u(o, n)");
}

# Wait until every table of $oids (slot_oids) of ring $tbl is a free slot,
# or was dropped (the scheduler drops free slots beyond two), or, given
# $files (slot_files, read before), was truncated since: under a load that
# goes on, a slot truncated may have become current again.
sub wait_slots_free
{
	my ($node, $tbl, $oids, $files) = @_;
	my $truncated = defined($files) ? 'OR c.relfilenode <> o.file' : '';
	$files //= $oids;
	return $node->poll_query_until('postgres', qq{
SELECT bool_and(s.state = 'free' OR c.oid IS NULL $truncated)
  FROM unnest(ARRAY[$oids]::oid[], ARRAY[$files]::oid[]) o(oid, file)
  LEFT JOIN pg_class c ON c.oid = o.oid
  LEFT JOIN pgqueue.slots s ON s.tbl = '$tbl' AND c.relname = '${tbl}_' || s.slot});
}

# A started node whose rings turn at small sizes (pgqueue.slot_size =
# 64 kB, passes every 50 ms, no autovacuum), with pgqueue and pgstattuple
# made in database postgres: the ring tests' server.
sub ring_node
{
	my ($name) = @_;
	my $node = pgq_node(
		$name, qq{
pgqueue.slot_size = 64
pgqueue.naptime = 50
autovacuum = off
});
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
	$node->safe_psql('postgres', 'CREATE EXTENSION pgstattuple');
	return $node;
}

# Restart the scheduler of database postgres (pg_terminate_backend; the
# launcher starts a new one within a second), and wait for the new one's
# second pass: its first pass is followed by the upkeep that a new
# scheduler runs at once (the archive's, in a transaction of its own), so
# that the upkeep has run on what the database held before the restart.
sub restart_scheduler
{
	my ($node) = @_;
	my $old = scheduler_pid($node, 'postgres');
	my $passes = counter($node, 'postgres', 'scheduler_passes');
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($old)");
	wait_for_scheduler($node, 'postgres', $old);
	$node->poll_query_until('postgres',
		"SELECT scheduler_passes > $passes + 1 FROM pgq_counters()")
	  or die 'the new scheduler runs no pass';
}

# An expired partition $name of pgqueue.archive (in database postgres) for
# the UTC day $day (YYYY-MM-DD), made by hand, with a row (in a DO block: a
# CREATE TABLE in schema pgqueue sent at top level is taken for a restore,
# which pauses the scheduler; src/hook.c).
sub expired_partition
{
	my ($node, $name, $day) = @_;
	$node->safe_psql('postgres', qq{
DO \$\$ BEGIN
CREATE TABLE pgqueue.$name PARTITION OF pgqueue.archive
  FOR VALUES FROM ('$day 00:00+00') TO ('$day 00:00+00'::timestamptz + interval '1 day');
END \$\$;
INSERT INTO pgqueue.archive (id, queue, payload, priority, tries, created, finished, outcome, expires)
VALUES (gen_random_uuid(), 'old', '{}', 0, 1, '$day', '$day', 'acked', '$day 12:00+00');
});
}

# --- pg_dump --schema-only, compared (t/033, t/035) ---------------------------

# What pg_dump --schema-only @opts writes of database $db of $node.
sub schema_dump
{
	my ($node, $db, @opts) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pg_dump', '--schema-only', @opts, '-d', $node->connstr($db) ],
		'>', \$out, '2>', \$err)
	  or die "pg_dump @opts $db failed: $err";
	return $out;
}

# A schema dump normalised for comparison (its entries by name, without
# OIDs, xids and the --binary-upgrade calls that name them), and the
# missing values it sets (table.column=value, comma-separated).
sub schema_normalise
{
	my ($dump) = @_;
	my %entries;
	my $head = '(before the first entry)';
	my @missing;
	for my $line (split /\n/, $dump)
	{
		if ($line =~ /^-- (?:Data for )?Name: (.*)$/)
		{
			$head = $1;
			next;
		}
		next if $line =~ /^--/ || $line =~ /^\s*$/;
		next if $line =~ /^\\(?:restrict|unrestrict) /;
		next if $line =~ /^SELECT pg_catalog\.binary_upgrade_set_next_\w+\(.*\);$/;
		if ($line =~ /^SELECT pg_catalog\.binary_upgrade_set_missing_value\('([^']+)'::pg_catalog\.regclass,\s*'([^']+)',\s*'(.*)'\);$/)
		{
			push @missing, "$1.$2=$3";
			next;
		}
		$line =~ s/relfrozenxid = '\d+', relminmxid = '\d+'/relfrozenxid = 'X', relminmxid = 'X'/;
		$line =~ s/^WHERE oid = '\d+';$/WHERE oid = 'X';/;    # a TOAST table's
		# the configuration tables by OID, and their conditions in that
		# order (compared by name above)
		$line =~ s/'\{[^']*\}'/'{...}'/g
		  if $line =~ /binary_upgrade_create_empty_extension/;
		push @{ $entries{$head} }, $line;
	}
	my $text = join '', map { "-- $_\n" . join("\n", @{ $entries{$_} }) . "\n" }
	  sort keys %entries;
	return ($text, join(',', sort @missing));
}

# Equal normalised dumps, or a failed test with their diff (the two kept
# in the test's directory as $name.got.sql and $name.want.sql).
sub same_schema
{
	my ($name, $got, $want, $msg) = @_;
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	my ($g, $w) = ("$dir/$name.got.sql", "$dir/$name.want.sql");
	PostgreSQL::Test::Utils::append_to_file($g, $got);
	PostgreSQL::Test::Utils::append_to_file($w, $want);
	my $diff = '';
	IPC::Run::run([ 'diff', '-u', $w, $g ], '>', \$diff);
	ok($diff eq '', $msg) or diag($diff);
}

1;
