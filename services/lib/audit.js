// Append-only audit log: one JSON line per record an instance accepted.
//
// Group commit: the lines of the records accepted in one turn of the event loop are
// written together, by one write(2) at the end of that turn (setImmediate), and each of
// those records waits for that write. So under load one system call carries many lines,
// and still no record is sent on or answered before its line is in the file: handed to
// the kernel, where it survives a crash of the process (not of the machine: there is no
// fsync, as before). A failed write fails every record of its batch and every later one
// (they are answered 500 AUDIT_FAILED, not sent on): no line is lost silently.
//
// The write is synchronous: an append to the page cache costs microseconds, less than a
// round trip through libuv's thread pool. The file is opened synchronously too, so a bad
// AUDIT_LOG fails at start, not on the first record.

import { closeSync, mkdirSync, openSync, writeSync } from 'node:fs'
import { dirname } from 'node:path'

/**
 * @param {string} path the JSON-lines file (its directory is created)
 * @returns {{path: string, write(entry: object): Promise<void>, close(): Promise<void>}}
 */
export function createAuditLog (path) {
  mkdirSync(dirname(path), { recursive: true })
  let fd = openSync(path, 'a')
  let failure = null
  let batch = null // {text, written: Promise, resolve, reject, immediate}

  function flush () {
    const { text, resolve, reject } = batch
    batch = null
    try {
      const bytes = Buffer.from(text)
      for (let offset = 0; offset < bytes.length;) offset += writeSync(fd, bytes, offset)
      resolve()
    } catch (err) {
      failure = err
      reject(err)
    }
  }

  return {
    path,
    write (entry) {
      if (failure) return Promise.reject(failure)
      if (fd === null) return Promise.reject(new Error(`audit log ${path} is closed`))
      const line = JSON.stringify(entry) + '\n'
      if (batch) {
        batch.text += line
      } else {
        batch = { text: line }
        batch.written = new Promise((resolve, reject) => { batch.resolve = resolve; batch.reject = reject })
        batch.immediate = setImmediate(flush)
      }
      return batch.written
    },
    async close () {
      if (fd === null) return
      if (batch) {
        clearImmediate(batch.immediate)
        flush()
      }
      closeSync(fd)
      fd = null
    }
  }
}
