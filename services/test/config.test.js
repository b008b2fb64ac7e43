import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ConfigError, DEFAULTS, parseConfig, readLabelSetting } from '../config.js'
import { LABELS_ENV, SHIPPED_LABELS } from '../test-support/labels.js'
import { NO_OPENSSL, testPki, tlsEnv } from '../test-support/pki.js'

const BASE = Object.freeze({ INSTANCE_ID: 'analyse-eu', STEP: 'analyse', REGION: 'EU', NODE: 'node-2', ...LABELS_ENV })

function refused (env, variable, pattern) {
  assert.throws(() => parseConfig(env), (err) => {
    assert.ok(err instanceof ConfigError, `expected a ConfigError, got ${err}`)
    assert.equal(err.variable, variable)
    assert.ok(err.message.startsWith(`${variable}: `), err.message)
    if (pattern) assert.match(err.message, pattern)
    return true
  })
}

test('a last step with only the required variables gets the defaults', () => {
  const config = parseConfig(BASE)
  assert.equal(config.instanceId, 'analyse-eu')
  assert.equal(config.step, 'analyse')
  assert.equal(config.region, 'EU')
  assert.equal(config.node, 'node-2')
  assert.deepEqual(config.certifications, [])
  assert.deepEqual(config.purposes, [])
  assert.equal(config.nextStep, null)
  assert.equal(config.egressUrl, null)
  assert.equal(config.host, DEFAULTS.HOST)
  assert.equal(config.port, DEFAULTS.PORT)
  assert.equal(config.auditLog, 'run/audit/analyse-eu.jsonl')
  assert.equal(config.workIterations, 100)
  assert.equal(config.egressTimeoutMs, 30000)
  assert.equal(config.logLevel, 'warn')
  assert.ok(Object.isFrozen(config))
  assert.deepEqual(config.labels, SHIPPED_LABELS)
})

test('each required variable missing or blank is refused by name', () => {
  for (const name of ['INSTANCE_ID', 'STEP', 'REGION', 'NODE', 'COMPLYROUTE_LABELS']) {
    refused({ ...BASE, [name]: undefined }, name, /is required/)
    refused({ ...BASE, [name]: '   ' }, name, /is required/)
  }
})

test('a middle step: every variable set and parsed', () => {
  const config = parseConfig({
    ...BASE,
    CERTIFICATIONS: 'health-data, iso-27001',
    PURPOSES: 'care,billing,care',
    NEXT_STEP: 'store',
    EGRESS_URL: 'http://127.0.0.1:12002/',
    HOST: '0.0.0.0',
    PORT: '10002',
    AUDIT_LOG: '/tmp/audit/analyse-eu.jsonl',
    WORK_ITERATIONS: '0',
    EGRESS_TIMEOUT_MS: '1500',
    LOG_LEVEL: 'INFO'
  })
  assert.deepEqual(config.certifications, ['health-data', 'iso-27001'])
  assert.deepEqual(config.purposes, ['care', 'billing'])
  assert.equal(config.nextStep, 'store')
  assert.equal(config.egressUrl, 'http://127.0.0.1:12002')
  assert.equal(config.host, '0.0.0.0')
  assert.equal(config.port, 10002)
  assert.equal(config.auditLog, '/tmp/audit/analyse-eu.jsonl')
  assert.equal(config.workIterations, 0)
  assert.equal(config.egressTimeoutMs, 1500)
  assert.equal(config.logLevel, 'info')
})

test('NEXT_STEP without EGRESS_URL, and EGRESS_URL without NEXT_STEP, are refused', () => {
  refused({ ...BASE, NEXT_STEP: 'store' }, 'EGRESS_URL', /required when NEXT_STEP is set/)
  refused({ ...BASE, EGRESS_URL: 'http://127.0.0.1:12002' }, 'NEXT_STEP', /EGRESS_URL is set/)
})

test('invalid values are refused by name', () => {
  const mid = { ...BASE, NEXT_STEP: 'store' }
  refused({ ...mid, EGRESS_URL: 'not a url' }, 'EGRESS_URL', /invalid URL/)
  refused({ ...mid, EGRESS_URL: 'ftp://127.0.0.1:21' }, 'EGRESS_URL', /http or https/)
  refused({ ...mid, EGRESS_URL: 'http://127.0.0.1:12002/process' }, 'EGRESS_URL', /origin only/)
  refused({ ...mid, EGRESS_URL: 'http://127.0.0.1:12002?x=1' }, 'EGRESS_URL', /origin only/)
  refused({ ...BASE, NEXT_STEP: 'store now', EGRESS_URL: 'http://127.0.0.1:1' }, 'NEXT_STEP', /invalid value/)
  refused({ ...BASE, INSTANCE_ID: 'analyse/eu' }, 'INSTANCE_ID', /invalid value/)
  refused({ ...BASE, PORT: '70000' }, 'PORT', /integer from 0 to 65535/)
  refused({ ...BASE, PORT: '80a' }, 'PORT')
  refused({ ...BASE, PORT: '-1' }, 'PORT')
  refused({ ...BASE, WORK_ITERATIONS: '1.5' }, 'WORK_ITERATIONS')
  refused({ ...BASE, WORK_ITERATIONS: '99999999' }, 'WORK_ITERATIONS')
  refused({ ...BASE, EGRESS_TIMEOUT_MS: '0' }, 'EGRESS_TIMEOUT_MS')
  refused({ ...BASE, CERTIFICATIONS: 'a,,b' }, 'CERTIFICATIONS', /invalid item ""/)
  refused({ ...BASE, PURPOSES: 'care;billing' }, 'PURPOSES', /invalid item/)
  refused({ ...BASE, HOST: 'http://x' }, 'HOST')
  refused({ ...BASE, AUDIT_LOG: 'run/audit/' }, 'AUDIT_LOG', /not a directory/)
  refused({ ...BASE, LOG_LEVEL: 'loud' }, 'LOG_LEVEL', /expected one of/)
})

// ---------------------------------------------------------------- mutual TLS and label tokens

const POINT = 'spiffe://complyroute/point/central-entity'
const CONTROL = 'spiffe://complyroute/control'
const NEXT_POINT = 'spiffe://complyroute/point/router-1'

function mtlsEnv (t) {
  const pki = testPki(t)
  const own = pki.issue('svc-01', 'spiffe://complyroute/service/svc-01')
  return { pki, own, env: { ...BASE, ...tlsEnv(own), RECORD_PEERS: POINT } }
}

test('no TLS variable: plain HTTP, no peers, no egress identity, label tokens off', () => {
  const config = parseConfig(BASE)
  assert.equal(config.tls, null)
  assert.deepEqual(config.recordPeers, [])
  assert.deepEqual(config.controlPeers, [])
  assert.equal(config.egressIdentity, null)
  assert.equal(config.labelTokens, false)
})

test('mutual TLS: the three files are read and checked, the peers and the egress identity parsed', { skip: NO_OPENSSL }, (t) => {
  const { own, env } = mtlsEnv(t)
  const config = parseConfig({
    ...env,
    RECORD_PEERS: ` ${POINT}, spiffe://complyroute/service/svc-00,${POINT}`,
    CONTROL_PEERS: CONTROL,
    NEXT_STEP: 'store',
    EGRESS_URL: 'https://127.0.0.1:12002',
    EGRESS_IDENTITY: NEXT_POINT
  })
  assert.equal(config.tls.identity, 'spiffe://complyroute/service/svc-01')
  assert.equal(config.tls.cert, own.certPem)
  assert.equal(config.tls.key, own.keyPem)
  assert.equal(config.tls.ca, own.caPem)
  assert.equal(config.tls.certFile, own.cert)
  assert.ok(Object.isFrozen(config.tls))
  assert.ok(!JSON.stringify(config).includes('PRIVATE KEY'), 'the key is not in the configuration\'s JSON')
  assert.deepEqual(config.recordPeers, [POINT, 'spiffe://complyroute/service/svc-00'])
  assert.deepEqual(config.controlPeers, [CONTROL])
  assert.equal(config.egressIdentity, NEXT_POINT)
  assert.equal(config.egressUrl, 'https://127.0.0.1:12002')
  // A last step: no egress identity; CONTROL_PEERS is optional.
  const last = parseConfig(env)
  assert.deepEqual(last.controlPeers, [])
  assert.equal(last.egressIdentity, null)
})

test('mutual TLS refused twins: a TLS variable missing, no RECORD_PEERS, no EGRESS_IDENTITY or an http EGRESS_URL for a middle step', { skip: NO_OPENSSL }, (t) => {
  const { env } = mtlsEnv(t)
  refused({ ...env, TLS_KEY: undefined }, 'TLS_KEY', /is required when TLS_CERT and TLS_CA are set/)
  refused({ ...env, TLS_CERT: ' ', TLS_KEY: '' }, 'TLS_CERT', /is required when TLS_CA is set/)
  refused({ ...BASE, TLS_CA: env.TLS_CA }, 'TLS_CERT')
  refused({ ...env, RECORD_PEERS: undefined }, 'RECORD_PEERS', /is required with mutual TLS/)
  assert.deepEqual(parseConfig({ ...env, RECORD_PEERS: '' }).recordPeers, []) // set and empty: admits no record
  const middle = { ...env, NEXT_STEP: 'store', EGRESS_URL: 'https://127.0.0.1:12002' }
  refused(middle, 'EGRESS_IDENTITY', /is required with mutual TLS when NEXT_STEP is set/)
  refused({ ...middle, EGRESS_IDENTITY: NEXT_POINT, EGRESS_URL: 'http://127.0.0.1:12002' }, 'EGRESS_URL', /must be https/)
  refused({ ...env, EGRESS_IDENTITY: NEXT_POINT }, 'EGRESS_IDENTITY', /NEXT_STEP is empty/)
})

test('without mutual TLS, peers and an egress identity are refused rather than ignored', () => {
  refused({ ...BASE, RECORD_PEERS: POINT }, 'RECORD_PEERS', /mutual TLS is off/)
  refused({ ...BASE, CONTROL_PEERS: CONTROL }, 'CONTROL_PEERS', /mutual TLS is off/)
  refused({ ...BASE, NEXT_STEP: 'store', EGRESS_URL: 'http://127.0.0.1:1', EGRESS_IDENTITY: NEXT_POINT }, 'EGRESS_IDENTITY', /mutual TLS is off/)
})

test('SPIFFE ids: the valid forms are taken, anything else is refused by name', { skip: NO_OPENSSL }, (t) => {
  const { env } = mtlsEnv(t)
  const longest = `spiffe://complyroute/${'a'.repeat(255 - 'spiffe://complyroute/'.length)}`
  assert.equal(longest.length, 255)
  const valid = [CONTROL, 'spiffe://complyroute/service/svc-01', 'spiffe://example.org/ns/a_b/sa:x-1', longest]
  assert.deepEqual(parseConfig({ ...env, RECORD_PEERS: valid.join(',') }).recordPeers, valid)
  const invalid = [
    'https://complyroute/control', // another scheme
    'spiffe://complyroute', // no path
    'spiffe://complyroute/', // an empty segment
    'spiffe://complyroute/a//b',
    'spiffe://Complyroute/control', // the trust domain is lower case
    'spiffe://complyroute/a b',
    'spiffe://complyroute/a?b',
    'spiffe://user@complyroute/a',
    `${longest}a` // 256 characters
  ]
  for (const id of invalid) {
    refused({ ...env, RECORD_PEERS: id }, 'RECORD_PEERS', /expected a SPIFFE id/)
    refused({ ...env, CONTROL_PEERS: `${CONTROL},${id}` }, 'CONTROL_PEERS', /invalid item/)
    refused({ ...env, NEXT_STEP: 'store', EGRESS_URL: 'https://127.0.0.1:1', EGRESS_IDENTITY: id }, 'EGRESS_IDENTITY', /expected a SPIFFE id/)
  }
  refused({ ...env, RECORD_PEERS: `${POINT},,${CONTROL}` }, 'RECORD_PEERS', /invalid item ""/)
})

test('TLS files refused twins: unreadable, not PEM, a certificate without one SPIFFE URI SAN, a wrong key, a wrong CA', { skip: NO_OPENSSL }, (t) => {
  const { pki, own, env } = mtlsEnv(t)
  const missing = join(pki.dir, 'missing.pem')
  refused({ ...env, TLS_CERT: missing }, 'TLS_CERT', /cannot read .*ENOENT/)
  refused({ ...env, TLS_KEY: missing }, 'TLS_KEY', /cannot read .*ENOENT/)
  refused({ ...env, TLS_CA: missing }, 'TLS_CA', /cannot read .*ENOENT/)
  refused({ ...env, TLS_CERT: own.key }, 'TLS_CERT', /is not a PEM certificate/)
  refused({ ...env, TLS_KEY: own.cert }, 'TLS_KEY', /is not a PEM private key/)
  refused({ ...env, TLS_CA: own.key }, 'TLS_CA', /holds no PEM certificate/)

  const dns = pki.issue('dns', null, { san: 'DNS:svc-01.test' })
  refused({ ...env, ...tlsEnv(dns) }, 'TLS_CERT', /exactly one URI SAN/)
  const two = pki.issue('two', null, { san: 'URI:spiffe://complyroute/service/a, URI:spiffe://complyroute/service/b' })
  refused({ ...env, ...tlsEnv(two) }, 'TLS_CERT', /exactly one URI SAN/)
  const notSpiffe = pki.issue('https', 'https://complyroute/service/svc-01')
  refused({ ...env, ...tlsEnv(notSpiffe) }, 'TLS_CERT', /exactly one URI SAN/)

  const other = pki.issue('other', 'spiffe://complyroute/service/svc-02')
  refused({ ...env, TLS_KEY: other.key }, 'TLS_KEY', /is not the key of the certificate in TLS_CERT/)
  const p384 = pki.issue('p384', 'spiffe://complyroute/service/svc-03', { keyArgs: ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-384', '-nodes'] })
  refused({ ...env, ...tlsEnv(p384) }, 'TLS_KEY', /must be an EC P-256 key/)

  refused({ ...env, TLS_CA: own.cert }, 'TLS_CA', /not a CA's/)
  const stranger = testPki(t, 'stranger-ca')
  refused({ ...env, TLS_CA: stranger.ca }, 'TLS_CERT', /was not issued by the CA in TLS_CA/)
  // A CA bundle: the certificate's CA among others is found.
  const bundle = join(pki.dir, 'bundle.pem')
  writeFileSync(bundle, readFileSync(stranger.ca, 'utf8') + own.caPem)
  assert.equal(parseConfig({ ...env, TLS_CA: bundle }).tls.identity, 'spiffe://complyroute/service/svc-01')
})

test('LABEL_TOKENS: 1 turns label-token mode on, 0 or unset leaves it off, anything else is refused', () => {
  assert.equal(parseConfig({ ...BASE, LABEL_TOKENS: '1' }).labelTokens, true)
  assert.equal(parseConfig({ ...BASE, LABEL_TOKENS: '0' }).labelTokens, false)
  assert.equal(parseConfig({ ...BASE, LABEL_TOKENS: '' }).labelTokens, false)
  for (const value of ['yes', 'true', '2', 'on']) refused({ ...BASE, LABEL_TOKENS: value }, 'LABEL_TOKENS', /expected 1 \(on\) or 0 \(off\)/)
})

// ---------------------------------------------------------------- the label schema

const labels = (items) => ({ ...BASE, COMPLYROUTE_LABELS: JSON.stringify(items) })
const CATEGORY = SHIPPED_LABELS[0]

test('COMPLYROUTE_LABELS: the labels in the order given, frozen; any label names and x- headers', () => {
  const config = parseConfig(BASE)
  assert.deepEqual(config.labels.map((label) => label.name), ['category', 'consent', 'region'])
  assert.deepEqual(config.labels[1], { name: 'consent', header: 'x-data-consent', required: false })
  assert.ok(Object.isFrozen(config.labels) && config.labels.every(Object.isFrozen))
  const four = [{ name: 'z9_', header: `x-${'a'.repeat(63)}`, required: false }, ...SHIPPED_LABELS, { name: `a${'b'.repeat(31)}`, header: 'x-0', required: true }]
  assert.deepEqual(parseConfig({ ...labels(four), COMPLYROUTE_LABELS: ` ${JSON.stringify(four, null, 2)} ` }).labels, four)
})

test('COMPLYROUTE_LABELS refused twins: missing, not JSON, not a non-empty array of {name, header, required}', () => {
  const name = 'COMPLYROUTE_LABELS'
  refused({ ...BASE, [name]: undefined }, name, /is required: expected a JSON array/)
  refused({ ...BASE, [name]: '' }, name, /is required/)
  refused({ ...BASE, [name]: 'category,consent,region' }, name, /is not JSON/)
  refused({ ...BASE, [name]: '[{"name":"category"' }, name, /is not JSON/)
  refused({ ...BASE, [name]: '{"category":{"header":"x-data-category"}}' }, name, /expected a JSON array of at least one label/)
  refused({ ...BASE, [name]: '[]' }, name, /at least one label/)
  refused({ ...BASE, [name]: 'null' }, name, /expected a JSON array/)
  for (const item of [null, 'category', ['category', 'x-data-category', true]]) {
    refused(labels([item]), name, /label 0 is .*: expected an object with exactly the fields "name", "header" and "required"/)
  }
  refused(labels([CATEGORY, { name: 'region', header: 'x-data-region' }]), name, /label 1 is .*exactly the fields/)
  refused(labels([{ ...CATEGORY, values: 'categories' }]), name, /exactly the fields/)
  refused({ ...BASE, [name]: '[{"name":"category","header":"x-data-category","required":true,"__proto__":{}}]' }, name, /exactly the fields/)
})

test('COMPLYROUTE_LABELS refused twins: an invalid name, header or required, a name or header twice', () => {
  const name = 'COMPLYROUTE_LABELS'
  for (const bad of ['', 'Category', '1st', '_x', 'a-b', 'a b', `a${'b'.repeat(32)}`, 7]) {
    refused(labels([{ ...CATEGORY, name: bad }]), name, /label 0: invalid name/)
  }
  for (const bad of ['', 'X-Data-Category', 'data-category', 'x-', 'x--a', 'x-data_category', `x-${'a'.repeat(64)}`,
    'x-complyroute-labels', 'x-complyroute-step', 'x-request-id', null]) {
    refused(labels([{ ...CATEGORY, header: bad }]), name, /label category: invalid header .*not x-complyroute-\* nor x-request-id/)
  }
  for (const bad of ['true', 1, null]) refused(labels([{ ...CATEGORY, required: bad }]), name, /label category: invalid required .*expected true or false/)
  refused(labels([CATEGORY, { ...CATEGORY, header: 'x-category' }]), name, /label category is declared twice \(labels 0 and 1\)/)
  refused(labels([CATEGORY, { ...CATEGORY, name: 'kind' }]), name, /label kind: header x-data-category is label category's header too/)
})

test('COMPLYROUTE_LABELS_FILE: the labels from the file it names, with the digest of its text; read again by readLabelSetting', (t) => {
  const folder = mkdtempSync(join(tmpdir(), 'labels-'))
  t.after(() => rmSync(folder, { recursive: true, force: true }))
  const file = join(folder, 'labels.json')
  const text = JSON.stringify(SHIPPED_LABELS)
  writeFileSync(file, text)
  const env = { ...BASE, COMPLYROUTE_LABELS: undefined, COMPLYROUTE_LABELS_FILE: file }
  const config = parseConfig(env)
  assert.deepEqual(config.labels, SHIPPED_LABELS)
  assert.equal(config.labelDigest, `sha256:${createHash('sha256').update(text).digest('hex')}`)
  const added = JSON.stringify([...SHIPPED_LABELS, { name: 'sensitivity', header: 'x-data-sensitivity', required: false }])
  writeFileSync(file, added)
  assert.deepEqual(readLabelSetting(env).labels.map((label) => label.name), ['category', 'consent', 'region', 'sensitivity'])
  assert.equal(readLabelSetting(env).digest, `sha256:${createHash('sha256').update(added).digest('hex')}`)
})

test('COMPLYROUTE_LABELS_FILE refused twins: set with COMPLYROUTE_LABELS, unreadable, empty or not a label setting, naming the file', (t) => {
  const folder = mkdtempSync(join(tmpdir(), 'labels-'))
  t.after(() => rmSync(folder, { recursive: true, force: true }))
  const file = join(folder, 'labels.json')
  const name = 'COMPLYROUTE_LABELS_FILE'
  writeFileSync(file, JSON.stringify(SHIPPED_LABELS))
  refused({ ...BASE, [name]: file }, name, /is set and so is COMPLYROUTE_LABELS: set one of them/)
  const env = { ...BASE, COMPLYROUTE_LABELS: undefined, [name]: file }
  refused({ ...env, [name]: join(folder, 'missing.json') }, name, /cannot read ".*missing\.json": ENOENT/)
  for (const [text, pattern] of [['', /labels\.json": is required/], ['[', /labels\.json": is not JSON/], ['[]', /at least one label/],
    [JSON.stringify([{ ...CATEGORY, header: 'x-request-id' }]), /labels\.json": label category: invalid header/]]) {
    writeFileSync(file, text)
    refused(env, name, pattern)
  }
})
