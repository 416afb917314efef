// graphile-worker's side of `inbox bench` (written next to its node_modules by
// the bench and run with node):
//   node graphile.mjs seed <url> <jobs>   migrations, then <jobs> no-op jobs with the bench's payload (stdin)
//   node graphile.mjs work <url>          a worker process with the fast settings, until killed
import { Logger, makeWorkerUtils, run } from "graphile-worker";
import { readFileSync } from "node:fs";

const [mode, connectionString, count] = process.argv.slice(2);

if (mode === "seed") {
  const payload = JSON.parse(readFileSync(0, "utf8"));
  const utils = await makeWorkerUtils({ connectionString, logger: new Logger(() => () => {}) });
  await utils.migrate();
  const total = Number(count);
  for (let done = 0; done < total; ) {
    const n = Math.min(5000, total - done);
    await utils.addJobs(Array.from({ length: n }, () => ({ identifier: "noop", payload })));
    done += n;
  }
  await utils.release();
} else if (mode === "work") {
  const runner = await run({
    connectionString,
    concurrency: 24,
    maxPoolSize: 26,
    noHandleSignals: true,
    pollInterval: 100,
    taskList: { noop: async () => {} },
    preset: { worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0 } },
    logger: new Logger(() => () => {}),
  });
  console.log("started");
  await runner.promise;
} else {
  console.error("usage: graphile.mjs seed <url> <jobs> | work <url>");
  process.exit(2);
}
