'use strict'
// The first line of stdin, leaving the rest of the stream to readline: how rpc.js and
// ../interop46/boss.mjs read their config when started ahead of need (`-` as argument).

exports.firstLine = function firstLine () {
  return new Promise(resolve => {
    let buffered = ''
    const onData = chunk => {
      buffered += chunk
      const at = buffered.indexOf('\n')
      if (at < 0) return
      process.stdin.off('data', onData)
      process.stdin.pause()
      if (at + 1 < buffered.length) process.stdin.unshift(buffered.slice(at + 1))
      resolve(buffered.slice(0, at))
    }
    process.stdin.setEncoding('utf8')
    process.stdin.on('data', onData)
  })
}
