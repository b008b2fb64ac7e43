// Append-only audit log: one JSON line per record an instance accepted.
//
// The file is opened synchronously (a bad AUDIT_LOG fails at start, not on the
// first record) and written through one fs.WriteStream, which batches the
// lines of concurrent records. write() resolves once its line has been handed
// to the file system; close() ends the stream and resolves once every pending
// line has been written and the file is closed.

import { mkdirSync, openSync, createWriteStream } from 'node:fs'
import { dirname } from 'node:path'

/**
 * @param {string} path the JSON-lines file (its directory is created)
 * @returns {{path: string, write(entry: object): Promise<void>, close(): Promise<void>}}
 */
export function createAuditLog (path) {
  mkdirSync(dirname(path), { recursive: true })
  const fd = openSync(path, 'a')
  const stream = createWriteStream(null, { fd, flags: 'a' })
  let failure = null
  let closing = null
  stream.on('error', (err) => { failure = err })

  return {
    path,
    write (entry) {
      if (failure) return Promise.reject(failure)
      if (closing) return Promise.reject(new Error(`audit log ${path} is closed`))
      const line = JSON.stringify(entry) + '\n'
      return new Promise((resolve, reject) => {
        stream.write(line, (err) => (err ? reject(err) : resolve()))
      })
    },
    close () {
      if (!closing) {
        closing = new Promise((resolve) => {
          if (stream.destroyed) { resolve(); return }
          stream.once('close', resolve)
          stream.end()
        })
      }
      return closing
    }
  }
}
