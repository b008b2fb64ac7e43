// The audit log (src/audit.js), on a temporary file.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { GENESIS, createAuditLog } from '../src/audit.js'

// A file's lines as written, and the entries without their chain link.
function fileLines (file) {
  const lines = readFileSync(file, 'utf8').split('\n')
  assert.equal(lines.pop(), '') // every line ends with a newline
  return lines
}

function entries (file) {
  return fileLines(file).map((line) => {
    const { prev, ...entry } = JSON.parse(line)
    return entry
  })
}

// Recomputes every link, as the verifier (complyroute/evidence/audit.py) does: the index of the
// first line whose prev is not the hash of the line before it (GENESIS for the first), or -1.
function firstBrokenLink (lines) {
  let expected = GENESIS
  for (const [index, line] of lines.entries()) {
    if (JSON.parse(line).prev !== expected) return index
    expected = createHash('sha256').update(line).digest('hex')
  }
  return -1
}

function tempDir (t) {
  const dir = mkdtempSync(join(tmpdir(), 'complyroute-test-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

test('audit log: lines are appended as JSON and flushed by close()', async (t) => {
  const file = join(tempDir(t), 'nested', 'dir', 'a.jsonl')
  const first = createAuditLog(file)
  await Promise.all([first.write({ n: 1 }), first.write({ n: 2 })])
  await first.close()
  await first.close() // idempotent
  const second = createAuditLog(file) // appends, never truncates
  second.write({ n: 3 }) // not awaited: close() still flushes it
  await second.close()
  assert.deepEqual(entries(file), [{ n: 1 }, { n: 2 }, { n: 3 }])
  assert.equal(firstBrokenLink(fileLines(file)), -1) // the second log went on from the first's last line
})

test('audit log: each line carries the SHA-256 of the line before it, the first the genesis', async (t) => {
  const file = join(tempDir(t), 'chain.jsonl')
  const audit = createAuditLog(file)
  await Promise.all([audit.write({ n: 1 }), audit.write({ n: 2 })]) // one batch
  await audit.write({ n: 3 }) // the next
  await audit.close()
  const lines = fileLines(file)
  assert.equal(JSON.parse(lines[0]).prev, GENESIS)
  assert.equal(JSON.parse(lines[2]).prev, createHash('sha256').update(lines[1]).digest('hex'))
  assert.ok(lines.every((line) => line.endsWith(`,"prev":"${JSON.parse(line).prev}"}`)), 'prev is the last field, appended as written')
  assert.equal(firstBrokenLink(lines), -1)
})

test('audit log refused twin: an edited, a removed or an inserted line breaks the chain at the line after it', async (t) => {
  const file = join(tempDir(t), 'chain.jsonl')
  const audit = createAuditLog(file)
  for (let n = 0; n < 4; n++) await audit.write({ n })
  await audit.close()
  const lines = fileLines(file)
  assert.equal(firstBrokenLink(lines.with(1, lines[1].replace('"n":1', '"n":7'))), 2)
  assert.equal(firstBrokenLink(lines.toSpliced(1, 1)), 1)
  assert.equal(firstBrokenLink(lines.toSpliced(2, 0, lines[0])), 2)
})

test('audit log: a restart goes on from the last line of the file; a partial last line gets a line of its own', async (t) => {
  const dir = tempDir(t)
  const file = join(dir, 'restart.jsonl')
  writeFileSync(file, '')
  const first = createAuditLog(file) // an empty file starts at the genesis
  await first.write({ n: 1 })
  await first.close()
  appendFileSync(file, '{"n":2,"prev":"cut') // a crash in the middle of a write
  const second = createAuditLog(file)
  await second.write({ n: 3 })
  await second.close()
  const lines = fileLines(file)
  assert.equal(lines.length, 3)
  assert.equal(JSON.parse(lines[0]).prev, GENESIS)
  assert.equal(lines[1], '{"n":2,"prev":"cut')
  assert.equal(JSON.parse(lines[2]).prev, createHash('sha256').update(lines[1]).digest('hex'))
})

test('audit log: a last line longer than one read of the tail is hashed whole', async (t) => {
  const file = join(tempDir(t), 'long.jsonl')
  const long = JSON.stringify({ n: 1, pad: 'x'.repeat(150 * 1024) })
  writeFileSync(file, `{"n":0}\n${long}\n`)
  const audit = createAuditLog(file)
  await audit.write({ n: 2 })
  await audit.close()
  assert.equal(JSON.parse(fileLines(file)[2]).prev, createHash('sha256').update(long).digest('hex'))
})

test('audit log: an unwritable path fails at creation, a write after close is refused', async (t) => {
  const dir = tempDir(t)
  assert.throws(() => createAuditLog(dir), /EISDIR/)
  const audit = createAuditLog(join(dir, 'b.jsonl'))
  await audit.close()
  await assert.rejects(audit.write({ n: 1 }), /closed/)
})

test('audit log: the lines of one turn go in one write, each record waits until its line is in the file', async (t) => {
  const file = join(tempDir(t), 'c.jsonl')
  const audit = createAuditLog(file)
  t.after(() => audit.close())
  const linesInFile = () => readFileSync(file, 'utf8').split('\n').length - 1
  const seenWhenResolved = []
  const sameTurn = Array.from({ length: 50 }, (_, n) => audit.write({ n }).then(() => seenWhenResolved.push(linesInFile())))
  assert.equal(linesInFile(), 0) // nothing written yet, nothing resolved
  await Promise.all(sameTurn)
  assert.deepEqual(seenWhenResolved, Array(50).fill(50)) // all written together, before any resolved
  await audit.write({ n: 50 }) // a later turn: a batch of its own
  assert.deepEqual(entries(file), Array.from({ length: 51 }, (_, n) => ({ n })))
  assert.equal(firstBrokenLink(fileLines(file)), -1)
})

test('audit log refused twin: a failed write fails its batch and every later write', { skip: !existsSync('/dev/full') && 'no /dev/full' }, async () => {
  const audit = createAuditLog('/dev/full') // every write fails with ENOSPC
  const batch = [audit.write({ n: 1 }), audit.write({ n: 2 })]
  for (const written of batch) await assert.rejects(written, /ENOSPC/)
  await assert.rejects(audit.write({ n: 3 }), /ENOSPC/)
  await audit.close()
})
