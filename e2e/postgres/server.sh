#!/bin/bash
# The PostgreSQL container's start (e2e/sim/src/postgres.rs runs it as `bash -c`, as root, in
# the image of e2e/images/postgres.sh): the data directory on the pod's volume at /data, made by
# `initdb --data-checksums` on first start, then the server as the postgres user.
#
# Every start of the server logs to a file of its own on the volume,
# /data/log/postgresql-<UTC start time to the nanosecond>-<node>.log, lines stamped in UTC with
# the process id; beside the server's own lines this script appends a heartbeat to it every
# 200 ms while the server runs, so that a server that runs on (a frozen node thawed) shows in
# its file even when it logs nothing itself. After a failover the logs of every server that ran
# on the data directory are there, whichever node ran it: e2e/postgres/check.sh reads them
# (crash recoveries, two servers at once).
#
# The buffer pool is small (1 MB, far below the data), so that what the checks read comes from
# the files (through the kernel's page cache) rather than from this server's memory. TERM (the
# kubelet's stop) is passed on as a fast shutdown, which fits the pod's short grace period.
set -euo pipefail
export TZ=UTC
data=/data/pgdata
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
install -d -o postgres -g postgres -m 0755 /data/log
# The local socket's directory (a tmpfs that systemd would make on a host).
install -d -o postgres -g postgres -m 2775 /run/postgresql
if [ ! -s "$data/PG_VERSION" ]; then
  install -d -o postgres -g postgres -m 0700 "$data"
  as_postgres initdb --data-checksums --auth=trust --username=postgres --encoding=UTF8 \
    --locale=C.UTF-8 --pgdata="$data"
  echo "host all all all trust" >> "$data/pg_hba.conf"
fi
log=/data/log/postgresql-$(date -u +%Y%m%d-%H%M%S-%N)-${NODE_NAME:?}.log
as_postgres touch "$log"
# Started directly (not through a function, which would fork a subshell): $! is the server.
setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$data" \
  -c listen_addresses='*' -c max_connections=20 -c shared_buffers=1MB \
  -c autovacuum_max_workers=1 -c jit=off \
  -c logging_collector=on -c log_directory=/data/log -c log_filename="${log##*/}" \
  -c log_rotation_age=0 -c log_rotation_size=0 -c log_timezone=UTC \
  -c log_line_prefix='%m [%p] ' -c log_checkpoints=on &
server=$!
trap 'kill -INT "$server" 2>/dev/null || true' TERM INT
heartbeat() {
  local now ms
  while kill -0 "$server" 2>/dev/null; do
    now=$EPOCHREALTIME
    ms=${now#*.}
    printf '%(%Y-%m-%d %H:%M:%S)T.%s UTC [heartbeat] LOG:  server %s on %s runs\n' \
      "${now%.*}" "${ms:0:3}" "$server" "$NODE_NAME" >> "$log"
    sleep 0.2
  done
}
heartbeat &
status=0
wait "$server" || status=$?
# A TERM trapped while waiting: wait for the server to finish its shutdown.
while kill -0 "$server" 2>/dev/null; do wait "$server" || status=$?; done
exit "$status"
