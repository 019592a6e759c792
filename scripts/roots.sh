# Debian roots for the matrix and the packages (sourced, not run):
# scripts/matrix.sh, scripts/package.sh and scripts/package-test.sh.
#
# Each supported PostgreSQL major is the one of a Debian suite:
#   15 bookworm (Debian 12), 17 trixie (Debian 13), 18 sid (unstable).
# Under PGQ_ROOTS (default /var/cache/pgqueue-matrix) it keeps:
#   base-SUITE.tar   a pristine `debootstrap --variant=minbase SUITE` root,
#                    made once; fresh roots are unpacked from it
#   SUITE/           the build root of the suite: base + postgresql-NN,
#                    postgresql-server-dev-NN, build-essential,
#                    libipc-run-perl (and what a caller adds), kept
#   debs/SUITE/      the packages scripts/package.sh built there
#   logs/            one log per run and major
# Every root gets usr/sbin/policy-rc.d (exit 101), so that a package's
# postinst starts no server (the roots share this machine's network), and
# sid gets Acquire::Check-Valid-Until "false" (its Release file may be
# older than its Valid-Until).  The mirror is debootstrap's default unless
# PGQ_MIRROR names another.
#
# A root is entered with /proc, /sys, /dev, /dev/pts and /dev/shm mounted
# (counted, so that several runs may share a root); root_leave_all unmounts
# what this shell mounted, and root_remove refuses a root that still has
# anything mounted in it.
#
# Sourcing it (`. "$(dirname "$0")/roots.sh"`, first thing) runs the script
# again under sudo unless it runs as root (scripts/as-root.sh), and moves to the top of the tree,
# SRC.

# shellcheck source=scripts/as-root.sh
source "$(dirname "${BASH_SOURCE[0]}")/as-root.sh"
as_root "$0" "$@"
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
SRC=$(pwd)
PGQ_ROOTS=${PGQ_ROOTS:-/var/cache/pgqueue-matrix}
PGQ_MIRROR=${PGQ_MIRROR:-}
ROOT_MOUNTS=(proc sys dev dev/pts dev/shm)
ROOTS_ENTERED=()

# what a script that uses the roots does first: debootstrap on this
# machine, the lock that lets one such script at a time use the roots, and
# the traps that leave the roots it entered
roots_begin() {
	export DEBIAN_FRONTEND=noninteractive
	if ! command -v debootstrap >/dev/null; then
		echo "==> installing debootstrap"
		apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null ||
			{ echo "apt-get install debootstrap failed"; return 1; }
	fi
	mkdir -p "$PGQ_ROOTS/logs"
	exec 8>"$PGQ_ROOTS/.lock"
	flock 8
	trap root_leave_all EXIT
	trap 'exit 130' INT TERM HUP
}

suite_of_major() {
	case $1 in
	15) echo bookworm ;;
	17) echo trixie ;;
	18) echo sid ;;
	*) return 1 ;;
	esac
}

# the packages of the build root of major $1
root_packages() {
	echo "postgresql-$1 postgresql-server-dev-$1 build-essential libipc-run-perl"
}

# true when something is mounted at or below directory $1
root_has_mounts() {
	local dir
	dir=$(readlink -f "$1")
	awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { found = 1 } END { exit !found }' /proc/self/mounts
}

# remove root directory $1; refuses while anything is mounted in it (a bind
# mount of /dev would take the host's device nodes with it)
root_remove() {
	local dir=$1
	[ -e "$dir" ] || return 0
	if root_has_mounts "$dir"; then
		echo "roots: $dir still has mounts; not removing it" >&2
		return 1
	fi
	rm -rf --one-file-system "$dir" && rm -f "$dir.lock" "$dir.mounts"
}

# the settings every root gets (root $1 of suite $2)
root_configure() {
	local root=$1 suite=$2
	printf '#!/bin/sh\n# no service starts in this root (it shares the host network)\nexit 101\n' \
		>"$root/usr/sbin/policy-rc.d"
	chmod 755 "$root/usr/sbin/policy-rc.d"
	if [ "$suite" = sid ]; then
		echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99no-check-valid-until"
	fi
	# no documentation, man pages or translations: smaller, faster roots
	cat >"$root/etc/dpkg/dpkg.cfg.d/01-pgqueue-nodoc" <<-'EOF'
	path-exclude /usr/share/doc/*
	path-include /usr/share/doc/*/copyright
	path-exclude /usr/share/man/*
	path-exclude /usr/share/locale/*
	EOF
}

# make $PGQ_ROOTS/base-$1.tar unless it exists (debootstrap, about a minute)
root_base() {
	local suite=$1 tar=$PGQ_ROOTS/base-$1.tar tmp
	[ -s "$tar" ] && return 0
	mkdir -p "$PGQ_ROOTS"
	tmp=$PGQ_ROOTS/base-$suite.new
	root_remove "$tmp" || return 1
	echo "==> debootstrap $suite" >&2
	# shellcheck disable=SC2086
	if ! debootstrap --variant=minbase "$suite" "$tmp" $PGQ_MIRROR >"$PGQ_ROOTS/debootstrap-$suite.log" 2>&1; then
		tail -n 20 "$PGQ_ROOTS/debootstrap-$suite.log" >&2
		root_remove "$tmp"
		return 1
	fi
	root_configure "$tmp" "$suite"
	tar -C "$tmp" -cf "$tar.new" . && mv "$tar.new" "$tar" && root_remove "$tmp"
}

# unpack a fresh root of suite $1 into directory $2 (which must not exist)
root_fresh() {
	local suite=$1 dir=$2
	root_base "$suite" || return 1
	[ -e "$dir" ] && { echo "roots: $dir exists" >&2; return 1; }
	mkdir -p "$dir" && tar -C "$dir" -xf "$PGQ_ROOTS/base-$suite.tar"
}

# mount what a root needs (counted: the last root_leave unmounts)
root_enter() {
	local root=$1 m n
	(
		flock 9
		n=$(cat "$root.mounts" 2>/dev/null || echo 0)
		if [ "$n" -le 0 ]; then
			for m in "${ROOT_MOUNTS[@]}"; do
				mkdir -p "$root/$m"
				mountpoint -q "$root/$m" && continue
				case $m in
				proc) mount -t proc proc "$root/proc" ;;
				sys) mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys" ;;
				*) mount --bind "/$m" "$root/$m" ;;
				esac || { echo "roots: mounting $m in $root failed" >&2; exit 1; }
			done
		fi
		echo $((n + 1)) >"$root.mounts"
	) 9>"$root.lock" || { root_unmount "$root"; return 1; }
	ROOTS_ENTERED+=("$root")
	cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
}

root_unmount() {
	local root=$1 i m
	for ((i = ${#ROOT_MOUNTS[@]} - 1; i >= 0; i--)); do
		m=${ROOT_MOUNTS[$i]}
		if mountpoint -q "$root/$m"; then
			umount -R "$root/$m" 2>/dev/null || umount -lR "$root/$m"
		fi
	done
}

root_leave() {
	local root=$1 n r kept=() found=0
	for r in "${ROOTS_ENTERED[@]}"; do
		if [ "$found" = 0 ] && [ "$r" = "$root" ]; then found=1; else kept+=("$r"); fi
	done
	ROOTS_ENTERED=("${kept[@]}")
	(
		flock 9
		n=$(cat "$root.mounts" 2>/dev/null || echo 1)
		n=$((n - 1))
		if [ "$n" -le 0 ]; then
			root_unmount "$root"
			rm -f "$root.mounts"
		else
			echo "$n" >"$root.mounts"
		fi
	) 9>"$root.lock"
}

# leave every root this shell entered (for an EXIT trap)
root_leave_all() {
	local r all=("${ROOTS_ENTERED[@]}")
	for r in "${all[@]}"; do root_leave "$r"; done
}

# run a command in an entered root, as root, with a clean environment;
# VAR=value words before the command go into its environment
root_run() {
	local root=$1
	shift
	env -i HOME=/root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		chroot "$root" /usr/bin/env "$@"
}

# apt-get install packages $2... into entered root $1 (after an update)
root_install() {
	local root=$1
	shift
	root_run "$root" sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"' \
		apt "$@"
}

# make (or reuse) the build root of major $1 with its packages; sets
# BUILD_ROOT to its path.  It is built under SUITE.new and renamed once
# complete, so an interrupted setup is started over.
root_build() {
	local major=$1 suite root tmp
	BUILD_ROOT=
	suite=$(suite_of_major "$major") || { echo "roots: no Debian suite for PostgreSQL $major" >&2; return 1; }
	root=$PGQ_ROOTS/$suite
	if [ ! -f "$root/.pgqueue-root" ]; then
		tmp=$root.new
		root_remove "$tmp" || return 1
		root_fresh "$suite" "$tmp" || return 1
		root_enter "$tmp" || return 1
		echo "==> installing $(root_packages "$major") in $suite" >&2
		# shellcheck disable=SC2046
		if ! root_install "$tmp" $(root_packages "$major") >"$PGQ_ROOTS/install-$suite.log" 2>&1; then
			tail -n 20 "$PGQ_ROOTS/install-$suite.log" >&2
			root_leave "$tmp"
			return 1
		fi
		root_leave "$tmp"
		date -u +%FT%TZ >"$tmp/.pgqueue-root"
		rm -f "$tmp.lock" "$tmp.mounts"
		root_remove "$root" && mv "$tmp" "$root" || return 1
	fi
	BUILD_ROOT=$root
}

# copy the tree of checkout $1 (the files git tracks and those it does not
# ignore, as they are now; every file elsewhere) to directory $2
copy_tree() {
	local src=$1 dst=$2
	mkdir -p "$dst"
	if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		(cd "$src" && git ls-files -z -co --exclude-standard |
			perl -0ne 'chomp; print "$_\0" if -f $_ || -l $_' |
			tar --null -T - -cf -) | tar -C "$dst" -xf -
	else
		tar -C "$src" --exclude=.git -cf - . | tar -C "$dst" -xf -
	fi
}
