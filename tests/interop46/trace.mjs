// Trace context between Node pg-boss 12.38.0 and alkstore_sa (tests/test_interop46_tracing.py).
//
//   node trace.mjs send URL SCHEMA QUEUE TRACE_ID
//       sends one job to QUEUE with openTelemetry.propagateContext, as a part of trace
//       TRACE_ID; prints {"id": the job's id, "spanId": the id of the PRODUCER span}
//   node trace.mjs work URL SCHEMA QUEUE
//       works one job of QUEUE and prints the CONSUMER span pg-boss ran its handler in:
//       {"id", "name", "kind", "parent": {"traceId", "spanId"} or null, "attributes"}
//
// No OpenTelemetry SDK is installed, only the API pg-boss depends on: a tracer provider that
// keeps what pg-boss asks of it and a propagator of the W3C traceparent stand in for one
// (pg-boss takes both as options). A span started without a parent belongs to TRACE_ID.
import { randomBytes } from 'node:crypto'
import { ROOT_CONTEXT, SpanKind, trace } from '@opentelemetry/api'
import { PgBoss } from 'pg-boss'

const [command, url, schema, queue, traceId] = process.argv.slice(2)
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/

const propagator = {
  inject (context, carrier, setter) {
    const sc = trace.getSpanContext(context)
    if (sc && trace.isSpanContextValid(sc)) {
      const flags = sc.traceFlags.toString(16).padStart(2, '0')
      setter.set(carrier, 'traceparent', `00-${sc.traceId}-${sc.spanId}-${flags}`)
    }
  },
  extract (context, carrier, getter) {
    const match = TRACEPARENT.exec(getter.get(carrier, 'traceparent') ?? '')
    if (!match) return context
    const [, tid, sid, flags] = match
    return trace.setSpanContext(context, { traceId: tid, spanId: sid, traceFlags: parseInt(flags, 16), isRemote: true })
  },
  fields () {
    return ['traceparent']
  }
}

const spans = []

function startSpan (name, options = {}, context = ROOT_CONTEXT) {
  const parent = trace.getSpanContext(context) ?? null
  const own = {
    traceId: parent ? parent.traceId : traceId,
    spanId: randomBytes(8).toString('hex'),
    traceFlags: 1
  }
  const span = {
    name,
    kind: options.kind,
    parent: parent && { traceId: parent.traceId, spanId: parent.spanId },
    attributes: { ...(options.attributes || {}) },
    spanContext: () => own,
    setAttribute (key, value) { span.attributes[key] = value; return span },
    setAttributes (values) { Object.assign(span.attributes, values); return span },
    addEvent () { return span },
    addLink () { return span },
    addLinks () { return span },
    setStatus () { return span },
    updateName () { return span },
    recordException () {},
    isRecording: () => true,
    end () {}
  }
  spans.push(span)
  return span
}

const tracerProvider = { getTracer: () => ({ startSpan }) }

const boss = new PgBoss({
  connectionString: url,
  schema,
  supervise: false,
  schedule: false,
  openTelemetry: { propagateContext: true, tracerProvider, propagator }
})
boss.on('error', err => process.stderr.write(`${err.stack || err}\n`))
await boss.start()

const show = span => ({ name: span.name, kind: span.kind, parent: span.parent, attributes: span.attributes })

if (command === 'send') {
  const id = await boss.send(queue, { from: 'node' })
  const producer = spans.find(s => s.kind === SpanKind.PRODUCER)
  process.stdout.write(JSON.stringify({ id, spanId: producer.spanContext().spanId }) + '\n')
} else if (command === 'work') {
  let done
  const worked = new Promise(resolve => { done = resolve })
  await boss.work(queue, { batchSize: 1, pollingIntervalSeconds: 0.5 }, async ([job]) => {
    done(job.id)
    return { by: 'node' }
  })
  const id = await worked
  await boss.offWork(queue, { wait: true })
  const consumer = spans.find(s => s.kind === SpanKind.CONSUMER)
  process.stdout.write(JSON.stringify({ id, ...show(consumer) }) + '\n')
} else {
  throw new Error(`unknown command ${command}`)
}
await boss.stop({ graceful: true, timeout: 5000 })
