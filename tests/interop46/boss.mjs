// Node pg-boss 12.38.0 (schema 46), the oracle of the schema-46 tests.
//
//   node boss.mjs plan SCHEMA
//       prints getConstructionPlans(SCHEMA): the SQL of a fresh install at 46
//   node boss.mjs migration-plan SCHEMA VERSION
//       prints getMigrationPlans(SCHEMA, VERSION): the SQL that migrates VERSION to 46
//   node boss.mjs rollback-plan SCHEMA VERSION
//       prints getRollbackPlans(SCHEMA, V) for V from 46 down to VERSION + 1, one transaction
//       each: the SQL that takes a schema at 46 back to VERSION
//   node boss.mjs rpc '<config JSON>'     (or `rpc -`: the config is the first line of stdin,
//                                          for a process started ahead of need)
//       one PgBoss instance driven over stdin/stdout, as tests/interop/rpc.js does for 11.1.2:
//       config: { connectionString, schema, options: {...PgBoss constructor options}, start: true }
//       stdout, first line: {"ready": true} once start() resolved, or {"fatal": message} and exit 1
//       stdin:  {"id": 1, "method": "getBamStatus", "args": []}
//       stdout: {"id": 1, "result": ...} or {"id": 1, "error": message}
//       stdout, unprompted: {"event": "error" | "warning" | "bam" | "stopped" | "job", ...}
//       arguments of the form {"$date": "<ISO-8601>"} become Date objects;
//       work(name, options, behaviour) starts a test handler that reports each job it is
//       given as a "job" event ({queue, id, data, retryCount, at}), then fails the batch when
//       behaviour.fail (or a job's data.fail) is set, else returns behaviour.output;
//       calls run concurrently; closing stdin stops the instance gracefully and ends the process.
//       options.clock = {"$testClock": "<ISO-8601>"} runs the instance on pg-boss's TestClock from
//       that time (its statements read it through job_now()); clockSetTime(date) jumps it,
//       firing nothing, clockTick(ms) advances it firing each timer due, clockNow() reads it.
//
// Migrating a database with background builds inline is pg-boss's own command line:
//   node node_modules/pg-boss/dist/cli.js migrate --connection-string URL --schema SCHEMA
import readline from 'node:readline'
import { PgBoss, TestClock, getConstructionPlans, getMigrationPlans, getRollbackPlans } from 'pg-boss'
import { firstLine } from '../interop/stdin.js'

function write (message) {
  process.stdout.write(JSON.stringify(message) + '\n')
}

function describe (err) {
  return (err && (err.stack || err.message)) || String(err)
}

function revive (value) {
  if (Array.isArray(value)) return value.map(revive)
  if (value && typeof value === 'object') {
    if (typeof value.$date === 'string' && Object.keys(value).length === 1) {
      return new Date(value.$date)
    }
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, revive(v)]))
  }
  return value
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

// A test handler: reports every job it is given, then fails or completes the batch.
function handler (name, behaviour) {
  return async jobs => {
    for (const job of jobs) {
      write({
        event: 'job',
        queue: name,
        id: job.id,
        data: job.data,
        retryCount: job.retryCount,
        at: new Date().toISOString()
      })
    }
    if (behaviour.sleepMs) await sleep(behaviour.sleepMs)
    const fail = behaviour.fail || jobs.some(job => job.data && job.data.fail)
    if (fail) throw new Error(behaviour.message || 'failed by node')
    return behaviour.output === undefined ? { by: 'node' } : behaviour.output
  }
}

async function rpc (config) {
  const options = revive(config.options || {})
  const clock = options.clock && typeof options.clock.$testClock === 'string'
    ? new TestClock(new Date(options.clock.$testClock))
    : null
  if (clock) options.clock = clock
  const boss = new PgBoss({
    connectionString: config.connectionString,
    schema: config.schema,
    ...options
  })
  boss.on('error', err => write({ event: 'error', message: describe(err) }))
  boss.on('warning', warning => write({ event: 'warning', message: warning.message, data: warning.data }))
  boss.on('bam', event => write({ event: 'bam', data: event }))
  boss.on('stopped', () => write({ event: 'stopped' }))

  const special = {
    async work (name, options, behaviour) {
      return boss.work(name, options || {}, handler(name, behaviour || {}))
    },
    async stop (options) {
      await boss.stop({ graceful: true, timeout: 5000, ...(options || {}) })
      return true
    },
    async ping () {
      return true
    },
    async clockSetTime (date) {
      await clock.setTime(date)
      return new Date(clock.now()).toISOString()
    },
    async clockTick (ms) {
      await clock.tick(ms)
      return new Date(clock.now()).toISOString()
    },
    async clockNow () {
      return new Date(clock.now()).toISOString()
    }
  }

  if (config.start !== false) {
    try {
      await boss.start()
    } catch (err) {
      write({ fatal: describe(err) })
      process.exit(1)
    }
  }
  write({ ready: true })

  const lines = readline.createInterface({ input: process.stdin })
  lines.on('line', async line => {
    if (!line.trim()) return
    const request = JSON.parse(line)
    try {
      const fn = special[request.method] || boss[request.method]
      if (typeof fn !== 'function') throw new Error(`no method ${request.method}`)
      const result = await fn.apply(special[request.method] ? special : boss, revive(request.args || []))
      write({ id: request.id, result: result === undefined ? null : result })
    } catch (err) {
      write({ id: request.id, error: describe(err) })
    }
  })
  lines.on('close', async () => {
    try {
      await boss.stop({ graceful: true, timeout: 5000 })
    } catch {
      // already stopped
    }
    process.exit(0)
  })
}

const [command, ...args] = process.argv.slice(2)
if (command === 'plan' && args.length === 1) {
  process.stdout.write(getConstructionPlans(args[0]))
} else if (command === 'migration-plan' && args.length === 2) {
  process.stdout.write(getMigrationPlans(args[0], Number(args[1])))
} else if (command === 'rollback-plan' && args.length === 2) {
  for (let version = 46; version > Number(args[1]); version--) {
    process.stdout.write(getRollbackPlans(args[0], version) + '\n')
  }
} else if (command === 'rpc' && args.length === 1) {
  await rpc(JSON.parse(args[0] === '-' ? await firstLine() : args[0]))
} else {
  console.error('usage: node boss.mjs plan SCHEMA | migration-plan SCHEMA VERSION | rollback-plan SCHEMA VERSION | rpc CONFIG_JSON')
  process.exit(2)
}
