import { test } from 'node:test'
import assert from 'node:assert/strict'
import { ConfigError, DEFAULTS, parseConfig } from '../config.js'

const BASE = Object.freeze({ INSTANCE_ID: 'analyse-eu', STEP: 'analyse', REGION: 'EU', NODE: 'node-2' })

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
  assert.equal(config.workIterations, 200)
  assert.equal(config.egressTimeoutMs, 30000)
  assert.equal(config.logLevel, 'warn')
  assert.ok(Object.isFrozen(config))
})

test('each required variable missing or blank is refused by name', () => {
  for (const name of ['INSTANCE_ID', 'STEP', 'REGION', 'NODE']) {
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
