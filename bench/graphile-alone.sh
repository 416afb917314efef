#!/usr/bin/env bash
# graphile-worker alone, run by its own CLI: the outside check on the figure
# `inbox-bench` gives it (docs/bench.md). Nothing of the bench is used.
#
# In a database of its own on the server of DATABASE_URL, each round seeds
# JOBS no-op jobs carrying the bench's payload (about 1.5 KB) through
# graphile-worker's own `add_jobs` in SQL, vacuums and checkpoints, then
# times PROCESSES `graphile-worker --once` with its fast settings (24 jobs at
# once, a local queue of 500, completions batched without delay, no log line
# per job), from their
# start to the last one's exit: their start-up is counted against them.
#
#   bench/graphile-alone.sh [JOBS] [PROCESSES] [ROUNDS]     default 100000 2 3
set -euo pipefail
jobs=${1:-100000} processes=${2:-2} rounds=${3:-3}
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
version=0.17.3
dir=${TMPDIR:-/tmp}/inbox-bench-graphile-worker-$version
[ -e "$dir/node_modules/graphile-worker/package.json" ] ||
  npm install --no-audit --no-fund --silent --prefix "$dir" "graphile-worker@$version"
db=inbox_graphile_alone
base=${url%%\?*}
own="${base%/*}/$db"
psql -q -X "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
trap 'psql -q -X "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT

work=$(mktemp -d)
mkdir "$work/tasks"
echo 'module.exports = async () => {};' >"$work/tasks/noop.js"
cat >"$work/graphile.config.js" <<CONFIG
// Silent: by default it logs a line per job done.
const { Logger } = require("$dir/node_modules/graphile-worker");
module.exports = {
  worker: {
    logger: new Logger(() => () => {}),
    connectionString: "$own",
    concurrentJobs: 24,
    maxPoolSize: 26,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};
CONFIG
cli="$dir/node_modules/.bin/graphile-worker"
(cd "$work" && "$cli" --schema-only)

note=$(printf 'x%.0s' $(seq 1100))
for round in $(seq 1 "$rounds"); do
  psql -q -X "$own" -v ON_ERROR_STOP=1 <<SQL
DELETE FROM graphile_worker._private_jobs;
SELECT graphile_worker.add_jobs(array(
  SELECT ROW('noop', json_build_object('id', 'bench-gw', 'object', 'event', 'api_version', '2026-10-28',
             'type', 'payment_intent.succeeded', 'livemode', false, 'data', json_build_object('object',
             json_build_object('id', 'pi_bench-gw', 'object', 'payment_intent', 'amount', 2000,
             'amount_received', 2000, 'currency', 'usd', 'customer', 'cus_bench', 'status', 'succeeded',
             'metadata', json_build_object('note', '$note')))),
             NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
  FROM generate_series(1, $jobs))) \\g /dev/null
VACUUM (ANALYZE);
CHECKPOINT;
SQL
  started=$(date +%s.%N)
  pids=()
  for _ in $(seq 1 "$processes"); do
    (cd "$work" && exec "$cli" --once) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  ended=$(date +%s.%N)
  left=$(psql -tA -X "$own" -c "SELECT count(*) FROM graphile_worker._private_jobs")
  [ "$left" = 0 ] || { echo "round $round: $left jobs left undone" >&2; exit 1; }
  awk -v n="$jobs" -v a="$started" -v b="$ended" -v r="$round" -v p="$processes" \
    'BEGIN { printf "graphile-worker alone, %d no-op jobs, %d processes, round %d: %.0f jobs/s\n", n, p, r, n / (b - a) }'
done
rm -rf "$work"
