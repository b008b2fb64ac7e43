// The floor of a service hop, started by the benchmark harness (`make bench`): the least a
// Fastify process does to receive a record, send it on with the client the service uses (an
// undici keep-alive Pool) and relay the answer. No schema, no audit, no work, no logger, so
// a service hop's CPU beyond its configured work can be compared with this one's.
//
// Configured like a service instance: HOST, PORT, and EGRESS_URL (an origin). With
// EGRESS_URL: POST the body and the x-data-* and x-request-id headers to
// `${EGRESS_URL}/process` and relay the answer. Without, it stands for the rest of a chain:
// it answers as a last service would, {request_id, path}, with ANSWER_PATH_LENGTH entries
// (default 1) written once at start, so a service measured in front of it pays for the
// answer of a chain of that length and this process costs next to nothing.

import Fastify from 'fastify'
import { Pool } from 'undici'

const { HOST = '127.0.0.1', PORT = '3000', EGRESS_URL = '', ANSWER_PATH_LENGTH = '1' } = process.env
const app = Fastify()

if (EGRESS_URL) {
  const pool = new Pool(EGRESS_URL, { connections: 64 })
  app.addHook('onClose', () => pool.close())
  app.post('/process', async (request, reply) => {
    const headers = { 'content-type': 'application/json' }
    for (const [name, value] of Object.entries(request.headers)) {
      if (name.startsWith('x-data-') || name === 'x-request-id') headers[name] = value
    }
    const answer = await pool.request({ path: '/process', method: 'POST', headers, body: JSON.stringify(request.body) })
    reply.code(answer.statusCode).type('application/json')
    return answer.body.text()
  })
} else {
  const t = Date.now()
  const entries = Array.from({ length: Number(ANSWER_PATH_LENGTH) }, (_, i) => {
    const n = String(i + 2).padStart(2, '0')
    return `{"instance":"svc-${n}","step":"step-${n}","region":"EU","node":"node-${(i % 3) + 1}","t_in":${t + i},"t_out":${t + i + 0.5}}`
  }).join(',')
  app.post('/process', async (request, reply) => {
    reply.type('application/json')
    return `{"request_id":${JSON.stringify(request.headers['x-request-id'] ?? 'bench')},"path":[${entries}]}`
  })
}

await app.listen({ host: HOST, port: Number(PORT) })
for (const signal of ['SIGTERM', 'SIGINT']) process.once(signal, () => app.close().then(() => process.exit(0)))
