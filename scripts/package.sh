#!/usr/bin/env bash
# Build the Debian packages postgresql-NN-pgqueue (debian/), each in the
# build root of the Debian suite that ships PostgreSQL NN (scripts/roots.sh:
# 15 in bookworm, 17 in trixie, 18 in sid).
#
#   sudo bash scripts/package.sh 15            # postgresql-15-pgqueue
#   sudo bash scripts/package.sh 15 17 18
#   sudo bash scripts/package.sh --test 15     # then scripts/package-test.sh 15
#   PGQ_ROOTS=/some/dir ...                    # where roots and packages are kept
#
# In the root: the tree (the files git tracks and those it does not ignore,
# as they are now) is copied to /build/pkg/pgqueue-VERSION, the build
# dependencies of debian/control are installed (apt-get build-dep),
# `pg_buildext updatecontrol` writes debian/control for the suite's
# PostgreSQL, and `dpkg-buildpackage -b` builds.  The packages land in
# PGQ_ROOTS/debs/SUITE/ (default /var/cache/pgqueue-matrix/debs/...) and
# are listed with their sizes; the build's output is in
# PGQ_ROOTS/logs/package-NN.log.
set -uo pipefail

# shellcheck source=scripts/roots.sh
. "$(dirname "$0")/roots.sh"

test_after=0
majors=()
for a in "$@"; do
	case $a in
	--test) test_after=1 ;;
	[0-9]*) majors+=("$a") ;;
	*) echo "usage: $0 [--test] MAJOR..."; exit 2 ;;
	esac
done
[ ${#majors[@]} -gt 0 ] || { echo "usage: $0 [--test] MAJOR...  (15, 17, 18)"; exit 2; }

# the upstream version, from debian/changelog's first line
version=$(sed -nE '1s/^pgqueue \(([^-)]+)-[^)]*\).*/\1/p' debian/changelog)
[ -n "$version" ] || { echo "cannot read the version from debian/changelog"; exit 1; }

roots_begin || exit 1

status=0
for v in "${majors[@]}"; do
	suite=$(suite_of_major "$v") || { echo "no Debian suite ships PostgreSQL $v"; status=1; continue; }
	log=$PGQ_ROOTS/logs/package-$v.log
	out=$PGQ_ROOTS/debs/$suite
	t0=$SECONDS
	echo "==> postgresql-$v-pgqueue $version in $suite"
	root_build "$v" || { echo "the $suite root could not be made"; status=1; continue; }
	root=$BUILD_ROOT
	root_enter "$root" || { status=1; continue; }
	rm -rf "$root/build/pkg"
	copy_tree "$SRC" "$root/build/pkg/pgqueue-$version"
	# shellcheck disable=SC2016
	if root_run "$root" sh -exc '
		cd /build/pkg/pgqueue-'"$version"'
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends dpkg-dev
		apt-get build-dep -y -qq --no-install-recommends ./
		pg_buildext updatecontrol
		dpkg-buildpackage -b -uc -us
	' >"$log" 2>&1; then
		rm -rf "$out"
		mkdir -p "$out"
		cp "$root"/build/pkg/*.deb "$out/"
		cp "$root"/build/pkg/*.ddeb "$root"/build/pkg/*.buildinfo "$root"/build/pkg/*.changes "$out/" 2>/dev/null
		echo "built in $((SECONDS - t0)) s ($log):"
		for f in "$out"/*.deb "$out"/*.ddeb; do
			[ -f "$f" ] || continue
			printf '  %s  %d bytes (%d KiB)\n' "$f" "$(stat -c %s "$f")" $(($(stat -c %s "$f") / 1024))
		done
		deb=$(ls "$out"/postgresql-"$v"-pgqueue_*.deb)
		echo "  contents of $(basename "$deb"):"
		dpkg-deb -c "$deb" | awk '$6 !~ /\/$/ { print "    " $6 }'
		echo "  depends: $(dpkg-deb -f "$deb" Depends)"
	else
		echo "build failed in $((SECONDS - t0)) s; the end of $log:"
		tail -n 30 "$log"
		status=1
	fi
	root_leave "$root"
done

if [ "$test_after" = 1 ] && [ "$status" = 0 ]; then
	exec 8>&-
	root_leave_all
	trap - EXIT
	exec bash scripts/package-test.sh "${majors[@]}"
fi
exit $status
