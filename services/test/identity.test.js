// Identities under mutual TLS (src/identity.js): certificates' SPIFFE ids and the peers each route admits.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { certificateIdentity, checkServerIdentityFor, isSpiffeId, peerAllowed, peerIdentity, uriSans } from '../src/identity.js'

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
