// The pg-boss 11.1.2 peer of `python -m bench --only "scale26:"`: its fetch on our rows.
//
//   node pgboss11.mjs '{"connectionString": "...", "schema": "...", "module": URL}'
//
// `module` is the file URL of pg-boss 11.1.2's entry point (the install under tests/interop).
// The schema is ours, at version 26 (pg-boss 11.1.x's own), installed by our migration and
// holding the bench's jobs: start() must not change it, so the instance neither migrates
// (it only checks the version), supervises (no maintenance, no expiry) nor schedules.
//
// Driven over stdin/stdout, one JSON object per line:
//   stdout, first line: {"ready": true}, or {"fatal": message} and exit 1
//   stdin:  {"cmd": "fetch", "queue": "q", "batch": 10} -> {"ms": 12.3, "ids": [...]}
//           (one `fetch(queue, {batchSize})`, timed around the call; the caller puts the
//           claimed jobs back before the next one)
//           {"cmd": "explain", "queue": "q", "batch": 10} -> {"plan": [lines]}
//           (the same fetch, its statement as pg-boss builds it run under
//           EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled back: fetch's `db` option)
//   every answer may be {"error": message} instead.
// Closing stdin stops the instance and ends the process.
import { describe, serve, write } from './protocol.mjs'
import { performance } from 'node:perf_hooks'


async function main () {
  const config = JSON.parse(process.argv[2])
  const imported = await import(config.module)
  const PgBoss = imported.default || imported.PgBoss
  const boss = new PgBoss({
    connectionString: config.connectionString,
    schema: config.schema,
    migrate: false,
    supervise: false,
    schedule: false
  })
  boss.on('error', err => process.stderr.write(`pg-boss error: ${describe(err)}\n`))
  try {
    await boss.start()
  } catch (err) {
    write({ fatal: describe(err) })
    process.exit(1)
  }

  const commands = {
    async fetch ({ queue, batch }) {
      const started = performance.now()
      const jobs = await boss.fetch(queue, { batchSize: batch })
      const ms = performance.now() - started
      return { ms, ids: jobs.map(job => job.id) }
    },

    async explain ({ queue, batch }) {
      const client = await boss.getDb().pool.connect()
      try {
        await client.query('BEGIN')
        const db = {
          executeSql: (text, values) => client.query('EXPLAIN (ANALYZE, BUFFERS) ' + text, values)
        }
        const rows = await boss.fetch(queue, { batchSize: batch, db })
        return { plan: rows.map(row => row['QUERY PLAN']) }
      } finally {
        await client.query('ROLLBACK')
        client.release()
      }
    }
  }

  await serve(boss, commands)
}

main()
