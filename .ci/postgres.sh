#!/usr/bin/env bash
# A throwaway PostgreSQL server for the store's PostgreSQL tests.
#
#   .ci/postgres.sh start DIR   install PostgreSQL from Debian's packages when missing, create a cluster in
#                               DIR (an empty or absent directory), start it on 127.0.0.1 at a free port,
#                               create the database and print its SQLAlchemy URL (the only line on stdout)
#   .ci/postgres.sh stop DIR    stop that server (the data stays in DIR until you remove it)
#
# The server listens on 127.0.0.1 only, trusts local connections and keeps its socket and log in DIR.
# initdb refuses to run as root: as root the cluster belongs to the `postgres` user (created by the
# Debian package); as any other user it belongs to that user.
set -euo pipefail

DB_NAME="${GRACE_PG_DB:-grace_matrix_test}"
DB_USER="${GRACE_PG_USER:-grace}"

say() { echo "postgres.sh: $*" >&2; }

find_bindir() {
    local initdb
    if initdb=$(command -v initdb 2>/dev/null); then
        dirname "$(readlink -f "$initdb")"
        return 0
    fi
    # Debian keeps the server binaries out of PATH, one directory per major version; take the newest.
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$dir" ] && [ -x "$dir/initdb" ] && echo "$dir"
}

install_postgres() {
    say "PostgreSQL is not installed; installing it from Debian's packages"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >&2
    $sudo apt-get install -y -qq postgresql >&2
}

free_port() {
    python3 - <<'EOF'
import socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
EOF
}

# Run a command as the cluster's owner: `postgres` when we are root, else ourselves.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

start() {
    local dir="$1"
    local bindir
    bindir=$(find_bindir) || true
    if [ -z "$bindir" ]; then
        install_postgres
        bindir=$(find_bindir) || { say "initdb not found after installing postgresql"; exit 1; }
    fi
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ -n "$(ls -A "$dir")" ]; then
        say "$dir is not empty; give an empty or absent directory"
        exit 2
    fi
    if [ "$(id -u)" -eq 0 ]; then
        # Debian's package creates the user; a server built another way may not have.
        id postgres >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin postgres
        chown postgres: "$dir"
        # The owner must reach the directory through every parent (a directory from mktemp -d is private to root).
        chmod o+x "$(dirname "$dir")" 2>/dev/null || true
    fi
    local port
    port=$(free_port)
    as_owner "$bindir/initdb" -D "$dir/data" -U "$DB_USER" -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 ||
        { cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >&2 ||
        { cat "$dir/server.log" >&2; exit 1; }
    as_owner "$bindir/createdb" -h 127.0.0.1 -p "$port" -U "$DB_USER" "$DB_NAME"
    echo "$port" >"$dir/port"
    say "$("$bindir/pg_ctl" --version) on 127.0.0.1:$port, data in $dir/data"
    echo "postgresql+psycopg://$DB_USER@127.0.0.1:$port/$DB_NAME"
}

stop() {
    local dir="$1"
    local bindir
    bindir=$(find_bindir) || { say "PostgreSQL is not installed; nothing to stop"; return 0; }
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >&2
    else
        say "no server running in $dir"
    fi
}

case "${1:-}" in
start) start "${2:?usage: $0 start DIR}" ;;
stop) stop "${2:?usage: $0 stop DIR}" ;;
*)
    echo "usage: $0 start DIR | stop DIR" >&2
    exit 2
    ;;
esac
