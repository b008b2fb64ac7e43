// server.js is imported, never run. The mutual TLS tests start instances with start() on
// 127.0.0.1 (port 0) with certificates made by openssl, and talk to them over real TLS.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Client } from 'undici'
import * as config from '../config.js'
import * as server from '../server.js'
import { LABELS_ENV, SHIPPED_LABELS } from '../test-support/labels.js'
import { NO_OPENSSL, testPki, tlsClient, tlsEnv } from '../test-support/pki.js'

test('server.js reuses config.js\'s parser (one parser, no duplicate)', () => {
  assert.equal(server.parseConfig, config.parseConfig)
})

test('start() refuses an invalid environment before opening anything', async () => {
  await assert.rejects(
    server.start({ INSTANCE_ID: 'a', STEP: 'a', REGION: 'EU', NODE: 'n', ...LABELS_ENV, NEXT_STEP: 'b' }),
    (err) => err instanceof config.ConfigError && err.variable === 'EGRESS_URL'
  )
  await assert.rejects(server.start({}), (err) => err instanceof config.ConfigError && err.variable === 'INSTANCE_ID')
  await assert.rejects(
    server.start({ INSTANCE_ID: 'a', STEP: 'a', REGION: 'EU', NODE: 'n', COMPLYROUTE_LABELS: '[]' }),
    (err) => err instanceof config.ConfigError && err.variable === 'COMPLYROUTE_LABELS'
  )
})

function fakeFastify (closeResult) {
  const calls = { close: 0, logs: [] }
  const log = (level) => (obj, msg) => calls.logs.push([level, msg])
  return {
    calls,
    log: { info: log('info'), error: log('error') },
    close () {
      calls.close++
      return closeResult
    }
  }
}

test('the first signal closes gracefully and exits 0', async () => {
  const fastify = fakeFastify(Promise.resolve())
  const exits = []
  const onSignal = server.handleSignals(fastify, { exit: (code) => exits.push(code) })
  try {
    onSignal('SIGTERM')
    await new Promise((resolve) => setImmediate(resolve))
    assert.equal(fastify.calls.close, 1)
    assert.deepEqual(exits, [0])
  } finally {
    process.removeListener('SIGTERM', onSignal)
    process.removeListener('SIGINT', onSignal)
  }
})

test('a second signal while closing, or a failed close, exits 1', async () => {
  const fastify = fakeFastify(new Promise(() => {}))
  const exits = []
  const onSignal = server.handleSignals(fastify, { exit: (code) => exits.push(code) })
  try {
    onSignal('SIGTERM')
    onSignal('SIGINT')
    assert.equal(fastify.calls.close, 1)
    assert.deepEqual(exits, [1])
  } finally {
    process.removeListener('SIGTERM', onSignal)
    process.removeListener('SIGINT', onSignal)
  }

  const failing = fakeFastify(Promise.reject(new Error('boom')))
  const exits2 = []
  const onSignal2 = server.handleSignals(failing, { exit: (code) => exits2.push(code) })
  try {
    onSignal2('SIGTERM')
    await new Promise((resolve) => setImmediate(resolve))
    assert.deepEqual(exits2, [1])
  } finally {
    process.removeListener('SIGTERM', onSignal2)
    process.removeListener('SIGINT', onSignal2)
  }
})

// ---------------------------------------------------------------- mutual TLS

const POINT = 'spiffe://complyroute/point/central-entity'
const CONTROL = 'spiffe://complyroute/control'
const MONITORING = 'spiffe://complyroute/monitoring'
const id = (name) => `spiffe://complyroute/service/${name}`
const LABELS = { 'content-type': 'application/json', 'x-data-region': 'EU', 'x-data-category': 'personal' }

/** An instance listening on HTTPS; its audit lines are collected in `lines`. */
async function startService (t, credential, env) {
  const lines = []
  const fastify = await server.start({
    INSTANCE_ID: credential.identity.split('/').pop(),
    STEP: 'step',
    REGION: 'EU',
    NODE: 'node-1',
    PORT: '0',
    WORK_ITERATIONS: '1',
    LOG_LEVEL: 'silent',
    ...LABELS_ENV,
    ...tlsEnv(credential),
    ...env
  }, { audit: { async write (entry) { lines.push(entry) } }, logger: false })
  t.after(() => fastify.close())
  return { origin: `https://127.0.0.1:${fastify.server.address().port}`, lines }
}

/** One request on a new connection presenting `connect` (tlsClient(credential), or less). */
async function call (origin, connect, { method = 'GET', path, headers, body } = {}) {
  const client = new Client(origin, { connect })
  try {
    const res = await client.request({ method, path, headers, body })
    const text = await res.body.text()
    const json = (res.headers['content-type'] ?? '').startsWith('application/json')
    return { status: res.statusCode, body: text === '' ? null : json ? JSON.parse(text) : text }
  } finally {
    await client.close().catch(() => {})
  }
}

test('mutual TLS: each route answers its allowed peer; another peer gets 403 PEER_NOT_ALLOWED, a client without a certificate of the CA no answer', { skip: NO_OPENSSL }, async (t) => {
  const pki = testPki(t)
  const own = pki.issue('svc-01', id('svc-01'))
  const point = tlsClient(pki.issue('point', POINT))
  const control = tlsClient(pki.issue('control', CONTROL))
  const monitoring = tlsClient(pki.issue('monitoring', MONITORING))
  const stranger = tlsClient(pki.issue('svc-99', id('svc-99')))
  const { origin, lines } = await startService(t, own, { RECORD_PEERS: POINT, CONTROL_PEERS: CONTROL, MONITORING_PEERS: MONITORING })
  const record = { method: 'POST', path: '/process', headers: LABELS, body: '{"subject":"alice"}' }

  const accepted = await call(origin, point, record)
  assert.equal(accepted.status, 200)
  assert.equal(accepted.body.path[0].instance, 'svc-01')
  for (const [peer, name] of [[stranger, id('svc-99')], [control, CONTROL]]) {
    const refused = await call(origin, peer, record)
    assert.equal(refused.status, 403, name)
    assert.deepEqual(refused.body, {
      code: 'PEER_NOT_ALLOWED',
      message: `this service takes records only from the enforcement point that decides hops into it (peer ${name})`,
      request_id: refused.body.request_id
    })
  }

  for (const path of ['/health', '/stats']) {
    assert.equal((await call(origin, control, { path })).status, 200, path)
    assert.equal((await call(origin, point, { path })).body.code, 'PEER_NOT_ALLOWED', path)
    assert.equal((await call(origin, stranger, { path })).body.code, 'PEER_NOT_ALLOWED', path)
  }
  assert.equal((await call(origin, control, { method: 'HEAD', path: '/health' })).status, 200)
  assert.equal((await call(origin, point, { method: 'HEAD', path: '/health' })).status, 403)
  assert.equal((await call(origin, point, { path: '/nope' })).body.code, 'NOT_FOUND')
  assert.equal((await call(origin, stranger, { path: '/nope' })).body.code, 'PEER_NOT_ALLOWED')

  // No certificate, or one of another CA naming an allowed peer: the handshake fails.
  const { ca } = point
  await assert.rejects(call(origin, { ca, checkServerIdentity: () => undefined }, record))
  const foreign = testPki(t, 'foreign-ca').issue('point', POINT)
  await assert.rejects(call(origin, { ...tlsClient(foreign), ca }, record))
  // TLS 1.3 only: an allowed peer offering at most TLS 1.2 is refused in the handshake too.
  await assert.rejects(call(origin, { ...point, maxVersion: 'TLSv1.2' }, record))

  // The refused records were received and rejected, not audited.
  const stats = (await call(origin, control, { path: '/stats' })).body
  assert.equal(stats.received, 3)
  assert.equal(stats.answered, 1)
  assert.equal(stats.rejected, 2)
  assert.equal(lines.length, 1)

  // GET /metrics is the scraper's only: it sends no record and reads nothing else.
  assert.equal((await call(origin, monitoring, record)).body.code, 'PEER_NOT_ALLOWED')
  assert.equal((await call(origin, monitoring, { path: '/stats' })).body.code, 'PEER_NOT_ALLOWED')
  for (const peer of [control, point, stranger]) assert.equal((await call(origin, peer, { path: '/metrics' })).body.code, 'PEER_NOT_ALLOWED')
  const scraped = await call(origin, monitoring, { path: '/metrics' })
  assert.equal(scraped.status, 200)
  const series = (name) => Number(scraped.body.match(new RegExp(`^${name} (\\S+)$`, 'm'))?.[1])
  assert.equal(series('complyroute_records_received_total\\{instance="svc-01",step="[a-z]+"\\}'), 4)
  assert.equal(series('complyroute_records_refused_total\\{code="PEER_NOT_ALLOWED",instance="svc-01",step="[a-z]+"\\}'), 3)
  assert.equal(series('complyroute_audit_write_seconds_count\\{instance="svc-01",step="[a-z]+"\\}'), 1)
})

test('mutual TLS chain: a step sends on only to a next hop presenting EGRESS_IDENTITY, which takes it only from its RECORD_PEERS', { skip: NO_OPENSSL }, async (t) => {
  const pki = testPki(t)
  const point = tlsClient(pki.issue('point', POINT))
  const last = await startService(t, pki.issue('svc-02', id('svc-02')), { RECORD_PEERS: id('svc-01') })
  const middle = (credential, egressIdentity) => startService(t, credential, {
    RECORD_PEERS: POINT, NEXT_STEP: 'store', EGRESS_URL: last.origin, EGRESS_IDENTITY: egressIdentity
  })
  const record = { method: 'POST', path: '/process', headers: { ...LABELS, 'x-request-id': 'r-1' }, body: '{"subject":"alice"}' }

  const sender = await middle(pki.issue('svc-01', id('svc-01')), id('svc-02'))
  const delivered = await call(sender.origin, point, record)
  assert.equal(delivered.status, 200)
  assert.deepEqual(delivered.body.path.map((entry) => entry.instance), ['svc-01', 'svc-02'])
  assert.equal(last.lines.length, 1)

  // The next hop is not the one expected: nothing is sent to it.
  const misdirected = await middle(pki.issue('svc-01b', id('svc-01')), id('svc-03'))
  const failed = await call(misdirected.origin, point, record)
  assert.equal(failed.status, 502)
  assert.deepEqual(failed.body, {
    code: 'NEXT_HOP_FAILED',
    message: `next hop failed: next hop presented URI:${id('svc-02')}, expected URI:${id('svc-03')}`,
    request_id: 'r-1'
  })
  // The sender is not one the next hop takes records from: its refusal is relayed.
  const unlisted = await middle(pki.issue('svc-04', id('svc-04')), id('svc-02'))
  const refused = await call(unlisted.origin, point, record)
  assert.equal(refused.status, 403)
  assert.equal(refused.body.code, 'PEER_NOT_ALLOWED')
  assert.match(refused.body.message, /peer spiffe:\/\/complyroute\/service\/svc-04\)$/)
  assert.equal(last.lines.length, 1)
})

// ---------------------------------------------------------------- labels read again on SIGHUP

const sha256 = (text) => `sha256:${createHash('sha256').update(text).digest('hex')}`

test('SIGHUP: the instance reads COMPLYROUTE_LABELS_FILE again; a label added there is required and reported by /health', async (t) => {
  const folder = mkdtempSync(join(tmpdir(), 'labels-'))
  t.after(() => rmSync(folder, { recursive: true, force: true }))
  const file = join(folder, 'labels.json')
  const shipped = JSON.stringify(SHIPPED_LABELS)
  writeFileSync(file, shipped)
  const fastify = await server.start({ INSTANCE_ID: 'a', STEP: 'a', REGION: 'EU', NODE: 'n', PORT: '0', LOG_LEVEL: 'silent', AUDIT_LOG: join(folder, 'a.jsonl'), COMPLYROUTE_LABELS_FILE: file })
  const reload = server.handleLabelReload(fastify, { COMPLYROUTE_LABELS_FILE: file })
  t.after(() => { process.removeListener('SIGHUP', reload); return fastify.close() })
  const health = async () => (await fastify.inject({ method: 'GET', url: '/health' })).json().labels
  const record = (headers) => fastify.inject({ method: 'POST', url: '/process', headers: { 'content-type': 'application/json', ...headers }, payload: '{}' })
  const shippedHeaders = { 'x-data-category': 'personal', 'x-data-region': 'EU' }
  assert.equal(await health(), sha256(shipped))
  assert.equal((await record(shippedHeaders)).statusCode, 200)

  // Written as the control plane writes it (a rename), then the signal, as supervisord sends it.
  const added = JSON.stringify([...SHIPPED_LABELS, { name: 'sensitivity', header: 'x-data-sensitivity', required: true }])
  writeFileSync(join(folder, '.labels.json.partial'), added)
  renameSync(join(folder, '.labels.json.partial'), file)
  assert.equal(await health(), sha256(shipped)) // not before the signal
  process.kill(process.pid, 'SIGHUP')
  while (await health() !== sha256(added)) await new Promise((resolve) => setTimeout(resolve, 5))
  assert.equal((await record({ ...shippedHeaders, 'x-data-sensitivity': 'high' })).statusCode, 200)
  // Refused twin: the record that passed before lacks the label now required.
  const refused = await record(shippedHeaders)
  assert.equal(refused.statusCode, 400)
  assert.equal(refused.json().message, 'missing label header: x-data-sensitivity')
})

test('SIGHUP refused twin: a labels file that does not parse (or is gone) leaves the labels in effect', async (t) => {
  const folder = mkdtempSync(join(tmpdir(), 'labels-'))
  t.after(() => rmSync(folder, { recursive: true, force: true }))
  const file = join(folder, 'labels.json')
  writeFileSync(file, JSON.stringify(SHIPPED_LABELS))
  const fastify = await server.start({ INSTANCE_ID: 'a', STEP: 'a', REGION: 'EU', NODE: 'n', PORT: '0', LOG_LEVEL: 'silent', AUDIT_LOG: join(folder, 'a.jsonl'), COMPLYROUTE_LABELS_FILE: file })
  const logged = []
  const reload = server.handleLabelReload({ setLabels: (setting) => fastify.setLabels(setting), log: { error: (entry, message) => logged.push(message) } },
    { COMPLYROUTE_LABELS_FILE: file })
  t.after(() => { process.removeListener('SIGHUP', reload); return fastify.close() })
  const before = (await fastify.inject({ method: 'GET', url: '/health' })).json().labels
  for (const broken of ['[{"name":"sensitivity"', '[]', null]) {
    if (broken === null) rmSync(file)
    else writeFileSync(file, broken)
    reload()
    assert.equal((await fastify.inject({ method: 'GET', url: '/health' })).json().labels, before)
  }
  assert.deepEqual(logged, Array(3).fill('labels not read again: the labels in effect stay'))
})
