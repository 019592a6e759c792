# pgqueue: PGXS build
MODULE_big = pgqueue
OBJS = \
	src/pgqueue.o \
	src/common.o \
	src/api.o \
	src/admin.o \
	src/archive.o \
	src/claim.o \
	src/jobs.o \
	src/schedule.o \
	src/rate.o \
	src/flow.o \
	src/ring.o \
	src/retire.o \
	src/worker.o \
	src/launcher.o \
	src/hook.o \
	src/shmem.o \
	src/publish.o \
	src/bounds.o \
	src/tables.o \
	src/uuid7.o
EXTENSION = pgqueue
DATA = pgqueue--1.0.sql pgqueue--1.1.sql pgqueue--1.0--1.1.sql pgqueue--1.1--1.2.sql
PGFILEDESC = "pgqueue - durable job queue with an in-server scheduler"

# pg_regress, isolation and TAP tests all run against private servers that
# preload the library (test/regress.conf); see scripts/test.sh.
REGRESS = setup push schedule claim lease ack_nack release configure stats \
	security bad_input counters lighter_rows operate archive periodic slots job_max_tries rate_limit \
	flows groups
REGRESS_OPTS = --temp-config=$(srcdir)/test/regress.conf \
	--temp-instance=$(CURDIR)/tmp_check_regress
ISOLATION = claim_race steal_vs_ack schedule_race ack_vs_nack dedup_race scan_hints schedule_bound \
	scan_bounds cancel_vs_ack cancel_vs_claim cancel_vs_schedule retry_race cap_race schedule_refresh \
	move_vs_ack job_move cancel_held_move rate_race flow_race flow_cancel_race group_race lease_memo
ISOLATION_OPTS = --temp-config=$(srcdir)/test/isolation.conf \
	--temp-instance=$(CURDIR)/tmp_check_iso
TAP_TESTS = 1
# The released 1.0 regress suite, run against a 1.0 install with this
# library (scripts/test.sh compat): make installcheck REGRESS="$(COMPAT10)"
# REGRESS_OPTS="$(COMPAT10_OPTS)" ISOLATION= TAP_TESTS=
COMPAT10 = setup push schedule claim lease ack_nack release configure stats \
	security bad_input counters
COMPAT10_OPTS = --temp-config=$(srcdir)/test/regress.conf \
	--temp-instance=$(CURDIR)/tmp_check_compat \
	--inputdir=$(srcdir)/test/compat10 --outputdir=$(CURDIR)/output_compat \
	$(COMPAT10_EXPECTED)
# From 16 pg_regress reads the expected files from --expecteddir (default
# "."), not from the input directory; 15's has no such option.
COMPAT10_EXPECTED = $(if $(filter 15,$(MAJORVERSION)),,--expecteddir=$(srcdir)/test/compat10)
EXTRA_CLEAN = tmp_check_regress tmp_check_iso tmp_check_compat output_iso output_compat

# make WERROR=1: warnings are errors, in the gcc build and in the clang
# bitcode build (the build check of each supported major).  Off by default,
# so that a newer compiler's new warning does not stop a user's build.
ifeq ($(WERROR),1)
override PG_CFLAGS += -Werror
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

ifeq ($(WERROR),1)
override BITCODE_CFLAGS += -Werror
endif

# every object includes its layer's header, which includes those of the
# layers below (src/README); PGXS tracks no dependencies
$(OBJS): $(wildcard src/*.h)

# Reliability checks (docs/internals.md, "Reliability testing"); none is part of
# installcheck.  Sanitizers: PGXS takes extra flags from the environment or
# the command line, e.g.
#   make PG_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -g" \
#        PG_LDFLAGS="-fsanitize=address,undefined"
# and the library then loads only into a server that has the ASan runtime
# preloaded: scripts/sanitize.sh does both, and runs the suites.
.PHONY: fuzz sanitize valgrind
fuzz:
	bash scripts/test.sh fuzz
sanitize:
	bash scripts/sanitize.sh
valgrind:
	bash scripts/valgrind.sh

# --- PGXN distribution (make dist) -------------------------------------------
# pgqueue-<version>.zip of the committed HEAD (git archive), the file PGXN
# takes: the extension, its tests and documents, without the benchmark,
# client libraries, dashboard and packaging.  The version is META.json's,
# which scripts/check-meta.py checks against the PGXN meta spec first.
DIST_VERSION = $(shell sed -n 's/^   "version": "\(.*\)",$$/\1/p' $(srcdir)/META.json)
DIST_PATHS = META.json README.md docs CHANGELOG.md LICENSE Makefile pgqueue.control \
	$(DATA) src sql expected specs t test scripts
.PHONY: dist
dist:
	python3 $(srcdir)/scripts/check-meta.py $(srcdir)/META.json
	git -C $(srcdir) archive --format=zip --prefix=$(EXTENSION)-$(DIST_VERSION)/ \
		-o $(CURDIR)/$(EXTENSION)-$(DIST_VERSION).zip HEAD $(DIST_PATHS)
	@echo "$(EXTENSION)-$(DIST_VERSION).zip"
