#!/bin/bash
# A client that knows what was committed (e2e/sim/src/postgres.rs runs it as `bash -c` in the
# image of e2e/images/postgres.sh, on another node than the database's): numbered transactions
# through the Service ($PGHOST), each a fresh connection, so that after a failover the next one
# reaches the new server. Transaction i inserts rows (i, 1..k) into `tx`, k = 5 for every tenth
# and 1 otherwise, and adds 1 to `counter`; once PostgreSQL acknowledges its COMMIT the client
# prints `ack <i> <k>`, and `failed <i>: <error>` otherwise (that one may or may not have
# committed: its id is never used again). A pause of 50 ms between transactions keeps it to about
# 15 a second. e2e/postgres/check.sh reads the `ack` lines.
set -uo pipefail
export PGUSER=postgres PGCONNECT_TIMEOUT=2
sql() { timeout 10 psql -X -q -At -v ON_ERROR_STOP=1 -c "$1" 2>&1; }
until out=$(sql "CREATE TABLE IF NOT EXISTS tx (id bigint NOT NULL, part int NOT NULL,
                   at timestamptz NOT NULL DEFAULT now());
                 CREATE INDEX IF NOT EXISTS tx_id ON tx (id);
                 CREATE TABLE IF NOT EXISTS counter (one int PRIMARY KEY CHECK (one = 1),
                   n bigint NOT NULL);
                 INSERT INTO counter VALUES (1, 0) ON CONFLICT DO NOTHING;"); do
  echo "waiting for the database: ${out%%$'\n'*}"
  sleep 1
done
# Ids of this client's own: past every id in the table and past this start's time in
# milliseconds times ten (a multiple of ten), so that two clients at once never share one.
until i=$(sql "SELECT greatest(coalesce(max(id), 0), $(date +%s%3N)0) FROM tx"); do sleep 1; done
# Its first id: check.sh finds any transaction of an earlier client below it.
echo "start $((i + 1))"
while :; do
  i=$((i + 1))
  k=1
  [ $((i % 10)) -eq 0 ] && k=5
  if out=$(sql "BEGIN; INSERT INTO tx (id, part) SELECT $i, p FROM generate_series(1, $k) p;
                UPDATE counter SET n = n + 1; COMMIT;"); then
    echo "ack $i $k"
    sleep 0.05
  else
    echo "failed $i: ${out%%$'\n'*}"
    sleep 0.2
  fi
done
