#!/bin/bash
# The PostgreSQL container's start (e2e/sim/src/postgres.rs runs it as `bash -c`, as root, in
# the image of e2e/images/postgres.sh): the data directory on the pod's volume at /data, made by
# `initdb --data-checksums` on first start, then the server as the postgres user.
#
# Every start of the server logs to a file of its own on the volume,
# /data/log/postgresql-<node>-<start time>.log, lines stamped in UTC with the process id: after a
# failover the logs of every server that ran on the data directory are there, whichever node ran
# it, which is what e2e/postgres/check.sh reads (crash recoveries, two servers at once).
set -euo pipefail
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
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$data" \
  -c listen_addresses='*' -c shared_buffers=32MB -c jit=off \
  -c logging_collector=on -c log_directory=/data/log \
  -c log_filename="postgresql-${NODE_NAME:?}-%Y%m%d-%H%M%S.log" \
  -c log_rotation_age=0 -c log_rotation_size=0 -c log_timezone=UTC \
  -c log_line_prefix='%m [%p] ' -c log_checkpoints=on
