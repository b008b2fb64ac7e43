// What a request may be and what every answer is: the JSON schemas of the routes (requests and
// answers, errors included), the largest body and the form of a request id. The labels are not
// here: a route's schema is compiled once, and the labels can change (src/labels.js).

// The largest record: the enforcement points' limit too (complyroute/proxy/contract.py
// MAX_RECORD_BYTES), so a record one part takes, every part takes.
export const BODY_LIMIT = 64 * 1024

// A client's x-request-id is kept when it is 1 to 200 visible ASCII characters other than
// ','; an absent or empty one is replaced by a UUID; anything else is refused (400). The
// comma is refused because it is what a repeated header is joined with (Envoy joins with
// ',', Node with ', '): an id sent twice must be refused, not taken as an id nobody sent.
const REQUEST_ID_PATTERN = '^([\\x21-\\x2b\\x2d-\\x7e]{1,200})?$'
const REQUEST_ID = /^[\x21-\x2b\x2d-\x7e]{1,200}$/

export function isValidRequestId (value) {
  return typeof value === 'string' && REQUEST_ID.test(value)
}

const reasonSchema = {
  type: 'object',
  additionalProperties: true,
  properties: {
    code: { type: 'string' },
    message: { type: 'string' },
    instance: { type: 'string' }
  }
}

// Every error answer, our own and the ones relayed from downstream (which may
// carry more properties: they are kept).
export const errorSchema = {
  $id: 'complyroute-error',
  type: 'object',
  required: ['code', 'message'],
  additionalProperties: true,
  properties: {
    code: { type: 'string' },
    message: { type: 'string' },
    request_id: { type: 'string' },
    reasons: { type: 'array', items: reasonSchema }
  }
}

const errorRef = { $ref: 'complyroute-error#' }
const errorResponses = { '4xx': errorRef, '5xx': errorRef }

const pathEntrySchema = {
  type: 'object',
  required: ['instance', 'step', 'region', 'node', 't_in', 't_out'],
  additionalProperties: false,
  properties: {
    instance: { type: 'string' },
    step: { type: 'string' },
    region: { type: 'string' },
    node: { type: 'string' },
    t_in: { type: 'number' },
    t_out: { type: 'number' },
    t_back: { type: 'number' }
  }
}

const processResponseSchema = {
  200: {
    type: 'object',
    required: ['request_id', 'path'],
    additionalProperties: false,
    properties: {
      request_id: { type: 'string' },
      path: { type: 'array', minItems: 1, items: pathEntrySchema }
    }
  },
  ...errorResponses
}

// A record's labels are checked against the labels in effect when it arrived (checkLabels in
// src/routes.js), not by this schema: a route's schema is compiled once, and the labels can change.
export function processSchema () {
  return {
    headers: { type: 'object', properties: { 'x-request-id': { type: 'string', pattern: REQUEST_ID_PATTERN } } },
    body: { type: 'object' },
    response: processResponseSchema
  }
}

const noQuery = { type: 'object', additionalProperties: false, properties: {} }

export const healthSchema = {
  querystring: noQuery,
  response: {
    200: {
      type: 'object',
      required: ['status', 'instance', 'step', 'labels'],
      additionalProperties: false,
      properties: {
        status: { type: 'string', enum: ['ok'] },
        instance: { type: 'string' },
        step: { type: 'string' },
        // The digest of the label setting in effect (config.js readLabelSetting): the control
        // plane waits for the one it wrote before it applies rules reading a new label.
        labels: { type: 'string' }
      }
    },
    ...errorResponses
  }
}

export const STAT_NAMES = Object.freeze([
  'received', 'answered', 'forwarded', 'downstream_denied', 'downstream_failed', 'rejected', 'internal_errors'
])

// Prometheus's text: a string, whatever the registry writes; no query string.
export const metricsSchema = {
  querystring: noQuery,
  response: { 200: { type: 'string' }, ...errorResponses }
}

export const statsSchema = {
  querystring: noQuery,
  response: {
    200: {
      type: 'object',
      required: [...STAT_NAMES],
      additionalProperties: false,
      properties: Object.fromEntries(STAT_NAMES.map((name) => [name, { type: 'integer', minimum: 0 }]))
    },
    ...errorResponses
  }
}
