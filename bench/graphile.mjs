// graphile-worker's side of `inbox bench` (written next to its node_modules by
// the bench and run with node), in a database of its own:
//   node graphile.mjs seed <url> <jobs>   migrations, then <jobs> no-op jobs with the bench's payload (stdin)
//   node graphile.mjs once <url>          one worker process with the fast settings: its pool connected,
//                                         it prints "ready", starts at "go" on stdin, and exits once no job
//                                         is left (graphile-worker's runOnce), so that nothing polls its tables
//                                         and its start-up is not counted against it
import { Logger, makeWorkerUtils, runOnce } from "graphile-worker";
import pg from "pg";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";

const [mode, connectionString, count] = process.argv.slice(2);
const logger = new Logger(() => () => {});

// Its documented settings for throughput: 24 jobs at once, a local queue of
// 500 jobs fetched in one go, completions batched without delay.
const CONCURRENCY = 24;
const preset = {
  worker: {
    concurrentJobs: CONCURRENCY,
    maxPoolSize: CONCURRENCY + 2,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};

if (mode === "seed") {
  const payload = JSON.parse(readFileSync(0, "utf8"));
  const utils = await makeWorkerUtils({ connectionString, logger });
  await utils.migrate();
  const total = Number(count);
  for (let done = 0; done < total; ) {
    const n = Math.min(5000, total - done);
    await utils.addJobs(Array.from({ length: n }, () => ({ identifier: "noop", payload })));
    done += n;
  }
  await utils.release();
} else if (mode === "once") {
  const pgPool = new pg.Pool({ connectionString, max: CONCURRENCY + 2 });
  pgPool.on("error", (e) => console.error(`graphile-worker's pool: ${e.message}`));
  // Every connection made before the start.
  const clients = await Promise.all(Array.from({ length: CONCURRENCY + 2 }, () => pgPool.connect()));
  clients.forEach((c) => c.release());
  const lines = createInterface({ input: process.stdin });
  console.log("ready");
  for await (const line of lines) if (line === "go") break;
  await runOnce({ pgPool, noHandleSignals: true, preset, logger, taskList: { noop: async () => {} } });
  await pgPool.end();
  console.log("done");
} else {
  console.error("usage: graphile.mjs seed <url> <jobs> | once <url>");
  process.exit(2);
}
