# shellcheck shell=bash
# Sourced by the scripts that must run as root (scripts/demo.sh,
# scripts/test.sh, scripts/fresh-machine.sh, sanitize.sh, valgrind.sh, roots.sh (matrix.sh,
# package.sh, package-test.sh), test/clients/run.sh,
# dashboard/test/run.sh):
#
#   source "$(dirname "$0")/as-root.sh"; as_root "$0" "$@"
#
# As root it does nothing.  Another user's run is started again through
# sudo, with the settings of these scripts from the environment passed along
# by name (sudo resets the environment: KEEP_TEST_DIR=1 bash scripts/test.sh
# keeps its directory, PGQ_DEMO_PORT=... bash scripts/demo.sh uses the port).
# Without sudo (a fresh Debian installed with a root password has none) it
# says how to run the script as root and exits.
as_root() {
	local script=$1 v keep=()
	shift
	[ "$(id -u)" = 0 ] && return 0
	if ! command -v sudo >/dev/null; then
		echo "$script must run as root, and there is no sudo here: run it as root" \
			"(su -, then: cd $(pwd) && bash $script $*)," \
			"or install sudo and add yourself to group sudo" >&2
		exit 1
	fi
	for v in $(compgen -e); do
		case $v in
		PGQ_* | SOAK_* | FUZZ_* | DASHBOARD_* | FRESH_* | MATRIX_* | PACKAGE_TEST_* | VALGRIND_SUPP | API_SECONDS | SMITH_SECONDS | KEEP_TEST_DIR | TEST_DIR_BASE | \
			PG_CONFIG | PG_CFLAGS | PG_LDFLAGS | EXTRA_REGRESS_OPTS | \
			NODE_EXTRA_CA_CERTS | http_proxy | https_proxy | no_proxy | HTTP_PROXY | HTTPS_PROXY | NO_PROXY)
			keep+=("$v=${!v}")
			;;
		esac
	done
	exec sudo -- env "${keep[@]}" bash "$script" "$@"
}
