#!/usr/bin/env bash
# One entry point for people and CI. Installs what it needs (Debian packages, a virtualenv
# in .venv) and then:
#   ./dev.sh demo [ARGS]   run `sfbridge demo` (SQLite only: no server, no config)
#   ./dev.sh test [ARGS]   lint, type-check and run the whole test suite (pytest ARGS), in
#                          SFBRIDGE_TEST_WORKERS (default 6) processes
#   ./dev.sh test --fast [ARGS]
#                          the unit tier only (tests/unit: no database server, no subprocess,
#                          no JVM), in under a minute, without installing or linting
# Environment: SFBRIDGE_TEST_PG = ODBC connection string prefix of a PostgreSQL server for the
# tests (default: a private cluster this checkout starts, see start_private_postgres).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

command="${1:-}"
[ $# -gt 0 ] && shift

say() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "need root (or sudo) to run: $*" >&2; exit 1; fi
}

apt_updated=0
stop_private_postgres=()
need_debian_packages() {
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null; then
        echo "missing system packages: ${missing[*]} (install them with your package manager)" >&2
        exit 1
    fi
    say "installing Debian packages: ${missing[*]}"
    if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

python_ok() {
    "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}

setup_venv() {
    local extra="$1"
    local python="${PYTHON:-python3}"
    if ! command -v "$python" >/dev/null || ! python_ok "$python"; then
        need_debian_packages python3 python3-venv
        python=/usr/bin/python3
    fi
    if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys' 2>/dev/null; then
        say "creating .venv with $($python --version)"
        rm -rf .venv
        "$python" -m venv .venv
    fi
    local stamp=".venv/.installed-$extra-$(cat pyproject.toml | cksum | cut -d' ' -f1)"
    if [ ! -f "$stamp" ]; then
        say "installing sfbridge and its dependencies into .venv"
        .venv/bin/python -m pip install -q --upgrade pip
        .venv/bin/python -m pip install -q -e ".[$extra]"
        touch "$stamp"
    fi
}

need_promtool() {
    # promtool checks and unit-tests config/prometheus-alerts.yaml. Only the binary is taken
    # from Debian's prometheus package: installing the package would also start a server.
    if [ -x .venv/bin/promtool ] || command -v promtool >/dev/null; then return 0; fi
    say "installing promtool into .venv/bin (from Debian's prometheus package)"
    if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
    local folder
    folder="$(mktemp -d)"
    (cd "$folder" && apt-get download -qq prometheus 2>/dev/null && dpkg-deb -x prometheus_*.deb root)
    cp "$folder/root/usr/bin/promtool" .venv/bin/promtool
    rm -rf "$folder"
}

need_pgbouncer() {
    # The tests start PgBouncer processes of their own in front of the test server. Only the
    # binary is taken from Debian's pgbouncer package (with the libraries it links, which start
    # nothing): installing the package would also start a pgbouncer service on port 6432.
    if [ -x .venv/bin/pgbouncer ] || command -v pgbouncer >/dev/null; then return 0; fi
    need_debian_packages libevent-2.1-7 libc-ares2
    say "installing pgbouncer into .venv/bin (from Debian's pgbouncer package)"
    if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
    local folder
    folder="$(mktemp -d)"
    (cd "$folder" && apt-get download -qq pgbouncer 2>/dev/null && dpkg-deb -x pgbouncer_*.deb root)
    cp "$folder/root/usr/sbin/pgbouncer" .venv/bin/pgbouncer
    rm -rf "$folder"
}

pg_reachable() {  # $1: host, $2: port
    PGCONNECT_TIMEOUT=3 psql -w -h "$1" -p "$2" -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1
}

start_private_postgres() {
    # A throwaway cluster with trust auth on loopback, owned by this checkout, tuned for tests:
    # fsync off (every DROP DATABASE forces a checkpoint, which on a server that syncs took
    # seconds each, minutes a run), connections for the parallel run, and no test touches a
    # server other people share. Prepared transactions stay off, as on a default server: the
    # two-phase tests start a cluster of their own that allows them (tests/conftest.py).
    # In the temp folder, not the checkout: the server runs as postgres, which may not be
    # able to enter the checkout (e.g. under /root).
    local checkout port folder
    checkout="$(printf '%s:%s' "$(id -u)" "$(pwd)" | cksum | cut -d' ' -f1)"
    port=$((50000 + checkout % 10000))  # one port per user and checkout: several may test
    folder="${TMPDIR:-/tmp}/sfbridge-pg-$(id -u)-$checkout"
    local bin
    bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
    local run=()
    [ "$(id -u)" = 0 ] && run=(runuser -u postgres --)
    if [ ! -d "$folder/data" ]; then
        say "creating a private PostgreSQL cluster in $folder (port $port)"
        mkdir -p "$folder"; chmod 755 "$folder"
        [ "$(id -u)" = 0 ] && chown postgres: "$folder"
        "${run[@]}" "$bin/initdb" -D "$folder/data" -U postgres -A trust --no-sync -E UTF8 \
            --locale=C.UTF-8 >/dev/null
    fi
    local settings="-c fsync=off -c full_page_writes=off -c max_connections=400"
    settings+=" -c shared_buffers=256MB"
    if ! pg_reachable 127.0.0.1 "$port"; then
        # A server of this folder that is up but not on this port (an older layout): stop it.
        "${run[@]}" "$bin/pg_ctl" -D "$folder/data" status >/dev/null 2>&1 \
            && "${run[@]}" "$bin/pg_ctl" -D "$folder/data" -m fast -w stop >/dev/null
        if ! "${run[@]}" "$bin/pg_ctl" -D "$folder/data" -l "$folder/log" -w \
            -o "-h 127.0.0.1 -p $port -k $folder $settings" start >/dev/null; then
            echo "the private PostgreSQL cluster did not start; its log ($folder/log) ends:" >&2
            tail -n 20 "$folder/log" >&2
            exit 1
        fi
    fi
    # Stopped again when the tests are done (the data stays for the next run).
    stop_private_postgres=("${run[@]}" "$bin/pg_ctl" -D "$folder/data" -m fast -w stop)
    export SFBRIDGE_TEST_PG="Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=$port;Uid=postgres;"
}

case "$command" in
    demo)
        setup_venv demo
        exec .venv/bin/sfbridge demo "$@"
        ;;
    test)
        fast=0
        if [ "${1:-}" = "--fast" ]; then
            shift
            fast=1
            # The virtualenv as it is if it has this pyproject's test extras: nothing installed
            # or linted. The unit tier is CPU-bound: one pytest process per core.
            if [ -f ".venv/.installed-test,spark-$(cat pyproject.toml | cksum | cut -d' ' -f1)" ]; then
                exec .venv/bin/python -m pytest tests/unit -q -n auto "$@"
            fi
        fi
        # unixODBC + psqlODBC for pyodbc; FreeTDS, which the SQL Server tests load (no SQL
        # Server needed for those); for the integration tier also the PostgreSQL server and
        # client and Java for the Spark tests (PySpark 4 needs 17 or later).
        need_debian_packages unixodbc odbc-postgresql tdsodbc procps
        setup_venv test,spark
        if [ "$fast" = 1 ]; then exec .venv/bin/python -m pytest tests/unit -q -n auto "$@"; fi
        need_debian_packages postgresql postgresql-client systemd openjdk-17-jre-headless
        need_promtool
        need_pgbouncer
        say "ruff"
        .venv/bin/ruff check bridge tests bench
        say "mypy"
        .venv/bin/mypy bridge
        export SPARK_LOCAL_IP=127.0.0.1
        if [ -z "${SFBRIDGE_TEST_PG:-}" ]; then
            # Stopped however this script ends (a failed test, Ctrl-C); the data stays.
            trap 'if [ ${#stop_private_postgres[@]} -gt 0 ]; then "${stop_private_postgres[@]}" >/dev/null 2>&1 || true; fi' EXIT
            start_private_postgres
        else
            say "testing against the PostgreSQL server SFBRIDGE_TEST_PG names"
        fi
        say "pytest"
        # Tests mostly wait (on daemons, faults, timeouts), so more of them than cores run at
        # once; a group (the Spark tests: one JVM at a time) stays on one worker.
        .venv/bin/python -m pytest -n "${SFBRIDGE_TEST_WORKERS:-6}" --dist loadgroup "$@"
        ;;
    *)
        echo "usage: ./dev.sh demo [--dir DIR] | ./dev.sh test [--fast] [PYTEST ARGS]" >&2
        exit 2
        ;;
esac
