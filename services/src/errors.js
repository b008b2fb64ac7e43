// The error contract: every refusal of this instance is answered as JSON {code, message,
// request_id}, the 400s with reasons [{code, message}] (the shape the contract gives bad
// input), whatever raised it: a handler (AppError), Fastify's validation or body parsing,
// or malformed HTTP before any route (clientErrorHandler).

import { createRequire } from 'node:module'
import { BODY_LIMIT } from './schemas.js'

// Required, not imported: an ES import of node:http builds its module namespace from every
// export, and reading the lazy ones (WebSocket, ...) loads Node's bundled undici, a tenth of
// an instance's start-up CPU (measured with --cpu-prof); Fastify requires node:http itself.
const { STATUS_CODES } = createRequire(import.meta.url)('node:http')

/** A refusal raised by this instance's own checks: its status, code, message and reasons. */
export class AppError extends Error {
  constructor (statusCode, code, message, reasons) {
    super(message)
    this.statusCode = statusCode
    this.code = code
    this.reasons = reasons
  }
}

const CODE_BY_STATUS = {
  400: 'BAD_REQUEST',
  404: 'NOT_FOUND',
  405: 'METHOD_NOT_ALLOWED',
  408: 'REQUEST_TIMEOUT',
  413: 'BODY_TOO_LARGE',
  414: 'URI_TOO_LONG',
  415: 'CONTENT_TYPE_UNSUPPORTED',
  431: 'HEADERS_TOO_LARGE'
}

/** Map any error Fastify or a handler raises to {status, code, message, reasons?}. */
function classifyError (err) {
  if (err instanceof AppError) return { status: err.statusCode, code: err.code, message: err.message, reasons: err.reasons }
  if (err.validation) {
    // The only header the route's schema checks (the labels are checked apart, missingLabelError).
    if (err.validationContext === 'headers') {
      return { status: 400, code: 'REQUEST_ID_INVALID', message: 'x-request-id must be sent once, as 1 to 200 visible ASCII characters other than \',\'' }
    }
    if (err.validationContext === 'body') {
      return { status: 400, code: 'BODY_INVALID', message: 'body must be a JSON object' }
    }
    return { status: 400, code: 'BAD_REQUEST', message: `invalid ${err.validationContext}: ${err.message}` }
  }
  switch (err.code) {
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return { status: 400, code: 'BODY_INVALID', message: 'body is empty: expected a JSON object' }
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return { status: 400, code: 'BODY_INVALID', message: 'body is not valid JSON' }
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return { status: 413, code: 'BODY_TOO_LARGE', message: `body is larger than ${BODY_LIMIT} bytes` }
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return { status: 415, code: 'CONTENT_TYPE_UNSUPPORTED', message: 'content-type must be application/json' }
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return { status: 400, code: 'BAD_REQUEST', message: 'content-length does not match the body' }
  }
  const status = err.statusCode
  if (Number.isInteger(status) && status >= 400 && status < 500) {
    return { status, code: CODE_BY_STATUS[status] ?? 'BAD_REQUEST', message: err.message || STATUS_CODES[status] }
  }
  return { status: 500, code: 'INTERNAL_ERROR', message: 'internal error' }
}

function errorBody (classified, requestId) {
  const body = { code: classified.code, message: classified.message }
  if (requestId) body.request_id = requestId
  if (classified.status === 400) {
    body.reasons = classified.reasons ?? [{ code: classified.code, message: classified.message }]
  }
  return body
}

/** The answer to an error a route raised (the body of Fastify's error handler). */
export function answerError (err, request, reply) {
  const classified = classifyError(err)
  // An AppError was logged where it was raised, with its cause.
  if (classified.status >= 500 && !(err instanceof AppError)) request.log.error({ err }, 'request failed')
  else request.log.debug({ err, code: classified.code }, 'request refused')
  reply.code(classified.status).send(errorBody(classified, request.id))
}

/**
 * Fastify's clientErrorHandler (malformed HTTP, before any route): answers in
 * the same {code, message} shape. `this` is the Fastify instance.
 */
export function clientErrorHandler (err, socket) {
  if (err.code === 'ECONNRESET' || socket.destroyed) return
  let status = 400
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') status = 408
  else if (err.code === 'HPE_HEADER_OVERFLOW') status = 431
  const body = JSON.stringify({ code: CODE_BY_STATUS[status], message: status === 400 ? 'malformed HTTP request' : STATUS_CODES[status] })
  this?.log?.trace({ err }, 'client error')
  if (socket.writable) {
    socket.write(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`)
  }
  socket.destroy(err)
}
