// The line protocol every Node peer of the bench speaks (pgboss.mjs, pgboss11.mjs): one JSON
// object per line on stdout ({"ready": true} first, or {"fatal": ...}), one command per line on
// stdin, each answered before the next is read; closing stdin stops the peer.
import readline from 'node:readline'

export function write (message) {
  process.stdout.write(JSON.stringify(message) + '\n')
}

export function describe (err) {
  return (err && (err.stack || err.message)) || String(err)
}

// Answers each command line with `commands[cmd](request)` (or {"error": ...}) until stdin
// closes, then stops `boss` and exits.
export async function serve (boss, commands) {
  write({ ready: true })
  const lines = readline.createInterface({ input: process.stdin })
  for await (const line of lines) {
    if (!line.trim()) continue
    const request = JSON.parse(line)
    try {
      const fn = commands[request.cmd]
      if (!fn) throw new Error(`no command ${request.cmd}`)
      write(await fn(request))
    } catch (err) {
      write({ error: describe(err) })
    }
  }
  await boss.stop({ graceful: true, timeout: 5000 })
  process.exit(0)
}
