// The floor of a service hop, started by the benchmark harness (`make bench`): the least a
// Fastify process does to receive a record, send it on with the client the service uses (an
// undici keep-alive Pool) and relay the answer. No schema, no audit, no work, no logger, so
// a service hop's CPU beyond its configured work can be compared with this one's.
//
// Configured like a service instance: HOST, PORT, and EGRESS_URL (an origin). With
// EGRESS_URL: POST the body, the label headers and x-request-id to `${EGRESS_URL}/process`
// and relay the answer; the label headers are those of COMPLYROUTE_LABELS, as a service is
// told them (config.js parseLabels; required with EGRESS_URL, read once at start). Without, it stands for the rest of a chain:
// it answers as a last service would, {request_id, path}, with ANSWER_PATH_LENGTH entries
// (default 1) written once at start as services write them (last-service.js), so a service measured in front of it pays for the
// answer of a chain of that length and this process costs next to nothing.
//
// Mutual TLS, for the bench's rows with mTLS: with TLS_CERT, TLS_KEY and TLS_CA (PEM files)
// it listens on HTTPS (TLS 1.3 only, as the enforcement points) and takes a connection only
// from a client presenting a certificate of that CA; with an https EGRESS_URL it presents
// its certificate there and takes only a next hop whose certificate, of the same CA, names
// EGRESS_IDENTITY (its URI SAN). Who a peer is is checked once per connection, as the
// services do; nothing per request.

import { readFileSync } from 'node:fs'
import Fastify from 'fastify'
import { Pool } from 'undici'
import { parseLabels } from '../config.js'
import { deliveredAnswer } from '../src/answers.js'
import { lastServicesEntries } from './last-service.js'

const {
  HOST = '127.0.0.1', PORT = '3000', EGRESS_URL = '', ANSWER_PATH_LENGTH = '1',
  TLS_CERT = '', TLS_KEY = '', TLS_CA = '', EGRESS_IDENTITY = ''
} = process.env
const tls = TLS_CERT && { cert: readFileSync(TLS_CERT), key: readFileSync(TLS_KEY), ca: readFileSync(TLS_CA), minVersion: 'TLSv1.3', maxVersion: 'TLSv1.3' }
const app = Fastify(tls ? { https: { ...tls, requestCert: true, rejectUnauthorized: true } } : {})

if (EGRESS_URL) {
  const connect = EGRESS_URL.startsWith('https:')
    ? {
        ...tls,
        rejectUnauthorized: true,
        checkServerIdentity: (host, cert) => cert.subjectaltname === `URI:${EGRESS_IDENTITY}`
          ? undefined
          : new Error(`the next hop presents ${cert.subjectaltname}, not URI:${EGRESS_IDENTITY}`)
      }
    : undefined
  const forwarded = [...parseLabels(process.env).map((label) => label.header), 'x-request-id']
  const pool = new Pool(EGRESS_URL, { connections: 64, connect })
  app.addHook('onClose', () => pool.close())
  app.post('/process', async (request, reply) => {
    const headers = { 'content-type': 'application/json' }
    for (const name of forwarded) {
      const value = request.headers[name]
      if (value !== undefined) headers[name] = value
    }
    const answer = await pool.request({ path: '/process', method: 'POST', headers, body: JSON.stringify(request.body) })
    reply.code(answer.statusCode).type('application/json')
    return answer.body.text()
  })
} else {
  const entries = lastServicesEntries(Number(ANSWER_PATH_LENGTH), Date.now())
  app.post('/process', async (request, reply) => {
    reply.type('application/json')
    return deliveredAnswer(request.headers['x-request-id'] ?? 'bench', entries)
  })
}

await app.listen({ host: HOST, port: Number(PORT) })
for (const signal of ['SIGTERM', 'SIGINT']) process.once(signal, () => app.close().then(() => process.exit(0)))
