// Append-only audit log: one JSON line per record an instance accepted, hash-chained.
//
// Chain: every line ends with "prev", the SHA-256 (hex) of the bytes of the line before it
// in this file (without its newline); the first line of a file carries GENESIS. A verifier
// (python -m complyroute audit) recomputes each link, so a line edited, removed or inserted
// anywhere but at the end breaks the chain at the line after it. The field is appended to
// the entry's JSON as text, and the line is hashed as written: no canonical form to agree
// on, the verifier hashes the bytes it reads. An instance that restarts on an existing file
// goes on from its last line.
//
// Group commit: the lines of the records accepted in one turn of the event loop are
// written together, by one write(2) at the end of that turn (setImmediate), and each of
// those records waits for that write. So under load one system call carries many lines,
// and still no record is sent on or answered before its line is in the file: handed to
// the kernel, where it survives a crash of the process (not of the machine: there is no
// fsync, as before). A failed write fails every record of its batch and every later one
// (they are answered 500 AUDIT_FAILED, not sent on): no line is lost silently, and the
// chain never skips a line that did not reach the file.
//
// The write is synchronous: an append to the page cache costs microseconds, less than a
// round trip through libuv's thread pool. The file is opened synchronously too, so a bad
// AUDIT_LOG fails at start, not on the first record.

import { createHash } from 'node:crypto'
import { closeSync, fstatSync, mkdirSync, openSync, readSync, writeSync } from 'node:fs'
import { dirname } from 'node:path'

/** The "prev" of a file's first line. */
export const GENESIS = '0'.repeat(64)

export function sha256Hex (text) {
  return createHash('sha256').update(text).digest('hex')
}

const NEWLINE = 0x0a
const TAIL_CHUNK = 64 * 1024

/**
 * The link the next line of an existing file carries: the hash of its last line, or
 * GENESIS when it is empty. `endsInNewline` is false when a crash left a partial line:
 * the next batch then starts on a line of its own.
 */
function tail (fd) {
  const size = fstatSync(fd).size
  if (size === 0) return { prev: GENESIS, endsInNewline: true }
  const chunks = []
  let end = size
  let start = size
  for (;;) {
    start = Math.max(0, end - TAIL_CHUNK)
    const chunk = Buffer.alloc(end - start)
    readSync(fd, chunk, 0, chunk.length, start)
    chunks.unshift(chunk)
    const text = Buffer.concat(chunks)
    const endsInNewline = text[text.length - 1] === NEWLINE
    const lastLineEnd = endsInNewline ? text.length - 1 : text.length
    const newline = text.lastIndexOf(NEWLINE, lastLineEnd - 1)
    if (newline !== -1 || start === 0) {
      return { prev: sha256Hex(text.subarray(newline + 1, lastLineEnd)), endsInNewline }
    }
    end = start
  }
}

/**
 * @param {string} path the JSON-lines file (its directory is created)
 * @returns {{path: string, write(entry: object): Promise<void>, close(): Promise<void>}}
 */
export function createAuditLog (path) {
  mkdirSync(dirname(path), { recursive: true })
  let fd = openSync(path, 'a+')
  const last = tail(fd)
  let prev = last.prev
  let pending = last.endsInNewline ? '' : '\n'
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
    /** Append `entry` (a non-empty object; "prev" is added) to the next batch. */
    write (entry) {
      if (failure) return Promise.reject(failure)
      if (fd === null) return Promise.reject(new Error(`audit log ${path} is closed`))
      const json = JSON.stringify(entry)
      const line = `${json.slice(0, -1)},"prev":"${prev}"}`
      prev = sha256Hex(line)
      if (batch) {
        batch.text += line + '\n'
      } else {
        batch = { text: pending + line + '\n' }
        pending = ''
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
