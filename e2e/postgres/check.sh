#!/bin/bash
# PostgreSQL's own verdict on a database after a fault, for `podha chaos --check` (or by hand):
# run against the StatefulSet of e2e/sim/src/postgres.rs (server.sh) and the client of
# client.sh, through kubectl. It fails (exit 1) unless
#   - every transaction the client saw acknowledged is present, whole, exactly once;
#   - no transaction is torn, and the counter equals the number of transactions present;
#   - the data directory has checksums on and pg_stat_database counts no checksum failure;
#   - pg_amcheck --heapallindexed finds every table and index of every database clean;
#   - the servers' logs on the volume show no two servers on the data directory at once: no
#     server logged after a later one had started.
# It prints one line of figures, `verdict key=value ...`, the crash recoveries among them.
#
# Usage: check.sh --namespace NS --statefulset NAME --client DEPLOYMENT [--wait SECONDS]
# Env: KUBECTL (default kubectl), and whatever kubectl reads (KUBECONFIG).
set -euo pipefail
kubectl=${KUBECTL:-kubectl}
ns= sts= client= wait=120
usage="usage: check.sh --namespace NS --statefulset NAME --client DEPLOYMENT [--wait SECONDS]"
while [ $# -gt 0 ]; do
  case $1 in
    --namespace) ns=${2:?$usage}; shift 2 ;;
    --statefulset) sts=${2:?$usage}; shift 2 ;;
    --client) client=${2:?$usage}; shift 2 ;;
    --wait) wait=${2:?$usage}; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[ -n "$ns" ] && [ -n "$sts" ] && [ -n "$client" ] || { echo "$usage" >&2; exit 2; }
fail() { echo "check.sh: $*" >&2; exit 1; }
k() { "$kubectl" --namespace "$ns" "$@"; }
pod=$sts-0
in_db() { k exec -i "$pod" -c postgres -- "$@"; }

# The server may still be recovering when a failover's replacement is Running.
deadline=$((SECONDS + wait))
until in_db pg_isready -q -h 127.0.0.1 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || fail "PostgreSQL in $ns/$pod did not accept connections within ${wait}s"
  sleep 1
done

# What the client was told: `ack <id> <rows>`, in its one container's log (a client restarted
# or replaced would have taken the acknowledgements before with it).
# A client replaced by another (a new pod) starts past every id in the table: transactions
# below its first id are an earlier client's, whose acknowledgements are not in this log.
restarts=$(k get pods -l "app=$client" -o jsonpath='{range .items[*]}{.status.containerStatuses[0].restartCount}{"\n"}{end}') \
  || fail "reading the client's pods in $ns failed"
[ "$restarts" = 0 ] || fail "the client $ns/$client must be one pod that never restarted, for its log to hold every acknowledgement (restart counts: ${restarts//$'\n'/, })"
client_log=$(k logs "deployment/$client") || fail "reading the log of $ns/$client failed"
first_id=$(awk '$1 == "start" { print $2; exit }' <<<"$client_log")
[ -n "$first_id" ] || fail "the client's log has no start line (its first id)"
acks=$(awk '$1 == "ack" { print $2 "\t" $3 }' <<<"$client_log")
[ -n "$acks" ] || fail "the client $ns/$client has acknowledged no transaction yet"

# Every table and index, every database (amcheck installed where missing); before the figures,
# so that the checksum failures it meets are counted in them.
# Exit code 2: corruption found; any other failure is pg_amcheck's own error.
amcheck_status=0
amcheck=$(in_db pg_amcheck -U postgres -h 127.0.0.1 --install-missing --heapallindexed --all 2>&1) \
  || amcheck_status=$?
case $amcheck_status in
  0) amcheck_verdict=clean ;;
  2) amcheck_verdict=corrupt ;;
  *) amcheck_verdict=error ;;
esac
figures=$({
  printf 'CREATE TEMP TABLE acks (id bigint, k int);\nCOPY acks FROM STDIN;\n%s\n\\.\n' "$acks"
  printf 'CREATE TEMP TABLE client_start AS SELECT %d::bigint AS id;\n' "$first_id"
  # The table's own rows (a sequential scan), not what its index says it holds.
  cat <<'SQL'
SET enable_indexscan = off;
SET enable_indexonlyscan = off;
SET enable_bitmapscan = off;
WITH present AS (SELECT id, count(*) AS n FROM tx GROUP BY id)
SELECT 'acknowledged=' || (SELECT count(*) FROM acks),
       'present=' || (SELECT count(*) FROM acks a JOIN present p USING (id) WHERE p.n = a.k),
       'lost=' || (SELECT count(*) FROM acks a LEFT JOIN present p USING (id) WHERE p.id IS NULL),
       'torn=' || (SELECT count(*) FROM present
                   WHERE n <> CASE WHEN id % 10 = 0 THEN 5 ELSE 1 END),
       'counter=' || (SELECT n FROM counter),
       'transactions=' || (SELECT count(*) FROM present),
       'before_client=' || (SELECT count(*) FROM present WHERE id < (SELECT id FROM client_start)),
       'checksum_failures=' || (SELECT coalesce(sum(checksum_failures), 0) FROM pg_stat_database),
       'data_checksums=' || current_setting('data_checksums');
SQL
} | in_db psql -X -q -At -F ' ' -v ON_ERROR_STOP=1 -U postgres -h 127.0.0.1) \
  || fail "the query of the client's transactions failed: $figures"

overlaps_file=$(mktemp)
trap 'rm -f "$overlaps_file"' EXIT
# The servers' logs, one file per server start: when each logged first and last, its crash
# recovery and redo time; a server that logged after a later one's first line overlapped it.
logs=$(in_db bash -c 'for f in /data/log/postgresql-*.log; do printf "\n== %s\n" "$f"; cat "$f"; done') \
  || fail "reading the servers' logs in $ns/$pod failed"
log_figures=$(awk '
  /^== / { n++; file[n] = $2; next }
  /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] / {
    ts = $1 " " $2
    if (!(n in first)) first[n] = ts
    last[n] = ts
    lastline[n] = $0
  }
  /automatic recovery in progress/ { recoveries++ }
  /redo done at/ { r = $0; sub(/.*elapsed: /, "", r); sub(/ s.*/, "", r); redo[n] = r }
  END {
    # Files in order of their first line (insertion sort: a handful of starts).
    for (i = 1; i <= n; i++) order[i] = i
    for (i = 2; i <= n; i++)
      for (j = i; j > 1 && first[order[j]] < first[order[j - 1]]; j--) {
        t = order[j]; order[j] = order[j - 1]; order[j - 1] = t
      }
    for (i = 2; i <= n; i++) {
      a = order[i - 1]; b = order[i]
      if (last[a] > first[b]) {
        overlapping++
        printf "overlap: %s logged until %s, after %s started at %s; its last line: %s\n",
          file[a], last[a], file[b], first[b], lastline[a] > "/dev/stderr"
      }
    }
    latest = (n in order) ? order[n] : 0
    printf "starts=%d crash_recoveries=%d last_redo_seconds=%s overlapping_servers=%d\n",
      n, recoveries, ((latest in redo) ? redo[latest] : "0"), overlapping
  }' <<<"$logs" 2>"$overlaps_file")

echo "verdict $figures amcheck=$amcheck_verdict $log_figures"
problems=()
get() { tr ' ' '\n' <<<"$figures $log_figures" | awk -F= -v key="$1" '$1 == key { print $2; exit }'; }
[ "$(get lost)" = 0 ] || problems+=("$(get lost) acknowledged transaction(s) lost")
[ "$(get present)" = "$(get acknowledged)" ] || problems+=("only $(get present) of $(get acknowledged) acknowledged transactions present whole")
[ "$(get torn)" = 0 ] || problems+=("$(get torn) transaction(s) torn")
[ "$(get counter)" = "$(get transactions)" ] || problems+=("the counter says $(get counter), the table holds $(get transactions) transactions")
[ "$(get data_checksums)" = on ] || problems+=("data checksums are $(get data_checksums)")
[ "$(get checksum_failures)" = 0 ] || problems+=("$(get checksum_failures) checksum failure(s)")
[ "$amcheck_verdict" = clean ] || problems+=("pg_amcheck ($amcheck_verdict, exit code $amcheck_status): $(head -c 400 <<<"$amcheck")")
[ "$(get before_client)" = 0 ] || problems+=("$(get before_client) transaction(s) from before the client's first id $first_id: an earlier client's, whose acknowledgements this client's log does not hold")
[ "$(get overlapping_servers)" = 0 ] || problems+=("$(get overlapping_servers) server(s) logged after a later one started on the same data directory: $(cat "$overlaps_file")")
if [ ${#problems[@]} -gt 0 ]; then
  printf 'check.sh: %s\n' "${problems[@]}" >&2
  echo "verdict $figures amcheck=$amcheck_verdict $log_figures" >&2
  exit 1
fi
