'use strict'
// One Node pg-boss 11.1.2 instance, driven by the Python interop tests.
//
// Usage: node rpc.js '<config JSON>'
//        node rpc.js -        (the config is the first line of stdin: a process started ahead
//                              of need, with pg-boss already loaded, waits for it)
//   config: { connectionString, schema, options: {...PgBoss constructor options}, start: true }
//
// Protocol (one JSON object per line):
//   stdout, first line: {"ready": true} once start() resolved, or {"fatal": message} and exit 1
//   stdin:  {"id": 1, "method": "send", "args": ["queue", {"a": 1}, {"priority": 3}]}
//   stdout: {"id": 1, "result": ...} or {"id": 1, "error": message}
//   stdout, unprompted: {"event": "error" | "warning" | "job" | "stopped", ...}
// Arguments of the form {"$date": "<ISO-8601>"} become Date objects.
// Closing stdin stops the instance gracefully and ends the process.

const readline = require('node:readline')
const PgBoss = require('pg-boss')
const { firstLine } = require('./stdin')

function write (message) {
  process.stdout.write(JSON.stringify(message) + '\n')
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

function describe (err) {
  return (err && (err.stack || err.message)) || String(err)
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

let boss

function open (config) {
  boss = new PgBoss({
    connectionString: config.connectionString,
    schema: config.schema,
    ...revive(config.options || {})
  })
  boss.on('error', err => write({ event: 'error', message: describe(err), queue: err && err.queue }))
  boss.on('warning', warning => write({ event: 'warning', message: warning.message }))
  boss.on('stopped', () => write({ event: 'stopped' }))
}

// A test handler: reports every job it is given as a "job" event, then fails the
// batch if the behaviour (or the job's data) asks for it, else returns an output.
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

const special = {
  async work (name, options, behaviour) {
    return boss.work(name, options || {}, handler(name, behaviour || {}))
  },
  async stop (options) {
    await boss.stop({ graceful: true, timeout: 5000, ...(options || {}) })
    return true
  },
  async ping () {
    return 'pong'
  },
  async constructionPlans (schema) {
    return PgBoss.getConstructionPlans(schema)
  }
}

async function call (method, args) {
  if (Object.hasOwn(special, method)) return special[method](...args)
  if (typeof boss[method] !== 'function') throw new Error(`no such method: ${method}`)
  return boss[method](...args)
}

async function main () {
  const argument = process.argv[2] || '{}'
  const config = JSON.parse(argument === '-' ? await firstLine() : argument)
  open(config)
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
  const pending = new Set()
  lines.on('line', line => {
    if (!line.trim()) return
    const { id, method, args } = JSON.parse(line)
    const task = call(method, revive(args || []))
      .then(result => write({ id, result: result === undefined ? null : result }))
      .catch(err => write({ id, error: describe(err) }))
    pending.add(task)
    task.finally(() => pending.delete(task))
  })
  lines.on('close', async () => {
    await Promise.allSettled([...pending])
    try {
      await boss.stop({ graceful: true, timeout: 5000 })
    } catch (err) {
      write({ event: 'error', message: describe(err) })
    }
    process.exit(0)
  })
}

main()
