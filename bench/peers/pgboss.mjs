// The pg-boss 12.38 peer of `python -m bench --peers`.
//
//   node pgboss.mjs '{"connectionString": "...", "schema": "...", "queue": "bench", "module": URL}'
//
// `module` is the file URL of pg-boss's entry point (the install under tests/interop46: this
// script does not sit beside a node_modules of its own).
//
// One started PgBoss instance (its own schema, created by start(); LISTEN/NOTIFY on, the queue
// created with notify: true) driven over stdin/stdout, one JSON object per line:
//   stdout, first line: {"ready": true}, or {"fatal": message} and exit 1
//   stdin:  {"cmd": "drain", "n": 10000}        -> {"jobs_per_s": ...}
//           {"cmd": "latency", "n": 150, "gap_ms": 20} -> {"latencies_ms": [...]}
//           {"cmd": "send", "n": 300}            -> {"jobs_per_s": ...}   (one send per job)
//           {"cmd": "send_many", "batches": 12, "size": 1000} -> {"jobs_per_s": ...}
//           {"cmd": "create_queues", "names": [...]}  -> {"created": n}   (the missing ones)
//           {"cmd": "supervise"}                  -> {"seconds": ..., "round_trips": ...,
//                                                     "statements": ..., "transactions": ...}
//   every answer may be {"error": message} instead.
//
// `supervise` times one pass of pg-boss's own maintenance, `supervise()` (its public,
// documented way to run one pass and wait for it: monitor, expiry and retention of every queue,
// chunk by chunk, then the tail: backoff, vacuum check, instance upkeep, reindex). Every queue is
// made due first (its monitor and maintenance claims moved a week back, the reindex claim and
// the monitor backoff cleared), so the pass does all its work, as `run_once(force=True)` does on
// our side. The instance's own background pass waits while supervise() runs (pg-boss holds one
// pass at a time per instance); a supervise() before the reset lets one in flight finish first.
// The statements are counted on the instance's db adapter: a round trip is one executeSql call
// (pg-boss sends a locked step as one multi-statement text: BEGIN; SET LOCAL x2; the lock; the
// statement; COMMIT), a statement one of its parts other than BEGIN and COMMIT.
// Closing stdin stops the instance and ends the process.
//
// Worker settings (both drain and latency): localConcurrency 10, batchSize 10 and
// burstWhenBatchFull. pg-boss's defaults (batchSize 1, polling every 2 s after each fetch, burst
// ignored at batchSize 1) would drain at most 5 jobs/s per worker; this is the configuration its
// documentation gives for working through a backlog, and the strongest we found for it.
import { describe, serve, write } from './protocol.mjs'
import { performance } from 'node:perf_hooks'

const WORK_OPTIONS = { localConcurrency: 10, batchSize: 10, burstWhenBatchFull: true }


const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

async function main () {
  const config = JSON.parse(process.argv[2])
  const queue = config.queue || 'bench'
  const { PgBoss } = await import(config.module)
  const boss = new PgBoss({
    connectionString: config.connectionString,
    schema: config.schema,
    useListenNotify: true
  })
  boss.on('error', err => process.stderr.write(`pg-boss error: ${describe(err)}\n`))
  try {
    await boss.start()
    await boss.createQueue(queue, { notify: true })
  } catch (err) {
    write({ fatal: describe(err) })
    process.exit(1)
  }
  const db = boss.getDb()
  const jobTable = `"${config.schema}".job`

  // Every measured segment starts from an empty, vacuumed job table, as ours does.
  async function reset () {
    await boss.deleteAllJobs(queue)
    await db.executeSql(`VACUUM ANALYZE ${jobTable}`)
  }

  async function countCompleted () {
    const res = await db.executeSql(
      `SELECT count(*)::int AS n FROM ${jobTable} WHERE name = $1 AND state = 'completed'`,
      [queue]
    )
    return res.rows[0].n
  }

  async function prefill (n) {
    for (let done = 0; done < n; done += 1000) {
      const size = Math.min(1000, n - done)
      await boss.insert(queue, Array.from({ length: size }, (_, i) => ({ data: { n: done + i } })))
    }
    await db.executeSql(`ANALYZE ${jobTable}`)
  }

  // Every call pg-boss makes through its adapter, counted while `counting` is on.
  const counts = { roundTrips: 0, statements: 0, transactions: 0 }
  let counting = false
  const executeSql = db.executeSql.bind(db)
  db.executeSql = (text, values, ...rest) => {
    if (counting) {
      counts.roundTrips++
      const parts = String(text).split(';').map(p => p.trim().toUpperCase()).filter(Boolean)
      if (parts.includes('BEGIN')) counts.transactions++
      counts.statements += parts.filter(p => p !== 'BEGIN' && p !== 'COMMIT').length
    }
    return executeSql(text, values, ...rest)
  }
  const schemaName = `"${config.schema}"`

  const commands = {
    async drain ({ n }) {
      await reset()
      await prefill(n)
      let handled = 0
      let allHandled
      const handledAll = new Promise(resolve => { allHandled = resolve })
      const started = performance.now()
      await boss.work(queue, WORK_OPTIONS, async jobs => {
        handled += jobs.length
        if (handled >= n) allHandled()
      })
      await handledAll
      // The handlers have run; the last completions commit right after them.
      while (await countCompleted() < n) await sleep(2)
      const seconds = (performance.now() - started) / 1000
      await boss.offWork(queue, { wait: true })
      return { jobs_per_s: n / seconds }
    },

    async latency ({ n, gap_ms: gap }) {
      await reset()
      const committed = new Map()
      const startedAt = new Map()
      let allStarted
      const startedAll = new Promise(resolve => { allStarted = resolve })
      await boss.work(queue, WORK_OPTIONS, async jobs => {
        const now = performance.now()
        for (const job of jobs) {
          if (!startedAt.has(job.data.k)) startedAt.set(job.data.k, now)
        }
        if (startedAt.size >= n) allStarted()
      })
      await sleep(200) // idle, listening
      for (let k = 0; k < n; k++) {
        await boss.send(queue, { k }) // one INSERT in autocommit: resolved = committed
        committed.set(k, performance.now())
        await sleep(gap)
      }
      await Promise.race([startedAll, sleep(10000)])
      await boss.offWork(queue, { wait: true })
      const latencies = []
      for (const [k, t] of committed) {
        if (startedAt.has(k)) latencies.push(startedAt.get(k) - t)
      }
      return { latencies_ms: latencies }
    },

    async send ({ n }) {
      await reset()
      for (let k = 0; k < 20; k++) await boss.send(queue, { n: k }) // warm-up
      const started = performance.now()
      for (let k = 0; k < n; k++) await boss.send(queue, { n: k })
      return { jobs_per_s: n / ((performance.now() - started) / 1000) }
    },

    async send_many ({ batches, size }) {
      await reset()
      const make = b => Array.from({ length: size }, (_, i) => ({ data: { n: b * size + i } }))
      await boss.insert(queue, make(0)) // warm-up
      const all = Array.from({ length: batches }, (_, b) => make(b))
      const started = performance.now()
      for (const jobs of all) await boss.insert(queue, jobs)
      return { jobs_per_s: (batches * size) / ((performance.now() - started) / 1000) }
    },

    async create_queues ({ names }) {
      const have = new Set((await boss.getQueues()).map(q => q.name))
      let created = 0
      for (const name of names) {
        if (have.has(name)) continue
        await boss.createQueue(name)
        created++
      }
      return { created }
    },

    async supervise () {
      await boss.supervise() // a background pass in flight ends first
      await db.executeSql(
        `UPDATE ${schemaName}.queue SET maintain_on = NULL, ` +
        `monitor_claim_on = ${schemaName}.job_now() - interval '1 week'`
      )
      await db.executeSql(
        `UPDATE ${schemaName}.version SET reindex_on = NULL, monitor_backoff_on = NULL`
      )
      Object.assign(counts, { roundTrips: 0, statements: 0, transactions: 0 })
      counting = true
      const started = performance.now()
      try {
        await boss.supervise()
      } finally {
        counting = false
      }
      return {
        seconds: (performance.now() - started) / 1000,
        round_trips: counts.roundTrips,
        statements: counts.statements,
        transactions: counts.transactions
      }
    }
  }

  await serve(boss, commands)
}

main()
