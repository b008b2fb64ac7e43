// The audit log (on a temporary file) and the forwarder (on undici's
// MockAgent: no socket is opened).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { MockAgent } from 'undici'
import { GENESIS, createAuditLog } from '../lib/audit.js'
import { ForwardError, createForwarder } from '../lib/forwarder.js'
import { RecentIds } from '../lib/recent-ids.js'
import { certificateIdentity, checkServerIdentityFor, isSpiffeId, peerAllowed, peerIdentity, uriSans } from '../lib/identity.js'

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

const ORIGIN = 'http://enforcement.test:12002'

// The forwarder dispatches through the agent (which hands undici's handler interface to
// its mock pool); the answers are set on the pool.
function mock (t) {
  const agent = new MockAgent()
  agent.disableNetConnect()
  t.after(() => agent.close())
  return { agent, pool: agent.get(ORIGIN) }
}

test('forwarder: POSTs the body and headers to /process and returns status and body', async (t) => {
  const { agent, pool } = mock(t)
  let seen
  pool.intercept({ path: '/process', method: 'POST' }).reply((opts) => {
    seen = opts
    return { statusCode: 451, data: '{"code":"DENIED"}' }
  })
  const forwarder = createForwarder({ egressUrl: ORIGIN, timeoutMs: 1000, dispatcher: agent })
  const answer = await forwarder.forward({ body: '{"a":1}', headers: { 'content-type': 'application/json', 'x-complyroute-step': 'store' } })
  assert.deepEqual(answer, { status: 451, body: '{"code":"DENIED"}' })
  assert.equal(seen.body, '{"a":1}')
  assert.equal(seen.headers['x-complyroute-step'], 'store')
  await forwarder.close()
})

test('forwarder: connection errors, time-outs and oversized answers are ForwardErrors', async (t) => {
  const { agent, pool } = mock(t)
  const forwarder = createForwarder({ egressUrl: ORIGIN, timeoutMs: 50, maxAnswerBytes: 10, dispatcher: agent })
  const request = { body: '{}', headers: { 'content-type': 'application/json' } }

  pool.intercept({ path: '/process', method: 'POST' }).replyWithError(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:12002'), { code: 'ECONNREFUSED' }))
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && /ECONNREFUSED/.test(err.message))

  pool.intercept({ path: '/process', method: 'POST' }).reply(200, '{}').delay(500)
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && err.message === 'no answer within 50 ms')

  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'x'.repeat(11))
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && /larger than 10 bytes/.test(err.message))
})

test('forwarder: every exchange has its own deadline, from when it started; one past it fails, one within is answered', async (t) => {
  const { agent, pool } = mock(t)
  const forwarder = createForwarder({ egressUrl: ORIGIN, timeoutMs: 150, dispatcher: agent })
  const request = { body: '{}', headers: { 'content-type': 'application/json' } }
  const settled = (promise, started) => promise.then(
    (answer) => ({ answer, after: performance.now() - started }),
    (err) => ({ err, after: performance.now() - started })
  )
  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'late').delay(1000)
  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'in time').delay(120)
  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'late too').delay(1000)

  const first = settled(forwarder.forward(request), performance.now())
  await new Promise((resolve) => setTimeout(resolve, 100))
  // Started 100 ms later: the first one's deadline passes while they are in flight.
  const secondStart = performance.now()
  const second = settled(forwarder.forward(request), secondStart)
  const third = settled(forwarder.forward(request), secondStart)

  const [a, b, c] = await Promise.all([first, second, third])
  assert.equal(a.err?.message, 'no answer within 150 ms')
  assert.deepEqual(b.answer, { status: 200, body: 'in time' })
  assert.equal(c.err?.message, 'no answer within 150 ms')
  assert.ok(c.after >= 140, `the third expired ${c.after} ms after it started`)
})

// ---------------------------------------------------------------- identities

const POINT = 'spiffe://complyroute/point/central-entity'
const CONTROL = 'spiffe://complyroute/control'
const SERVICE = 'spiffe://complyroute/service/svc-01'

test('uriSans reads the URI entries as Node prints them, a JSON-quoted value as one entry', () => {
  assert.deepEqual(uriSans(`URI:${POINT}`), [POINT])
  assert.deepEqual(uriSans(`DNS:a.test, URI:${POINT}, IP Address:127.0.0.1, URI:${CONTROL}`), [POINT, CONTROL])
  assert.deepEqual(uriSans(undefined), [])
  assert.deepEqual(uriSans('DNS:a.test'), [])
  // Node quotes a value holding a comma (CVE-2021-44532): it stays one value, not two entries.
  assert.deepEqual(uriSans(`URI:"x\\u002c URI:${POINT}\\u002c DNS:y", DNS:host.test`), [`x, URI:${POINT}, DNS:y`])
  assert.deepEqual(uriSans(`URI:"a\\"b", URI:${POINT}`), ['a"b', POINT])
  // Not in that form: no URIs at all rather than a guess.
  assert.equal(uriSans('URI'), null)
  assert.equal(uriSans(`URI:"${POINT}`), null)
  assert.equal(uriSans(`URI:"a"b, URI:${POINT}`), null)
})

test('a certificate\'s identity is its one URI SAN when that is a SPIFFE id; none, two or another URI is no identity', () => {
  assert.equal(certificateIdentity(`URI:${SERVICE}`), SERVICE)
  assert.equal(certificateIdentity(`DNS:svc.test, URI:${SERVICE}`), SERVICE)
  assert.equal(certificateIdentity('DNS:svc.test'), null)
  assert.equal(certificateIdentity(`URI:${SERVICE}, URI:${POINT}`), null)
  assert.equal(certificateIdentity('URI:https://complyroute/service/svc-01'), null)
  assert.equal(certificateIdentity(undefined), null)
  assert.ok(isSpiffeId(CONTROL))
  assert.ok(!isSpiffeId(`${CONTROL}/`))
})

test('peerAllowed: records from RECORD_PEERS, health and stats to CONTROL_PEERS; each refused twin', () => {
  const config = { recordPeers: [POINT], controlPeers: [CONTROL] }
  const STRANGER = 'spiffe://complyroute/service/svc-99'
  assert.equal(peerAllowed(config, 'POST', '/process', POINT), true)
  assert.equal(peerAllowed(config, 'POST', '/process', CONTROL), false)
  assert.equal(peerAllowed(config, 'POST', '/process', STRANGER), false)
  assert.equal(peerAllowed(config, 'POST', '/process', null), false)
  for (const url of ['/health', '/stats']) {
    for (const method of ['GET', 'HEAD']) {
      assert.equal(peerAllowed(config, method, url, CONTROL), true, `${method} ${url}`)
      assert.equal(peerAllowed(config, method, url, POINT), false, `${method} ${url}`)
      assert.equal(peerAllowed(config, method, url, STRANGER), false, `${method} ${url}`)
    }
  }
  // Any other route (answered 404): a known peer may ask, a stranger may not.
  for (const [method, url] of [['GET', '/process'], ['DELETE', '/health'], ['GET', '/nope']]) {
    assert.equal(peerAllowed(config, method, url, POINT), true, `${method} ${url}`)
    assert.equal(peerAllowed(config, method, url, CONTROL), true, `${method} ${url}`)
    assert.equal(peerAllowed(config, method, url, STRANGER), false, `${method} ${url}`)
    assert.equal(peerAllowed(config, method, url, null), false, `${method} ${url}`)
  }
  // No CONTROL_PEERS: nobody reads health and stats.
  assert.equal(peerAllowed({ recordPeers: [POINT], controlPeers: [] }, 'GET', '/health', CONTROL), false)
})

test('peerIdentity is read once per connection from a verified certificate; none without one', () => {
  let reads = 0
  const socket = { authorized: true, getPeerCertificate () { reads++; return { subjectaltname: `URI:${POINT}` } } }
  assert.equal(peerIdentity(socket), POINT)
  assert.equal(peerIdentity(socket), POINT)
  assert.equal(reads, 1)
  const unverified = { authorized: false, getPeerCertificate: () => ({ subjectaltname: `URI:${POINT}` }) }
  assert.equal(peerIdentity(unverified), null)
  const noCertificate = { authorized: true, getPeerCertificate: () => ({}) }
  assert.equal(peerIdentity(noCertificate), null)
  assert.equal(peerIdentity({}), null) // not TLS (app.inject's socket)
})

test('checkServerIdentityFor accepts the expected URI SAN only', () => {
  const check = checkServerIdentityFor(POINT)
  assert.equal(check('127.0.0.1', { subjectaltname: `URI:${POINT}` }), undefined)
  assert.equal(check('127.0.0.1', { subjectaltname: `DNS:a.test, URI:${POINT}` }), undefined)
  const other = check('127.0.0.1', { subjectaltname: `URI:${SERVICE}` })
  assert.ok(other instanceof Error)
  assert.equal(other.message, `next hop presented URI:${SERVICE}, expected URI:${POINT}`)
  assert.equal(check('127.0.0.1', { subjectaltname: 'DNS:a.test' }).message, `next hop presented no URI SAN, expected URI:${POINT}`)
  assert.ok(check('127.0.0.1', {}) instanceof Error)
  assert.ok(check('127.0.0.1', { subjectaltname: `URI:${POINT}x` }) instanceof Error)
  assert.ok(check('127.0.0.1', { subjectaltname: `URI:"x\\u002c URI:${POINT}"` }) instanceof Error)
})

test('forwarder: mutual TLS needs an https egress URL and the identity to expect', () => {
  const tls = { cert: 'cert', key: 'key', ca: 'ca' }
  assert.throws(() => createForwarder({ egressUrl: 'http://127.0.0.1:1', timeoutMs: 1000, tls, egressIdentity: POINT }), /needs an https egress URL/)
  assert.throws(() => createForwarder({ egressUrl: 'https://127.0.0.1:1', timeoutMs: 1000, tls }), /needs the identity/)
})

// ---------------------------------------------------------------- recent ids

test('RecentIds remembers the last ids added and forgets the oldest first', () => {
  const ids = new RecentIds(3)
  for (const id of ['a', 'b', 'c']) ids.add(id)
  assert.deepEqual(['a', 'b', 'c', 'd'].map((id) => ids.has(id)), [true, true, true, false])
  ids.add('d') // full: 'a' goes
  assert.deepEqual(['a', 'b', 'c', 'd'].map((id) => ids.has(id)), [false, true, true, true])
  ids.add('e')
  ids.add('f')
  ids.add('g') // around the ring again: 'd' goes
  assert.deepEqual(['c', 'd', 'e', 'f', 'g'].map((id) => ids.has(id)), [false, false, true, true, true])
  assert.equal(ids.size, 3)
  assert.throws(() => new RecentIds(0), RangeError)
})
