// The record ids remembered in label-token mode (src/recent-ids.js).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { RecentIds } from '../src/recent-ids.js'

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
